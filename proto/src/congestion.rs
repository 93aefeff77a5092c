//! Which TCP congestion control a connection between two addresses of this host asks for.
//!
//! A connection whose two ends are on this host (a loopback address, or the same address on
//! both ends, which Linux routes through the loopback device) has no network to be congested.
//! What the kernel's default congestion control does there still matters: BBR paces its
//! segments, and without the `fq` qdisc it paces them from a timer, so part of a large write
//! leaves from the CPU the timer fired on. The loopback device queues each segment to the
//! backlog of the CPU that sent it, the two backlogs are drained independently, and the
//! receiver sees the stream out of order: duplicate ACKs, spurious retransmissions, and one
//! 64 MiB message in half again the time (`docs/benchmarks.md`, "Same-host TCP without
//! pacing"). Reno does not pace and is always allowed to unprivileged processes, so a
//! same-host connection asks for it by default. A connection to another host keeps the
//! kernel's choice.

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::ConfigError;

/// The congestion control a same-host TCP connection asks for, or none (keep the kernel's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SameHostCongestion(Option<String>);

impl Default for SameHostCongestion {
    /// `reno`: see the [module docs](self).
    fn default() -> Self {
        Self(Some(Self::DEFAULT.to_owned()))
    }
}

impl SameHostCongestion {
    /// The environment variable a node reads when its builder did not set this.
    pub const VARIABLE: &'static str = "TENSORWIRE_SAME_HOST_CONGESTION";
    /// What a same-host connection asks for unless told otherwise.
    pub const DEFAULT: &'static str = "reno";
    /// The value that keeps the kernel's choice.
    pub const SYSTEM: &'static str = "system";
    /// Linux's longest congestion-control name (`TCP_CA_NAME_MAX` less its terminator).
    const MAX_NAME: usize = 15;

    /// Keeps the kernel's congestion control on same-host connections too.
    pub fn system() -> Self {
        Self(None)
    }

    /// Asks for `name` on same-host connections.
    ///
    /// # Errors
    ///
    /// A name Linux could not hold (empty, longer than 15 bytes, or other than ASCII letters,
    /// digits and `_`) is a [`ConfigError`]. A well-formed name the kernel lacks or does not
    /// allow this process is not: setting it fails per connection, which keeps the kernel's.
    pub fn named(name: &str) -> Result<Self, ConfigError> {
        let well_formed = !name.is_empty()
            && name.len() <= Self::MAX_NAME
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !well_formed {
            return Err(Self::error(name));
        }
        Ok(Self(Some(name.to_owned())))
    }

    /// The error for a value that is neither `system` nor a well-formed name.
    fn error(value: &str) -> ConfigError {
        ConfigError {
            variable: Self::VARIABLE,
            value: value.to_owned(),
            expected: "unset, `system`, or a congestion control's name (1 to 15 ASCII letters, \
                       digits or `_`, such as reno or cubic)",
        }
    }

