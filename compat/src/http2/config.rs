//! How the HTTP/2 transport is tuned: flow-control windows, frame size, stream limits and the
//! deadlines hyper does not have of its own.

use std::time::Duration;

use tensorwire_proto::transport::Error;

use crate::http2::tls::TlsConfig;

/// Settings of the HTTP/2 transport (server and client alike).
///
/// The defaults follow measurements on loopback (`docs/benchmarks.md`): the frame size is
/// the lever (h2 writes one DATA frame per write call, so 16 KiB frames cost about twice the
/// CPU of 1 MiB ones); windows beyond a few MiB change nothing on a LAN but bound what a peer
/// may park unread, so they stay at 16 MiB per stream and 32 MiB per connection, enough for
/// 25 Gb/s at 5 ms.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Http2Config {
    /// TLS for the server and the client; `None` serves and sends clear-text HTTP/2 (h2c).
    pub tls: Option<TlsConfig>,
    /// Serve TLS only: h2c is refused (and the node refuses plaintext PTR1).
    pub require_tls: bool,
    /// Bytes a peer may send on one stream before our WINDOW_UPDATE (default 16 MiB).
    pub stream_window: u32,
    /// Bytes a peer may send on one connection before our WINDOW_UPDATE (default 32 MiB).
    pub connection_window: u32,
    /// Size the windows by measuring the bandwidth-delay product (hyper's BDP pings) instead
    /// of the fixed windows above (default off: fixed windows bound what a peer may park).
    pub adaptive_window: bool,
    /// The largest DATA frame we accept (default 1 MiB; HTTP/2 allows 16 KiB to 16 MiB − 1).
    pub max_frame_size: u32,
    /// Concurrent streams a client may open on one connection (default 64).
    pub max_concurrent_streams: u32,
    /// The largest header block we accept (default 16 KiB; larger gets 431).
    pub max_header_list_size: u32,
    /// Ping an idle connection this often (default 10 s) ...
    pub keep_alive_interval: Duration,
    /// ... and close it if the ping is not answered within this (default 10 s).
    pub keep_alive_timeout: Duration,
    /// A standalone listener's connection must send its first bytes within this (default 5 s).
    pub preface_timeout: Duration,
    /// A TLS handshake must complete within this (default 5 s).
    pub handshake_timeout: Duration,
    /// A new connection must send its first request within this (default 10 s); hyper has
    /// no such deadline.
    pub first_request_timeout: Duration,
}

impl Default for Http2Config {
    fn default() -> Self {
        Self {
            tls: None,
            require_tls: false,
            stream_window: 16 << 20,
            connection_window: 32 << 20,
            adaptive_window: false,
            max_frame_size: 1 << 20,
            max_concurrent_streams: 64,
            max_header_list_size: 16 << 10,
            keep_alive_interval: Duration::from_secs(10),
            keep_alive_timeout: Duration::from_secs(10),
            preface_timeout: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(5),
            first_request_timeout: Duration::from_secs(10),
        }
    }
}

impl Http2Config {
    /// Clear-text HTTP/2 with the defaults.
    pub fn h2c() -> Self {
        Self::default()
    }

    /// TLS with the defaults; `require_tls` refuses clear-text connections.
    pub fn tls(tls: TlsConfig, require_tls: bool) -> Self {
        Self {
            tls: Some(tls),
            require_tls,
            ..Self::default()
        }
    }

    /// The defaults, with TLS from the environment if `TENSORWIRE_TLS_CERT` is set (see
    /// [`TlsConfig::from_env`]; then TLS is required unless `TENSORWIRE_TLS_REQUIRE=0`), and
    /// the tuning from `TENSORWIRE_HTTP2_MAX_FRAME_SIZE`, `TENSORWIRE_HTTP2_STREAM_WINDOW` and
    /// `TENSORWIRE_HTTP2_CONNECTION_WINDOW` (bytes) if set.
    ///
    /// # Errors
    ///
    /// As [`TlsConfig::from_env`]; [`Error::Misuse`] for a tuning value that is not a number
    /// in range.
    pub fn from_env() -> Result<Self, Error> {
        let mut config = match TlsConfig::from_env()? {
            Some(tls) => {
                let require =
                    std::env::var("TENSORWIRE_TLS_REQUIRE").map_or(true, |v| v.trim() != "0");
                Self::tls(tls, require)
            }
            None => Self::default(),
        };
        config.tune_from_env()?;
        Ok(config)
    }

    /// Applies the `TENSORWIRE_HTTP2_*` tuning variables that are set.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] naming the variable whose value is not a number in range.
    pub fn tune_from_env(&mut self) -> Result<(), Error> {
        if let Some(size) = variable("TENSORWIRE_HTTP2_MAX_FRAME_SIZE", 16 << 10, (16 << 20) - 1)? {
            self.max_frame_size = size;
        }
        if let Some(window) = variable("TENSORWIRE_HTTP2_STREAM_WINDOW", 64 << 10, (1 << 31) - 1)? {
            self.stream_window = window;
        }
        if let Some(window) = variable(
            "TENSORWIRE_HTTP2_CONNECTION_WINDOW",
            64 << 10,
            (1 << 31) - 1,
        )? {
            self.connection_window = window;
        }
        Ok(())
    }
}

/// A `u32` variable within `min..=max`, if set.
fn variable(name: &str, min: u32, max: u32) -> Result<Option<u32>, Error> {
    let Ok(text) = std::env::var(name) else {
        return Ok(None);
    };
    match text.trim().parse::<u32>() {
        Ok(value) if (min..=max).contains(&value) => Ok(Some(value)),
        _ => Err(Error::Misuse(format!(
            "{name}={text:?}: expected a number of bytes from {min} to {max}"
        ))),
    }
}
