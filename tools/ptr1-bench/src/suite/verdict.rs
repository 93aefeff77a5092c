//! The verdict: tensorwire against the transports users would pick instead, like with like.
//!
//! A ratio divides two figures only when both sides do the same with each message's bytes —
//! hand them off by reference, copy them once through shared memory, or pass them through the
//! kernel — and run from the same language. A hand-off that moves no bytes, divided by a peer
//! that copies every byte, or a Rust client divided by a Python one, says nothing about either;
//! where a kind has no peer the verdict says so instead of dividing. A peer written in C (MPI's
//! own ranks) stands beside the Rust clients: both compiled, no interpreter in the loop. Nor
//! does a figure of ours bought by keeping a CPU busy between messages get divided by peers
//! that sleep: ours that spin through gaps count only where a peer that does too was measured.

use std::fmt;

use crate::suite::Case;

/// What a transfer does with each message's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Transfer {
    /// Handed off by reference: the receiver reads the sender's memory (loaned shared memory,
    /// iceoryx2 written in place, Ray's object store when the array already lives there).
    ZeroCopy,
    /// Copied through shared memory, no kernel in the data path (shm copied in,
    /// `multiprocessing.shared_memory`, iceoryx2 copied into its loan, MPI on one host; shm's
    /// and MPI's small messages, copied into a shared-memory queue and out of it).
    OneCopy,
    /// Through the kernel: a socket (PTR1, pyzmq, gRPC, MPI over TCP).
    Kernel,
}

impl Transfer {
    pub(crate) const ALL: [Self; 3] = [Self::ZeroCopy, Self::OneCopy, Self::Kernel];

    /// The key in results.json and in the peers' driver's records.
    pub(crate) fn key(self) -> &'static str {
        match self {
            Self::ZeroCopy => "zero_copy",
            Self::OneCopy => "one_copy",
            Self::Kernel => "kernel",
        }
    }

    pub(crate) fn parse(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.key() == key)
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::ZeroCopy => "zero-copy hand-off",
            Self::OneCopy => "one copy",
            Self::Kernel => "through the kernel",
        }
    }

    /// The tag a table cell carries.
    pub(crate) fn tag(self) -> &'static str {
        match self {
            Self::ZeroCopy => "[0]",
            Self::OneCopy => "[1]",
            Self::Kernel => "[k]",
        }
    }
}

/// One side of a comparison in one case: a tensorwire column or path (`ours`), or a peer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Entrant<'a> {
    pub(crate) name: &'a str,
    pub(crate) ours: bool,
    pub(crate) transfer: Transfer,
    /// The language its client runs in ("rust", "python", …): compared only with the same.
    pub(crate) language: &'a str,
    pub(crate) value: f64,
    /// Whether its threads keep a CPU busy between messages, however far apart they come (MPI's
    /// ranks, iceoryx2's server, tensorwire against a fixture told to spin).
    pub(crate) spins_through_gaps: bool,
    /// Whether most of its repetitions ran on the slow placement of the host's CPU pair
    /// (`cpu_pair`: the columns are probed by the suite, the Python peers by their driver;
    /// a figure never probed never is).
    pub(crate) slow_placement: bool,
}

/// The verdict of one kind of transfer from one language, in one case.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Verdict<'a> {
    /// How many times better the best of ours is than the best peer of the same kind and
    /// language (> 1 favours tensorwire; for latencies the inverse of the ratio).
    Ratio {
        transfer: Transfer,
        language: &'a str,
        ours: &'a str,
        peer: &'a str,
        ratio: f64,
        /// Ours ran on the slow placement of the host's CPU pair: the ratio compares the host
        /// as much as the transports.
        ours_slow: bool,
        /// The peer did: the ratio flatters ours as much.
        peer_slow: bool,
    },
    /// Ours has a figure of this kind and language; no peer does.
    NoPeer {
        transfer: Transfer,
        language: &'a str,
        ours: &'a str,
    },
}