    /// Reads [`SameHostCongestion::VARIABLE`] from the process environment.
    ///
    /// # Errors
    ///
    /// See [`SameHostCongestion::parse`].
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::parse(std::env::var_os(Self::VARIABLE).as_deref())
    }

    /// Parses a value of [`SameHostCongestion::VARIABLE`] (`None` = unset). Unset or empty
    /// is the default (`reno`); `system` (any case) keeps the kernel's choice; anything else must be a
    /// congestion control's name. Surrounding ASCII whitespace is ignored.
    ///
    /// # Errors
    ///
    /// A value that is not UTF-8 or not a well-formed name ([`SameHostCongestion::named`]).
    pub fn parse(value: Option<&OsStr>) -> Result<Self, ConfigError> {
        let Some(raw) = value else {
            return Ok(Self::default());
        };
        let error = || Self::error(&raw.to_string_lossy());
        let text = raw.to_str().ok_or_else(error)?.trim_ascii();
        match text {
            "" => Ok(Self::default()),
            t if t.eq_ignore_ascii_case(Self::SYSTEM) => Ok(Self::system()),
            name => Self::named(name).map_err(|_| error()),
        }
    }

    /// On a connection whose ends are on this host (`on_this_host`: [`same_host`] once
    /// connected, [`peer_on_this_host`] before), calls `set` with the configured name (a
    /// driver's `setsockopt(TCP_CONGESTION)`); its error comes back as a [`Refused`]. Drivers
    /// set it before `connect` and on a loopback listener where they can: a socket that
    /// switches away from BBR once connected keeps the pacing BBR turned on, at the new
    /// congestion control's rate (`docs/benchmarks.md`, "Same-host TCP without pacing").
    ///
    /// # Errors
    ///
    /// [`Refused`] with `set`'s error.
    pub fn apply<E>(
        &self,
        on_this_host: bool,
        set: impl FnOnce(&str) -> Result<(), E>,
    ) -> Result<(), Refused<'_, E>> {
        static REFUSED_BEFORE: AtomicBool = AtomicBool::new(false);
        let Some(name) = self.0.as_deref().filter(|_| on_this_host) else {
            return Ok(());
        };
        set(name).map_err(|error| Refused {
            name,
            error,
            first: !REFUSED_BEFORE.swap(true, Ordering::Relaxed),
        })
    }

    /// The congestion control to ask for on a connection from `local` to `peer`: the
    /// configured name if both ends are on this host, else `None` (keep the kernel's).
    pub fn for_connection(&self, local: SocketAddr, peer: SocketAddr) -> Option<&str> {
        let name = self.0.as_deref()?;
        same_host(local, peer).then_some(name)
    }
}

/// The kernel refused the same-host congestion control (not built in, or not in
/// `net.ipv4.tcp_allowed_congestion_control`); the connection keeps the kernel's.
#[derive(Debug)]
pub struct Refused<'a, E> {
    /// The name asked for.
    pub name: &'a str,
    /// What setting it returned.
    pub error: E,
    /// Whether this is the process's first refusal: drivers say it loudly once, then quietly.
    pub first: bool,
}

impl<E> Refused<'_, E> {
    /// What a driver logs.
    pub const MESSAGE: &'static str = "same-host TCP connections keep the kernel's congestion \
                                       control: it refused the one \
                                       TENSORWIRE_SAME_HOST_CONGESTION names";
}

/// Whether a connection to `peer`, not made yet, will stay on this host: `peer` is a loopback
/// address, or `source_for` — the local address the kernel's routing would send from, which a
/// driver learns by connecting a UDP socket to `peer` (that sends nothing) — is `peer`'s own
/// address, as it is for every address of this host. `None` (no route, no socket) is "not
/// known": the driver checks again once connected ([`same_host`]).
pub fn peer_on_this_host(
    peer: SocketAddr,
    source_for: impl FnOnce(SocketAddr) -> Option<SocketAddr>,
) -> bool {
    peer.ip().to_canonical().is_loopback() || source_for(peer).is_some_and(|s| same_host(s, peer))
}

