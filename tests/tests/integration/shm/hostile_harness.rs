//! The hostile tests' harness (`shm::hostile`, `shm::hostile_more`): the node they try, and
//! this test binary run again as a hostile peer process (`hostile_peer`, driven through its
//! stdin and stdout).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::thread;
use std::time::Duration;

use bytes::Bytes;
use tensorwire_engine::shm::PeerBounds;
use tensorwire_engine::{Node, Preference, Reply, TensorMessage};
use tensorwire_tests::raw_shm::{RawConn, connect_without_hello, sealed_memfd};
use tensorwire_tests::*;

/// An ask of `n` KiB.
pub(super) fn kib(n: usize) -> TensorMessage {
    TensorMessage::new(1, Bytes::new(), vec![Bytes::from(vec![7u8; n << 10])])
}

/// A node open to same-host peers, with `echo` and `sink` endpoints.
pub(super) fn node() -> Node {
    node_with(|b| b)
}

/// [`node`], configured by `configure` first.
pub(super) fn node_with(
    configure: impl FnOnce(tensorwire_engine::NodeBuilder) -> tensorwire_engine::NodeBuilder,
) -> Node {
    let node = configure(
        Node::builder(any_local_address())
            .in_process_delivery(false)
            .shared_memory(true)
            .preference(Preference::SharedMemory),
    )
    .build()
    .unwrap();
    node.serve("echo", 2, |r| Ok(Reply::Tensor(r.message)))
        .unwrap();
    node.serve("sink", 2, |r| {
        Ok(Reply::Single {
            msg_type: "ack".into(),
            data: Bytes::from(r.message.total_bytes().to_string()),
        })
    })
    .unwrap();
    node
}

/// This test binary run again as a hostile peer process (`hostile_peer` below).
pub(super) struct HostilePeer {
    child: Child,
    pub(super) addr: Option<SocketAddr>,
    pub(super) flooded: usize,
    /// What a hoarder reported.
    pub(super) report: String,
}