/// For every kind of transfer and language in which one of ours has a figure in `case`: the best
/// of ours against the best peer of the same kind and language, or that there is no such peer.
/// Ours that spin through gaps take part only where a peer of the same kind and language that
/// spins through them has a figure. Ordered by kind, then by the order languages first appear.
pub(crate) fn verdicts<'a>(case: &Case, entrants: &[Entrant<'a>]) -> Vec<Verdict<'a>> {
    // Every entrant in the language it is compared in, once: the rest compares languages as is.
    let entrants: Vec<Entrant<'a>> = entrants
        .iter()
        .map(|e| Entrant {
            language: compared_as(e.language),
            ..*e
        })
        .collect();
    let figure = |e: &&Entrant<'a>| e.value.is_finite() && e.value > 0.0;
    let spinning_peer = |transfer: Transfer, language: &str| {
        entrants.iter().filter(figure).any(|p| {
            !p.ours && p.spins_through_gaps && p.transfer == transfer && p.language == language
        })
    };
    let measured = |e: &&Entrant<'a>| {
        figure(e) && !(e.ours && e.spins_through_gaps && !spinning_peer(e.transfer, e.language))
    };
    let mut groups: Vec<(Transfer, &'a str)> = Vec::new();
    for e in entrants.iter().filter(|e| e.ours).filter(measured) {
        if !groups.contains(&(e.transfer, e.language)) {
            groups.push((e.transfer, e.language));
        }
    }
    groups.sort_by_key(|(transfer, _)| *transfer);
    groups
        .into_iter()
        .filter_map(|(transfer, language)| {
            // `spinning_only`: only entrants that spin through gaps.
            let best = |ours: bool, spinning_only: bool| {
                let side: Vec<&Entrant<'a>> = entrants
                    .iter()
                    .filter(|e| e.ours == ours && e.transfer == transfer)
                    .filter(|e| e.language == language)
                    .filter(|e| e.spins_through_gaps || !spinning_only)
                    .filter(measured)
                    .collect();
                let value = case.best(side.iter().map(|e| e.value));
                side.into_iter().find(|e| e.value == value)
            };
            let ours = best(true, false)?;
            Some(match best(false, ours.spins_through_gaps) {
                Some(peer) => Verdict::Ratio {
                    transfer,
                    language,
                    ours: ours.name,
                    peer: peer.name,
                    ratio: case.better(ours.value, peer.value),
                    ours_slow: ours.slow_placement,
                    peer_slow: peer.slow_placement,
                },
                None => Verdict::NoPeer {
                    transfer,
                    language,
                    ours: ours.name,
                },
            })
        })
        .collect()
}

impl Verdict<'_> {
    pub(crate) fn transfer(&self) -> Transfer {
        match self {
            Self::Ratio { transfer, .. } | Self::NoPeer { transfer, .. } => *transfer,
        }
    }

    pub(crate) fn language(&self) -> &str {
        match self {
            Self::Ratio { language, .. } | Self::NoPeer { language, .. } => language,
        }
    }
}

impl fmt::Display for Verdict<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ratio {
                ours,
                peer,
                ratio,
                ours_slow,
                peer_slow,
                ..
            } => {
                let mark = match (*ours_slow, *peer_slow) {
                    (true, true) => " ‡§",
                    (true, false) => " ‡",
                    (false, true) => " §",
                    (false, false) => "",
                };
                write!(f, "{ratio:.2}×{mark} ({ours} ÷ {peer})")
            }
            Self::NoPeer {
                transfer, language, ..
            } => write!(
                f,
                "no peer of this kind ({}, from {})",
                transfer.name(),
                language_name(language)
            ),
        }
    }
}

/// The language an entrant is compared in: a peer written in C counts as Rust's (both compiled,
/// no interpreter between the caller and the transport); every other language only as itself.
pub(crate) fn compared_as(language: &str) -> &str {
    match language {
        "c" => "rust",
        other => other,
    }
}

