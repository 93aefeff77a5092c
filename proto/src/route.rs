//! Which path a send takes: one pure function of preference, locality, capabilities and TLS.
//!
//! | situation | route |
//! |---|---|
//! | target in this process | [`Route::LocalMailbox`], always |
//! | same host, preference `auto` or `shm`, shared memory available on both ends | [`Route::SharedMemory`] |
//! | TLS on (anything else that crosses a socket) | [`Route::Http2`] |
//! | preference `http2` | [`Route::Http2`] |
//! | preference `auto`, `raw` or `shm`, raw transport available | [`Route::RawTcp`] |
//! | otherwise | [`Route::Http2`] |
//!
//! Shared memory is allowed under TLS: its payload never crosses a network socket (only file
//! descriptors cross a local Unix socket), so TLS has nothing to protect there.

use std::ffi::OsStr;

use crate::error::ConfigError;

/// The user's transport preference, from `PULSING_TENSOR_TRANSPORT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Preference {
    /// Pick the fastest available path (variable unset, empty or `auto`).
    Auto,
    /// Raw TCP (`raw`, `tcp`, `direct_tcp`, `direct-tcp`).
    Raw,
    /// HTTP/2 even without TLS (`http2`, `legacy`, `off`).
    Http2,
    /// Shared memory where possible (`shm`, `shared_memory`, `shared-memory`); otherwise as
    /// `Auto`.
    SharedMemory,
}

impl Preference {
    /// The environment variable this preference comes from.
    pub const VARIABLE: &'static str = "PULSING_TENSOR_TRANSPORT";

    /// Reads `PULSING_TENSOR_TRANSPORT` from the process environment.
    ///
    /// # Errors
    ///
    /// See [`Preference::parse`].
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::parse(std::env::var_os(Self::VARIABLE).as_deref())
    }

    /// Parses a value of `PULSING_TENSOR_TRANSPORT` (`None` = unset). Case and surrounding
    /// ASCII whitespace are ignored; an empty value means unset.
    ///
    /// # Errors
    ///
    /// Any other value is a [`ConfigError`] naming the variable and the value (other
    /// implementations silently treat unknown values as `auto`; tensorwire does not guess).
    pub fn parse(value: Option<&OsStr>) -> Result<Self, ConfigError> {
        let Some(raw) = value else {
            return Ok(Self::Auto);
        };
        let error = || ConfigError {
            variable: Self::VARIABLE,
            value: raw.to_string_lossy().into_owned(),
            expected: "one of auto, raw, tcp, direct_tcp, direct-tcp, http2, legacy, off, shm, \
                       shared_memory, shared-memory",
        };
        let text = raw
            .to_str()
            .ok_or_else(error)?
            .trim_ascii()
            .to_ascii_lowercase();
        Ok(match text.as_str() {
            "" | "auto" => Self::Auto,
            "raw" | "tcp" | "direct_tcp" | "direct-tcp" => Self::Raw,
            "http2" | "legacy" | "off" => Self::Http2,
            "shm" | "shared_memory" | "shared-memory" => Self::SharedMemory,
            _ => return Err(error()),
        })
    }
}

/// Where the target endpoint lives relative to the sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Locality {
    /// In this process.
    SameProcess,
    /// Another process on this host.
    SameHost,
    /// Another host.
    Remote,
}

/// What the transport can do for this target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Capabilities {
    /// A raw PTR1 transport is available (io_uring engine or its tokio fallback).
    pub raw: bool,
    /// Shared memory works between the two ends.
    pub shared_memory: bool,
}

/// The chosen path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    /// Hand the message to the in-process mailbox; the receiver shares the sender's buffers.
    LocalMailbox,
    /// Same-host shared memory.
    SharedMemory,
    /// PTR1 frames over TCP.
    RawTcp,
    /// PTM1 bodies over HTTP/2 (TLS when enabled).
    Http2,
}