impl HostilePeer {
    pub(super) fn start(mode: &str, target: Option<SocketAddr>) -> Self {
        let exe = std::env::current_exe().unwrap();
        let mut command = Command::new(exe);
        command
            .args([
                "--ignored",
                "--exact",
                "shm::hostile_harness::hostile_peer",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("TENSORWIRE_HOSTILE", mode)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(target) = target {
            command.env("TENSORWIRE_HOSTILE_TARGET", target.to_string());
        }
        let mut child = command.spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (mut addr, mut flooded, mut report) = (None, 0, String::new());
        loop {
            let line = lines.next().expect("the peer reports").unwrap();
            if let Some(at) = line.split("peer listening on ").nth(1) {
                addr = Some(at.trim().parse().unwrap());
                break;
            }
            if let Some(n) = line.split("flooded ").nth(1) {
                flooded = n.trim().parse().unwrap();
                break;
            }
            if let Some(what) = line.split("hoarded ").nth(1) {
                report = what.trim().to_owned();
                break;
            }
        }
        Self {
            child,
            addr,
            flooded,
            report,
        }
    }

    pub(super) fn command(&mut self, line: &str) {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
        thread::sleep(Duration::from_millis(200));
    }

    /// The CPU the peer process uses over `window`.
    pub(super) fn cpu_seconds_over(&self, window: Duration) -> f64 {
        let read = || {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
            let fields: Vec<&str> = stat
                .rsplit(") ")
                .next()
                .unwrap()
                .split_whitespace()
                .collect();
            let ticks: u64 =
                fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
            ticks
        };
        let before = read();
        thread::sleep(window);
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        (read() - before) as f64 / hz
    }
}

impl Drop for HostilePeer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
#[ignore = "run by the hostile tests as their peer process"]
fn hostile_peer() {
    let mode = std::env::var("TENSORWIRE_HOSTILE").expect("only as a child");
    let mut stdin = std::io::stdin().lines();
    match mode.as_str() {
        "limit-fds" => {
            let node = node();
            println!("peer listening on {}", node.local_addr());
            // On "limit": no descriptor fits any more (0-2 stay open).
            if let Some(Ok(_)) = stdin.next() {
                set_open_files(3);
            }
            let _ = stdin.next();
            drop(node);
        }
        "few-fds" => {
            // A node built under a limit that leaves 64 descriptors free, serving until stdin
            // closes. (Set before the node starts: an io_uring accept keeps the limit it was
            // armed under, so a limit lowered later leaves its TCP side unbounded.)
            set_open_files(limit_leaving(64));
            let node = node();
            println!("peer listening on {}", node.local_addr());
            let _ = stdin.next();
            drop(node);
        }
        "maps" => {
            // As many segments as one process may have mapped, announced on one connection
            // kept open: how many went, and whether the node closed it.
            let raw = RawConn::open(hostile_target()).expect("the peer connects");
            let most = PeerBounds::default().segments_per_process as u64;
            let announced = (1..=most)
                .take_while(|&segment| {
                    sealed_memfd(4096, true, true)
                        .is_ok_and(|fd| raw.announce(segment, 4096, fd.as_raw_fd()).is_ok())
                })
                .count();
            let closed = raw.closed_by_node(Duration::from_secs(2));
            println!("hoarded {announced} closed {closed}");
            let _ = stdin.next();
        }
        "hellos" => {
            let target = hostile_target();
            let held: Vec<_> = (0..300)
                .filter_map(|_| connect_without_hello(target).ok())
                .collect();
            println!("flooded {}", held.len());
            let _ = stdin.next();
        }
        "hoard" => {
            // Four asks at a time: the node copies several replies for this process at once.
            let target = hostile_target();
            let client = node();
            let (held, refusals) = (Mutex::new(Vec::new()), Mutex::new(Vec::new()));
            thread::scope(|s| {
                for _ in 0..4 {
                    s.spawn(|| {
                        loop {
                            let asked = client.ask_blocking(
                                target,
                                "/actors/make",
                                kib(1),
                                Duration::from_secs(5),
                            );
                            let mut held = held.lock().unwrap();
                            let refusal = match asked {
                                Ok(reply) if held.len() < 64 => {
                                    held.push(tensor(reply));
                                    continue;
                                }
                                Ok(_) => "nothing refused".to_owned(),
                                Err(e) => e.to_string().replace('\n', " "),
                            };
                            break refusals.lock().unwrap().push(refusal);
                        }
                    });
                }
            });
            let held = held.into_inner().unwrap();
            let bytes: u64 = held.iter().map(TensorMessage::total_bytes).sum();
            println!("hoarded {bytes} then {}", refusals.into_inner().unwrap()[0]);
            let _ = stdin.next();
        }
        other => panic!("unknown mode {other}"),
    }
}

/// Lowers this process's soft descriptor limit to `limit`, keeping its hard limit (raising
/// that would need privileges a CI runner may not have).
fn set_open_files(limit: u64) {
    let mut current = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the live rlimit it is given.
    let got = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut current) };
    assert_eq!(got, 0, "{}", std::io::Error::last_os_error());
    let lowered = libc::rlimit {
        rlim_cur: limit.min(current.rlim_max),
        rlim_max: current.rlim_max,
    };
    // SAFETY: setrlimit reads a live rlimit.
    let set = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const lowered) };
    assert_eq!(set, 0, "{}", std::io::Error::last_os_error());
}

/// The descriptor limit under which `free` more descriptors fit: one past the `free`-th
/// lowest number not open now (descriptors open above it stay usable).
fn limit_leaving(free: usize) -> u64 {
    let open: std::collections::HashSet<u64> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    let last_free = (0..).filter(|fd| !open.contains(fd)).nth(free - 1).unwrap();
    last_free + 1
}

/// The node a hostile peer process was started against.
fn hostile_target() -> SocketAddr {
    std::env::var("TENSORWIRE_HOSTILE_TARGET")
        .expect("started with a target")
        .parse()
        .expect("a socket address")
}