/// "rust" → "Rust", "python" → "Python"; anything else as it is.
pub(crate) fn language_name(language: &str) -> &str {
    match language {
        "rust" => "Rust",
        "python" => "Python",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Mode;

    fn case(mode: Mode) -> Case {
        Case::of_one_mib(mode)
    }

    fn entrant(
        name: &'static str,
        ours: bool,
        transfer: Transfer,
        language: &'static str,
        value: f64,
    ) -> Entrant<'static> {
        Entrant {
            name,
            ours,
            transfer,
            language,
            value,
            spins_through_gaps: false,
            slow_placement: false,
        }
    }

    /// An entrant whose threads stay busy between messages.
    fn spinning(entrant: Entrant<'static>) -> Entrant<'static> {
        Entrant {
            spins_through_gaps: true,
            ..entrant
        }
    }

    #[test]
    fn ours_that_spin_through_gaps_are_divided_only_where_a_peer_spins_too() {
        let sporadic = case(Mode::Rtt);
        let sleeping = entrant(
            "tensorwire (Python)",
            true,
            Transfer::Kernel,
            "python",
            48.0,
        );
        let spinning_ours = spinning(entrant(
            "tensorwire spinning (Python)",
            true,
            Transfer::Kernel,
            "python",
            30.0,
        ));
        let pyzmq = entrant("pyzmq", false, Transfer::Kernel, "python", 170.0);
        let mpi = spinning(entrant(
            "MPI over TCP",
            false,
            Transfer::Kernel,
            "python",
            25.0,
        ));
        let ratio = |entrants: &[Entrant<'static>]| match verdicts(&sporadic, entrants).as_slice() {
            [
                Verdict::Ratio {
                    ours, peer, ratio, ..
                },
            ] => (*ours, *peer, *ratio),
            other => panic!("expected one ratio, got {other:?}"),
        };
        // Only sleeping peers: the spinning figure is left out.
        let (ours, peer, r) = ratio(&[sleeping, spinning_ours, pyzmq]);
        assert_eq!((ours, peer), ("tensorwire (Python)", "pyzmq"));
        assert!((r - 170.0 / 48.0).abs() < 1e-9);
        // A peer that spins too: the spinning figure counts, against the best spinning peer.
        let (ours, peer, r) = ratio(&[sleeping, spinning_ours, pyzmq, mpi]);
        assert_eq!(
            (ours, peer),
            ("tensorwire spinning (Python)", "MPI over TCP")
        );
        assert!((r - 25.0 / 30.0).abs() < 1e-9);
        // Even where a sleeping peer is faster than every spinning one.
        let fast_sleeper = entrant("gRPC (Python)", false, Transfer::Kernel, "python", 20.0);
        let (ours, peer, _) = ratio(&[sleeping, spinning_ours, fast_sleeper, mpi]);
        assert_eq!(
            (ours, peer),
            ("tensorwire spinning (Python)", "MPI over TCP")
        );
        // Nothing of ours but the spinning figure, and no peer that spins: no verdict at all.
        assert_eq!(verdicts(&sporadic, &[spinning_ours, pyzmq]), vec![]);
    }

    #[test]
    fn a_figure_of_ours_on_the_slow_placement_marks_its_ratio() {
        let slow = Entrant {
            slow_placement: true,
            ..entrant("PTR1 tokio", true, Transfer::Kernel, "rust", 430.0)
        };
        let fast = entrant("PTR1 io_uring", true, Transfer::Kernel, "rust", 440.0);
        let mpi = entrant("MPI over TCP (C)", false, Transfer::Kernel, "c", 200.0);
        let rtt = case(Mode::Rtt);
        let found = verdicts(&rtt, &[slow, fast, mpi]);
        let [verdict @ Verdict::Ratio { ours_slow, .. }] = found.as_slice() else {
            panic!("expected one ratio, got {found:?}");
        };
        assert!(*ours_slow, "the best of ours ran on the slow placement");
        assert!(
            verdict.to_string().starts_with("0.47× ‡ (PTR1 tokio"),
            "{verdict}"
        );
        // The same figure on the usual placement: no mark; then the peer on the slow one.
        let usual = Entrant {
            slow_placement: false,
            ..slow
        };
        let found = verdicts(&rtt, &[usual, fast, mpi]);
        assert!(!found[0].to_string().contains('‡'), "{}", found[0]);
        let slow_mpi = Entrant {
            slow_placement: true,
            ..mpi
        };
        let found = verdicts(&rtt, &[usual, fast, slow_mpi]);
        let [verdict @ Verdict::Ratio { peer_slow, .. }] = found.as_slice() else {
            panic!("expected one ratio, got {found:?}");
        };
        assert!(*peer_slow, "the peer ran on the slow placement");
        assert!(
            verdict.to_string().starts_with("0.47× § (PTR1 tokio"),
            "{verdict}"
        );
        // Both on it: both marks.
        let found = verdicts(&rtt, &[slow, fast, slow_mpi]);
        assert!(
            found[0].to_string().starts_with("0.47× ‡§ (PTR1 tokio"),
            "{}",
            found[0]
        );
    }

    #[test]
    fn a_loaned_column_is_never_divided_by_a_copying_peer() {
        let entrants = [
            entrant("shm loaned", true, Transfer::ZeroCopy, "python", 20.0),
            entrant("iceoryx2", false, Transfer::OneCopy, "python", 9.0),
            entrant(
                "multiprocessing.shared_memory",
                false,
                Transfer::OneCopy,
                "python",
                5.0,
            ),
        ];
        let found = verdicts(&case(Mode::OneWay), &entrants);
        assert_eq!(
            found,
            vec![Verdict::NoPeer {
                transfer: Transfer::ZeroCopy,
                language: "python",
                ours: "shm loaned",
            }]
        );
        let with_peer = [
            entrants[0],
            entrants[1],
            entrant(
                "iceoryx2 in place",
                false,
                Transfer::ZeroCopy,
                "python",
                25.0,
            ),
        ];
        match verdicts(&case(Mode::OneWay), &with_peer).as_slice() {
            [Verdict::Ratio { peer, ratio, .. }] => {
                assert_eq!(*peer, "iceoryx2 in place");
                assert!((ratio - 0.8).abs() < 1e-9);
            }
            other => panic!("expected one ratio, got {other:?}"),
        }
    }

    #[test]
    fn python_is_never_divided_by_rust() {
        let entrants = [
            entrant("tensorwire (Python)", true, Transfer::Kernel, "python", 2.0),
            entrant("PTR1 io_uring", true, Transfer::Kernel, "rust", 4.0),
            entrant("pyzmq", false, Transfer::Kernel, "python", 1.0),
        ];
        let found = verdicts(&case(Mode::OneWay), &entrants);
        assert_eq!(found.len(), 2);
        match found[0] {
            Verdict::Ratio {
                ours, peer, ratio, ..
            } => {
                assert_eq!((ours, peer), ("tensorwire (Python)", "pyzmq"));
                assert!((ratio - 2.0).abs() < 1e-9);
            }
            other => panic!("expected the Python ratio, got {other:?}"),
        }
        assert_eq!(
            found[1],
            Verdict::NoPeer {
                transfer: Transfer::Kernel,
                language: "rust",
                ours: "PTR1 io_uring",
            }
        );
    }

    #[test]
    fn a_peer_in_c_stands_beside_rust_never_beside_python() {
        let entrants = [
            entrant("PTR1 io_uring", true, Transfer::Kernel, "rust", 10.0),
            entrant("tensorwire (Python)", true, Transfer::Kernel, "python", 6.0),
            entrant("MPI over TCP (C)", false, Transfer::Kernel, "c", 8.0),
            entrant("MPI over TCP", false, Transfer::Kernel, "python", 4.0),
        ];
        let found = verdicts(&case(Mode::OneWay), &entrants);
        let text: Vec<String> = found.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            vec![
                "1.25× (PTR1 io_uring ÷ MPI over TCP (C))",
                "1.50× (tensorwire (Python) ÷ MPI over TCP)",
            ]
        );
        assert_eq!(found[0].language(), "rust");
        // A C peer alone, with nothing of ours from Rust: no verdict for it.
        let python_only = [entrants[1], entrants[2], entrants[3]];
        let found = verdicts(&case(Mode::OneWay), &python_only);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].language(), "python");
    }

    #[test]
    fn a_kind_without_a_peer_prints_a_no_peer_note_and_no_ratio() {
        let entrants = [
            entrant("shm copied in", true, Transfer::OneCopy, "rust", 5.0),
            entrant("MPI one host", false, Transfer::OneCopy, "python", 9.0),
        ];
        let found = verdicts(&case(Mode::OneWay), &entrants);
        assert_eq!(found.len(), 1);
        let text = found[0].to_string();
        assert_eq!(text, "no peer of this kind (one copy, from Rust)");
        assert!(!text.contains('×'));
    }

    #[test]
    fn each_kind_divides_its_best_by_its_best_peer_and_latencies_invert() {
        let entrants = [
            entrant(
                "tensorwire shm (Python)",
                true,
                Transfer::OneCopy,
                "python",
                40.0,
            ),
            entrant(
                "tensorwire (Python)",
                true,
                Transfer::Kernel,
                "python",
                60.0,
            ),
            entrant("MPI one host", false, Transfer::OneCopy, "python", 10.0),
            entrant("iceoryx2", false, Transfer::OneCopy, "python", 30.0),
            entrant("pyzmq", false, Transfer::Kernel, "python", 120.0),
            entrant("MPI over TCP", false, Transfer::Kernel, "python", f64::NAN),
        ];
        let found = verdicts(&case(Mode::Rtt), &entrants);
        let text: Vec<String> = found.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            vec![
                "0.25× (tensorwire shm (Python) ÷ MPI one host)",
                "2.00× (tensorwire (Python) ÷ pyzmq)",
            ]
        );
        assert_eq!(found[0].transfer(), Transfer::OneCopy);
        assert_eq!(found[1].language(), "python");
    }

    #[test]
    fn peers_alone_or_unmeasured_ours_give_no_verdict() {
        let entrants = [
            entrant("shm loaned", true, Transfer::ZeroCopy, "rust", f64::NAN),
            entrant("iceoryx2 in place", false, Transfer::ZeroCopy, "rust", 3.0),
        ];
        assert!(verdicts(&case(Mode::OneWay), &entrants).is_empty());
    }

    #[test]
    fn transfer_keys_round_trip() {
        for transfer in Transfer::ALL {
            assert_eq!(Transfer::parse(transfer.key()), Some(transfer));
        }
        assert_eq!(Transfer::parse("two_copies"), None);
    }
}
