//! One PTR1 conformance suite, run against every driver and across them: each case is written
//! once, for a pair of drivers (`Drivers`), and instantiated for io_uring ↔ io_uring, tokio ↔
//! tokio, io_uring client → tokio server and tokio client → io_uring server. Cases that only
//! involve a server (a raw peer plays the client) run once per server driver.

mod deadline;
mod failure;
mod pipelined;
mod pool;
mod raw;
mod round_trip;
mod shutdown;
mod stripes;

/// Instantiates `pairs` for every driver combination and `servers` for every server driver.
macro_rules! conformance {
    (pairs: [$($pair:ident),* $(,)?], servers: [$($server:ident),* $(,)?] $(,)?) => {
        conformance!(@mod uring, Uring, Uring, [$($pair),*], [$($server),*]);
        conformance!(@mod tokio, Tokio, Tokio, [$($pair),*], [$($server),*]);
        conformance!(@mod uring_to_tokio, Uring, Tokio, [$($pair),*], []);
        conformance!(@mod tokio_to_uring, Tokio, Uring, [$($pair),*], []);
    };
    (@mod $name:ident, $client:ident, $server:ident, [$($pair:ident),*], [$($only:ident),*]) => {
        mod $name {
            #[allow(unused_imports)]
            use tensorwire_tests::{Driver, Drivers, serial};
            #[allow(dead_code)]
            const DRIVERS: Drivers = Drivers { client: Driver::$client, server: Driver::$server };
            $(
                #[test]
                fn $pair() {
                    let _serial = serial();
                    super::$pair(DRIVERS);
                }
            )*
            $(
                #[test]
                fn $only() {
                    let _serial = serial();
                    super::$only(DRIVERS);
                }
            )*
        }
    };
}

pub(crate) use conformance;