/// Selects the route for one send. See the [module docs](self) for the table.
pub fn select(preference: Preference, locality: Locality, caps: Capabilities, tls: bool) -> Route {
    use Preference::{Auto, Http2, Raw, SharedMemory};
    match (locality, preference) {
        (Locality::SameProcess, _) => Route::LocalMailbox,
        (Locality::SameHost, Auto | SharedMemory) if caps.shared_memory => Route::SharedMemory,
        _ if tls => Route::Http2,
        (_, Http2) => Route::Http2,
        (_, Auto | Raw | SharedMemory) if caps.raw => Route::RawTcp,
        _ => Route::Http2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_input_combination_selects_the_documented_route() {
        use Locality::{Remote, SameHost, SameProcess};
        use Preference::{Auto, Http2, Raw, SharedMemory as Shm};
        use Route::{Http2 as H2, LocalMailbox as Local, RawTcp as Tcp, SharedMemory as Mem};
        // (preference, locality, raw capable, shm capable, tls) -> route; all 96 combinations.
        #[rustfmt::skip]
        let table = [
            // Same process: always the mailbox.
            (Auto, SameProcess, false, false, false, Local), (Auto, SameProcess, false, false, true, Local),
            (Auto, SameProcess, false, true, false, Local),  (Auto, SameProcess, false, true, true, Local),
            (Auto, SameProcess, true, false, false, Local),  (Auto, SameProcess, true, false, true, Local),
            (Auto, SameProcess, true, true, false, Local),   (Auto, SameProcess, true, true, true, Local),
            (Raw, SameProcess, false, false, false, Local),  (Raw, SameProcess, false, false, true, Local),
            (Raw, SameProcess, false, true, false, Local),   (Raw, SameProcess, false, true, true, Local),
            (Raw, SameProcess, true, false, false, Local),   (Raw, SameProcess, true, false, true, Local),
            (Raw, SameProcess, true, true, false, Local),    (Raw, SameProcess, true, true, true, Local),
            (Http2, SameProcess, false, false, false, Local), (Http2, SameProcess, false, false, true, Local),
            (Http2, SameProcess, false, true, false, Local), (Http2, SameProcess, false, true, true, Local),
            (Http2, SameProcess, true, false, false, Local), (Http2, SameProcess, true, false, true, Local),
            (Http2, SameProcess, true, true, false, Local),  (Http2, SameProcess, true, true, true, Local),
            (Shm, SameProcess, false, false, false, Local),  (Shm, SameProcess, false, false, true, Local),
            (Shm, SameProcess, false, true, false, Local),   (Shm, SameProcess, false, true, true, Local),
            (Shm, SameProcess, true, false, false, Local),   (Shm, SameProcess, true, false, true, Local),
            (Shm, SameProcess, true, true, false, Local),    (Shm, SameProcess, true, true, true, Local),
            // Same host.
            (Auto, SameHost, false, false, false, H2),  (Auto, SameHost, false, false, true, H2),
            (Auto, SameHost, false, true, false, Mem),  (Auto, SameHost, false, true, true, Mem),
            (Auto, SameHost, true, false, false, Tcp),  (Auto, SameHost, true, false, true, H2),
            (Auto, SameHost, true, true, false, Mem),   (Auto, SameHost, true, true, true, Mem),
            (Raw, SameHost, false, false, false, H2),   (Raw, SameHost, false, false, true, H2),
            (Raw, SameHost, false, true, false, H2),    (Raw, SameHost, false, true, true, H2),
            (Raw, SameHost, true, false, false, Tcp),   (Raw, SameHost, true, false, true, H2),
            (Raw, SameHost, true, true, false, Tcp),    (Raw, SameHost, true, true, true, H2),
            (Http2, SameHost, false, false, false, H2), (Http2, SameHost, false, false, true, H2),
            (Http2, SameHost, false, true, false, H2),  (Http2, SameHost, false, true, true, H2),
            (Http2, SameHost, true, false, false, H2),  (Http2, SameHost, true, false, true, H2),
            (Http2, SameHost, true, true, false, H2),   (Http2, SameHost, true, true, true, H2),
            (Shm, SameHost, false, false, false, H2),   (Shm, SameHost, false, false, true, H2),
            (Shm, SameHost, false, true, false, Mem),   (Shm, SameHost, false, true, true, Mem),
            (Shm, SameHost, true, false, false, Tcp),   (Shm, SameHost, true, false, true, H2),
            (Shm, SameHost, true, true, false, Mem),    (Shm, SameHost, true, true, true, Mem),
            // Remote: never shared memory.
            (Auto, Remote, false, false, false, H2),  (Auto, Remote, false, false, true, H2),
            (Auto, Remote, false, true, false, H2),   (Auto, Remote, false, true, true, H2),
            (Auto, Remote, true, false, false, Tcp),  (Auto, Remote, true, false, true, H2),
            (Auto, Remote, true, true, false, Tcp),   (Auto, Remote, true, true, true, H2),
            (Raw, Remote, false, false, false, H2),   (Raw, Remote, false, false, true, H2),
            (Raw, Remote, false, true, false, H2),    (Raw, Remote, false, true, true, H2),
            (Raw, Remote, true, false, false, Tcp),   (Raw, Remote, true, false, true, H2),
            (Raw, Remote, true, true, false, Tcp),    (Raw, Remote, true, true, true, H2),
            (Http2, Remote, false, false, false, H2), (Http2, Remote, false, false, true, H2),
            (Http2, Remote, false, true, false, H2),  (Http2, Remote, false, true, true, H2),
            (Http2, Remote, true, false, false, H2),  (Http2, Remote, true, false, true, H2),
            (Http2, Remote, true, true, false, H2),   (Http2, Remote, true, true, true, H2),
            (Shm, Remote, false, false, false, H2),   (Shm, Remote, false, false, true, H2),
            (Shm, Remote, false, true, false, H2),    (Shm, Remote, false, true, true, H2),
            (Shm, Remote, true, false, false, Tcp),   (Shm, Remote, true, false, true, H2),
            (Shm, Remote, true, true, false, Tcp),    (Shm, Remote, true, true, true, H2),
        ];
        let mut seen = std::collections::HashSet::new();
        for (preference, locality, raw, shared_memory, tls, expected) in table {
            assert!(
                seen.insert((preference, locality, raw, shared_memory, tls)),
                "duplicate row"
            );
            let caps = Capabilities { raw, shared_memory };
            assert_eq!(
                select(preference, locality, caps, tls),
                expected,
                "{preference:?} {locality:?} raw={raw} shm={shared_memory} tls={tls}"
            );
        }
        assert_eq!(
            seen.len(),
            4 * 3 * 2 * 2 * 2,
            "the table covers every combination"
        );
    }

    #[test]
    fn preference_values_parse_case_insensitively() {
        let parse = |v: &str| Preference::parse(Some(OsStr::new(v))).unwrap();
        assert_eq!(Preference::parse(None).unwrap(), Preference::Auto);
        for (values, expected) in [
            (&["", "auto", "AUTO", " auto\n"][..], Preference::Auto),
            (
                &["raw", "tcp", "direct_tcp", "direct-tcp", "RAW"][..],
                Preference::Raw,
            ),
            (&["http2", "legacy", "off", "Http2"][..], Preference::Http2),
            (
                &["shm", "shared_memory", "shared-memory", "SHM"][..],
                Preference::SharedMemory,
            ),
        ] {
            for value in values {
                assert_eq!(parse(value), expected, "{value:?}");
            }
        }
    }

    #[test]
    fn unknown_preference_is_a_configuration_error_naming_the_value() {
        for value in ["udp", "http3", "raw tcp", "1"] {
            let err = Preference::parse(Some(OsStr::new(value))).unwrap_err();
            assert_eq!(err.variable, "PULSING_TENSOR_TRANSPORT");
            assert_eq!(err.value, value);
            assert!(err.to_string().contains(&format!("{value:?}")));
        }
    }
}
