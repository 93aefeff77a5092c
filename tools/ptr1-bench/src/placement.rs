//! Where the suite's fixtures and clients run: both on loopback in this namespace (default),
//! or, with `suite --netns`, on two hosts of a network test bed (`tensorwire-netbed`) joined
//! by a veth pair through a bridge — the fixtures (and iperf3's server) on host 0 at
//! `10.201.0.1`, this process and its clients on host 1 — optionally with a rate limit and
//! random loss on the client's link.

use std::net::IpAddr;
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Result, bail};
use tensorwire_netbed::Testbed;

/// The test bed, made once and kept for the life of the process (its namespaces go with it).
static BED: OnceLock<Bed> = OnceLock::new();

struct Bed {
    testbed: Testbed,
    rate: Option<String>,
    flow_rate: Option<String>,
    loss_percent: Option<f64>,
}

/// Makes the test bed, applies `rate` (the whole link), `flow_rate` (each connection the
/// client host opens, `Testbed::limit_rate_per_flow`) and `loss_percent` to the client host's
/// link, and moves the calling thread (the suite's main thread, before it starts anything)
/// into the client host.
pub(crate) fn across_hosts(
    rate: Option<&str>,
    flow_rate: Option<&str>,
    loss_percent: Option<f64>,
) -> Result<()> {
    if BED.get().is_some() {
        bail!("the test bed is already set up");
    }
    let per_100k = match loss_percent {
        Some(p) if !(0.0..=100.0).contains(&p) => bail!("--loss {p}% is not a percentage"),
        // Whole 1/1000 of a percent: what nftables' `numgen random mod 100000` can express.
        Some(p) => Some(format!("{:.0}", p * 1000.0).parse::<u32>()?),
        None => None,
    };
    // The test bed panics with the failing command's output; here that becomes an error.
    let testbed = std::panic::catch_unwind(|| {
        let testbed = Testbed::new(2);
        if let Some(rate) = rate {
            testbed.limit_rate(testbed.host(1), rate);
        }
        if let Some(rate) = flow_rate {
            testbed.limit_rate_per_flow(testbed.host(1), rate);
        }
        if let Some(per_100k) = per_100k {
            testbed.drop_per_100k(testbed.host(1), per_100k);
        }
        testbed
    })
    .map_err(|_| {
        anyhow::anyhow!(
            "cannot set up the network test bed (root, iproute2, util-linux and nftables are \
             needed, and --rate takes tc's syntax such as 1gbit; the message above says what \
             failed)"
        )
    })?;
    testbed.host(1).join_current_thread();
    let bed = Bed {
        testbed,
        rate: rate.map(str::to_owned),
        flow_rate: flow_rate.map(str::to_owned),
        loss_percent,
    };
    if BED.set(bed).is_err() {
        bail!("the test bed was set up twice");
    }
    Ok(())
}

/// Whether the suite runs across the test bed.
pub(crate) fn is_across() -> bool {
    BED.get().is_some()
}

/// The address fixtures listen on: `10.201.0.1` across the bed, loopback otherwise.
pub(crate) fn server_ip() -> IpAddr {
    match BED.get() {
        Some(bed) => bed.testbed.host(0).ip(),
        None => IpAddr::from([127, 0, 0, 1]),
    }
}

/// `program` as a child process on the fixtures' host.
pub(crate) fn server_command(program: &str) -> Command {
    match BED.get() {
        Some(bed) => bed.testbed.host(0).command(program),
        None => Command::new(program),
    }
}

/// The test bed's shape for `results.json`, or `null` on loopback.
pub(crate) fn describe() -> serde_json::Value {
    match BED.get() {
        Some(bed) => serde_json::json!({
            "hosts": "two network namespaces, veth through a bridge, MTU 1500",
            "server": bed.testbed.host(0).ip().to_string(),
            "client": bed.testbed.host(1).ip().to_string(),
            "rate": bed.rate,
            "flow_rate": bed.flow_rate,
            "loss_percent": bed.loss_percent,
        }),
        None => serde_json::Value::Null,
    }
}