/// Whether a TCP connection between `local` and `peer` stays on this host: the peer is a
/// loopback address, or both ends have the same address (Linux picks a local destination's
/// own address as the source, and routes the connection through the loopback device).
pub fn same_host(local: SocketAddr, peer: SocketAddr) -> bool {
    let peer = peer.ip().to_canonical();
    peer.is_loopback() || local.ip().to_canonical() == peer
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn loopback_and_own_address_connections_are_same_host_others_are_not() {
        assert!(same_host(addr("127.0.0.1:5000"), addr("127.0.0.1:6000")));
        assert!(same_host(addr("127.0.0.1:5000"), addr("127.0.0.2:6000")));
        assert!(same_host(addr("[::1]:5000"), addr("[::1]:6000")));
        assert!(same_host(
            addr("[::ffff:127.0.0.1]:5000"),
            addr("[::ffff:127.0.0.1]:6000")
        ));
        assert!(same_host(addr("10.0.0.5:5000"), addr("10.0.0.5:6000")));
        assert!(same_host(
            addr("[::ffff:10.0.0.5]:5000"),
            addr("10.0.0.5:6000")
        ));
        assert!(!same_host(addr("10.0.0.5:5000"), addr("10.0.0.6:6000")));
        assert!(!same_host(addr("[fd00::1]:5000"), addr("[fd00::2]:6000")));
    }

    #[test]
    fn the_default_asks_for_reno_on_this_host_only() {
        let choice = SameHostCongestion::default();
        assert_eq!(
            choice.for_connection(addr("127.0.0.1:1"), addr("127.0.0.1:2")),
            Some("reno")
        );
        assert_eq!(
            choice.for_connection(addr("10.0.0.5:1"), addr("10.0.0.6:2")),
            None
        );
        assert_eq!(
            SameHostCongestion::system().for_connection(addr("127.0.0.1:1"), addr("127.0.0.1:2")),
            None
        );
    }

    #[test]
    fn apply_sets_only_same_host_connections_and_says_loudly_once_that_it_was_refused() {
        let choice = SameHostCongestion::default();
        let mut asked = Vec::new();
        let remote = choice.apply(false, |name| {
            asked.push(name.to_owned());
            Err("not reached")
        });
        assert!(remote.is_ok() && asked.is_empty());
        let system = SameHostCongestion::system();
        assert!(system.apply(true, |_| Err("not reached")).is_ok());
        let refusals: Vec<bool> = (0..2)
            .map(|_| {
                let refused = choice.apply(true, |_| Err("EPERM")).unwrap_err();
                assert_eq!((refused.name, refused.error), ("reno", "EPERM"));
                refused.first
            })
            .collect();
        // The flag is process-wide: no other test in this crate is refused.
        assert_eq!(refusals, [true, false]);
    }

    #[test]
    fn a_peer_not_connected_yet_is_on_this_host_if_loopback_or_routed_from_its_own_address() {
        let routed = |source: &'static str| move |_| Some(addr(source));
        assert!(peer_on_this_host(addr("127.0.0.1:1"), |_| None));
        assert!(peer_on_this_host(addr("[::ffff:127.0.0.1]:1"), |_| None));
        assert!(peer_on_this_host(
            addr("10.0.0.5:1"),
            routed("10.0.0.5:40000")
        ));
        assert!(peer_on_this_host(
            addr("[::ffff:10.0.0.5]:1"),
            routed("[::ffff:10.0.0.5]:40000")
        ));
        assert!(!peer_on_this_host(
            addr("10.0.0.6:1"),
            routed("10.0.0.5:40000")
        ));
        assert!(!peer_on_this_host(addr("10.0.0.6:1"), |_| None));
    }

    #[test]
    fn the_variable_parses_to_the_default_system_or_a_name() {
        let parse = |v: &str| SameHostCongestion::parse(Some(OsStr::new(v)));
        assert_eq!(
            SameHostCongestion::parse(None),
            Ok(SameHostCongestion::default())
        );
        assert_eq!(parse(" "), Ok(SameHostCongestion::default()));
        assert_eq!(parse("system"), Ok(SameHostCongestion::system()));
        assert_eq!(parse("System"), Ok(SameHostCongestion::system()));
        assert_eq!(
            parse(" cubic ")
                .unwrap()
                .for_connection(addr("[::1]:1"), addr("[::1]:2")),
            Some("cubic")
        );
        assert!(parse("fifteen_letters").is_ok());
        for bad in ["bbr;rm", "a-b", " sixteen_letters_ ", "ré"] {
            let error = parse(bad).unwrap_err();
            assert_eq!(error.variable, SameHostCongestion::VARIABLE);
            assert_eq!(error.value, bad, "the raw value: {bad}");
        }
        #[cfg(unix)]
        {
            use std::os::unix::ffi::OsStrExt;
            let not_utf8 = OsStr::from_bytes(b"re\xffno");
            assert!(SameHostCongestion::parse(Some(not_utf8)).is_err());
        }
    }
}
