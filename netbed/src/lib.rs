//! A test bed of hosts: network namespaces joined by one bridge, with faults on the wire.
//!
//! [`Testbed::new`] makes a switch namespace with a bridge and `n` host namespaces, each with
//! an `eth0` whose other end is a port of the bridge, at `10.201.0.(i + 1)/24`. Those
//! addresses exist only inside the test bed, and its namespaces have no other interface but
//! loopback: nothing a test sends can leave them.
//!
//! The namespaces have no names in `/run/netns`: each lives as long as this process holds its
//! file descriptor (or a thread or child process is inside it), so a test that fails, panics
//! or is killed leaves nothing behind. Code runs inside a host with [`Host::enter`] (a thread
//! of this process; every thread it starts, like the driver threads of a node built there, is
//! inside too) or [`Host::command`] (a child process, through `nsenter`).
//!
//! Faults use what these kernels have: nftables for loss (on the bridge, on wire-sized frames),
//! black holes and resets, `htb` for rate limits, `ip link` for flaps and MTU. `netem` is not available (no delay, no
//! reordering).
//!
//! It does not route to anything outside the bed, does not need (or touch) `/run/netns`, and
//! does not work without root.

use std::fs::File;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};

/// The subnet of every test bed.
pub const SUBNET: &str = "10.201.0.0/24";

/// Network namespaces joined by a bridge; dropped, everything it made is gone.
pub struct Testbed {
    switch: Namespace,
    hosts: Vec<Host>,
}

/// One host of a [`Testbed`]: a network namespace with `eth0` and loopback.
pub struct Host {
    index: usize,
    ns: Namespace,
}

impl Testbed {
    /// A switch and `hosts` hosts, all links up at MTU 1500, no faults.
    ///
    /// # Panics
    ///
    /// If the namespaces or links cannot be made (the tests need root, `ip`, `nsenter`).
    pub fn new(hosts: usize) -> Self {
        assert!(
            hosts <= 253,
            "at most 253 hosts (10.201.0.1 to 10.201.0.253)"
        );
        require_tools();
        let switch = Namespace::new("switch");
        switch.run(&["ip", "link", "set", "lo", "up"]);
        switch.run(&["ip", "link", "add", "br0", "type", "bridge"]);
        switch.run(&["ip", "link", "set", "br0", "up"]);
        let hosts: Vec<Host> = (0..hosts)
            .map(|index| {
                let ns = Namespace::new(&format!("host{index}"));
                let port = format!("p{index}");
                let peer_ns = ns.path();
                switch.run(&[
                    "ip", "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                    &peer_ns,
                ]);
                switch.run(&["ip", "link", "set", &port, "master", "br0", "up"]);
                let host = Host { index, ns };
                let cidr = format!("{}/24", host.ip());
                host.run(&["ip", "addr", "add", &cidr, "dev", "eth0"]);
                host.run(&["ip", "link", "set", "eth0", "up"]);
                host.run(&["ip", "link", "set", "lo", "up"]);
                host
            })
            .collect();
        Self { switch, hosts }
    }

    /// Host `index`.
    pub fn host(&self, index: usize) -> &Host {
        &self.hosts[index]
    }

    /// Sets the MTU of every link (both ends and the bridge).
    pub fn set_mtu(&self, mtu: u32) {
        let mtu = mtu.to_string();
        for host in &self.hosts {
            let port = format!("p{}", host.index);
            self.switch.run(&["ip", "link", "set", &port, "mtu", &mtu]);
            host.run(&["ip", "link", "set", "eth0", "mtu", &mtu]);
        }
        self.switch.run(&["ip", "link", "set", "br0", "mtu", &mtu]);
    }

    /// Drops `per_mille` of every thousand frames on `host`'s link, both ways, at random; see
    /// [`Testbed::drop_per_100k`].
    pub fn drop_randomly(&self, host: &Host, per_mille: u32) {
        self.drop_per_100k(host, per_mille.saturating_mul(100));
    }

    /// Drops `per_100k` of every 100,000 frames on `host`'s link, both ways, at random (`1000`
    /// is 1 %): nftables `numgen random` on the bridge, for frames from or to the host's port.
    /// Every host first sends wire-sized frames ([`Testbed::wire_sized_frames`]). Replaces the
    /// link's earlier loss.
    pub fn drop_per_100k(&self, host: &Host, per_100k: u32) {
        self.wire_sized_frames();
        self.clear_loss(host);
        let (port, rule) = (
            format!("p{}", host.index),
            format!("numgen random mod 100000 < {per_100k} counter drop"),
        );
        let ruleset = format!(
            "table bridge twloss{index} {{\n\
             \x20 chain forward {{ type filter hook forward priority 0; policy accept;\n\
             \x20   iifname \"{port}\" {rule}; oifname \"{port}\" {rule}; }}\n\
             }}\n",
            index = host.index
        );
        self.switch.load_nft(&ruleset);
    }

    /// Frames the loss on `host`'s link dropped so far (both ways).
    pub fn dropped_frames(&self, host: &Host) -> u64 {
        let table = format!("twloss{}", host.index);
        let listed = self
            .switch
            .command("nft")
            .args(["list", "table", "bridge", &table])
            .output()
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
            .unwrap_or_default();
        // Each rule says `… counter packets N bytes M drop`.
        let words: Vec<&str> = listed.split_whitespace().collect();
        words
            .windows(2)
            .filter(|pair| pair[0] == "packets")
            .filter_map(|pair| pair[1].parse::<u64>().ok())
            .sum()
    }

    /// Removes the loss on `host`'s link.
    pub fn clear_loss(&self, host: &Host) {
        let table = format!("twloss{}", host.index);
        let _ = self
            .switch
            .command("nft")
            .args(["delete", "table", "bridge", &table])
            .stderr(Stdio::null())
            .status();
    }

    /// Turns TCP segmentation offload off on every host (`ethtool -K eth0 tso off gso off`), so
    /// the kernel cuts segments before the veth and every frame on a link is one packet on a
    /// wire. Otherwise a veth carries 64 KiB GSO packets whole, and a rule that drops "a
    /// frame" would drop up to 44 segments at once. Costs throughput (about 6 Gbit/s instead
    /// of 13 for one iperf3 stream here).
    ///
    /// # Panics
    ///
    /// If `ethtool` is missing (Debian: ethtool).
    pub fn wire_sized_frames(&self) {
        for host in &self.hosts {
            host.run(&["ethtool", "-K", "eth0", "tso", "off", "gso", "off"]);
        }
    }

    /// Limits `host`'s link to `rate` (tc syntax, e.g. `1gbit`) both ways, with `htb`.
    pub fn limit_rate(&self, host: &Host, rate: &str) {
        let port = format!("p{}", host.index);
        for (ns, dev) in [(&host.ns, "eth0"), (&self.switch, port.as_str())] {
            ns.run(&[
                "tc", "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default",
                "10", "r2q", "1000",
            ]);
            // A burst of a few 64 KiB GSO packets: tc's default (rate / HZ) is smaller than one.
            ns.run(&[
                "tc", "class", "replace", "dev", dev, "parent", "1:", "classid", "1:10", "htb",
                "rate", rate, "ceil", rate, "burst", "256k", "cburst", "256k",
            ]);
        }
    }

    /// Caps every TCP connection `host` opens at `rate` (tc syntax, e.g. `200mbit`) each way,
    /// as a datacenter link caps one flow: the host's outgoing connections take local ports
    /// from [`FLOW_PORTS`] only (`net.ipv4.ip_local_port_range`, per namespace), and each of
    /// those ports is an `htb` class of its own — u32 filters by source port on the host's
    /// `eth0`, by destination port on the bridge's port towards it. Any other traffic (the
    /// host's own listeners, ARP) is not shaped. Two connections never share a class: a port
    /// is one connection's at a time. Replaces [`Testbed::limit_rate`] on that link.
    ///
    /// # Panics
    ///
    /// If `tc` or the kernel refuse (root is needed).
    pub fn limit_rate_per_flow(&self, host: &Host, rate: &str) {
        let (first, last) = (FLOW_PORTS.start(), FLOW_PORTS.end());
        // /proc/sys/net is the namespace of the thread that opens it. A port a closed
        // connection left in TIME_WAIT may serve a new one (timestamps tell them apart): the
        // range is small.
        host.enter(|| {
            std::fs::write(
                "/proc/sys/net/ipv4/ip_local_port_range",
                format!("{first} {last}"),
            )?;
            std::fs::write("/proc/sys/net/ipv4/tcp_tw_reuse", "1")
        })
        .unwrap_or_else(|e| panic!("cannot set the local port range of {}: {e}", host.ns.name));
        let port = format!("p{}", host.index);
        for (ns, dev, field) in [
            (&host.ns, "eth0", "sport"),
            (&self.switch, port.as_str(), "dport"),
        ] {
            // Unclassified traffic (minor 0 names no class) leaves unshaped.
            let mut batch =
                format!("qdisc replace dev {dev} root handle 1: htb default 0 r2q 1000\n");
            for (k, local) in FLOW_PORTS.enumerate() {
                let class = format!("1:{:x}", k + 1);
                // A burst of a few 64 KiB GSO packets, as in `limit_rate`.
                batch.push_str(&format!(
                    "class replace dev {dev} parent 1: classid {class} htb rate {rate} ceil \
                     {rate} burst 256k cburst 256k\n\
                     filter add dev {dev} parent 1: protocol ip prio 1 u32 match ip {field} \
                     {local} 0xffff flowid {class}\n"
                ));
            }
            ns.run_batch(&["tc", "-batch", "-"], &batch);
        }
    }
}

/// The local ports of a host's outgoing connections under [`Testbed::limit_rate_per_flow`]:
/// at most 256 connections at a time (ports in TIME_WAIT are reused for new ones).
pub const FLOW_PORTS: std::ops::RangeInclusive<u16> = 40_000..=40_255;

impl Host {
    /// This host's address.
    pub fn ip(&self) -> IpAddr {
        let last = u8::try_from(self.index + 1).expect("at most 254 hosts");
        IpAddr::V4(Ipv4Addr::new(10, 201, 0, last))
    }

    /// This host's address with `port`.
    pub fn addr(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.ip(), port)
    }

    /// Runs `f` on a new thread inside this host's namespace and returns what it returns (a
    /// panic in `f` is this caller's panic). Threads `f` starts are inside too, and stay
    /// there after it returns.
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|scope| {
            let thread = scope.spawn(|| {
                self.ns.join_this_thread();
                f()
            });
            thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// Moves the calling thread into this host for good: every thread and child process it
    /// starts afterwards is inside too (a benchmark's main thread, before it starts anything).
    pub fn join_current_thread(&self) {
        self.ns.join_this_thread();
    }

    /// A path to this host's namespace that other processes can open (`nsenter --net=`).
    pub fn namespace_path(&self) -> String {
        self.ns.path()
    }

    /// `program` as a child process inside this host's namespace.
    pub fn command(&self, program: &str) -> Command {
        self.ns.command(program)
    }

    /// Runs `args` inside this host; panics with its output if it fails.
    pub fn run(&self, args: &[&str]) {
        self.ns.run(args);
    }

    /// Takes `eth0` down (`up == false`) or back up.
    pub fn set_link(&self, up: bool) {
        self.run(&["ip", "link", "set", "eth0", if up { "up" } else { "down" }]);
    }

    /// Drops every TCP packet this host sends or receives, silently. Replaces earlier faults.
    pub fn black_hole(&self) {
        self.faults("meta l4proto tcp drop", "meta l4proto tcp drop");
    }

    /// Answers every TCP packet that arrives with a reset (nftables `reject with tcp reset`),
    /// so the sending side sees its connection reset. Replaces earlier faults.
    pub fn reset_arrivals(&self) {
        self.faults(
            "meta l4proto tcp tcp flags & rst == 0 reject with tcp reset",
            "accept",
        );
    }

    /// Removes this host's faults.
    pub fn clear_faults(&self) {
        let _ = self
            .command("nft")
            .args(["delete", "table", "inet", "twfault"])
            .stderr(Stdio::null())
            .status();
    }

    /// Loads a `twfault` table whose input chain ends in `input` and output chain in `output`.
    fn faults(&self, input: &str, output: &str) {
        self.clear_faults();
        self.ns.load_nft(&format!(
            "table inet twfault {{\n\
             \x20 chain input {{ type filter hook input priority 0; policy accept; {input}; }}\n\
             \x20 chain output {{ type filter hook output priority 0; policy accept; {output}; }}\n\
             }}\n"
        ));
    }
}

/// A network namespace held by a file descriptor of this process.
struct Namespace {
    name: String,
    fd: File,
}

impl Namespace {
    /// A new, empty network namespace (made on a throw-away thread, which leaves it).
    fn new(name: &str) -> Self {
        let fd = std::thread::spawn(|| {
            // SAFETY: unshare(2) takes no pointers; CLONE_NEWNET moves only this thread (which
            // ends right after) into a new namespace.
            let made = unsafe { libc::unshare(libc::CLONE_NEWNET) };
            if made != 0 {
                return Err(std::io::Error::last_os_error());
            }
            File::open("/proc/thread-self/ns/net")
        })
        .join()
        .expect("the namespace thread does not panic")
        .unwrap_or_else(|e| panic!("cannot make a network namespace (root is needed): {e}"));
        Self {
            name: name.to_owned(),
            fd,
        }
    }

    /// A path to this namespace that other processes (`ip`, `nsenter`) can open.
    fn path(&self) -> String {
        format!("/proc/{}/fd/{}", std::process::id(), self.fd.as_raw_fd())
    }

    fn join_this_thread(&self) {
        // SAFETY: setns(2) takes a descriptor this namespace keeps open for its life; it moves
        // only the calling thread.
        let joined = unsafe { libc::setns(self.fd.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(
            joined,
            0,
            "cannot enter namespace {}: {}",
            self.name,
            std::io::Error::last_os_error()
        );
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net={}", self.path()))
            .arg("--")
            .arg(program);
        command
    }

    /// Loads `ruleset` with `nft -f -`; panics with nft's complaint if it is refused.
    fn load_nft(&self, ruleset: &str) {
        let mut child = self
            .command("nft")
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("nft starts (install nftables)");
        child
            .stdin
            .take()
            .expect("a pipe")
            .write_all(ruleset.as_bytes())
            .expect("nft reads the ruleset");
        let output = child.wait_with_output().expect("nft runs");
        assert!(
            output.status.success(),
            "nft refused {ruleset}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Runs `args` with `input` on its standard input; panics with its output if it fails.
    fn run_batch(&self, args: &[&str], input: &str) {
        let mut child = self
            .command(args[0])
            .args(&args[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {args:?} in {}: {e}", self.name));
        child
            .stdin
            .take()
            .expect("a pipe")
            .write_all(input.as_bytes())
            .expect("the command reads its input");
        let output = child.wait_with_output().expect("the command runs");
        assert!(
            output.status.success(),
            "{args:?} in {} refused its input: {}",
            self.name,
            String::from_utf8_lossy(&output.stderr)
        );
    }

    fn run(&self, args: &[&str]) {
        let output = self
            .command(args[0])
            .args(&args[1..])
            .output()
            .unwrap_or_else(|e| panic!("cannot run {args:?} in {}: {e}", self.name));
        assert!(
            output.status.success(),
            "{args:?} in {} failed: {}",
            self.name,
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// Fails loudly when a tool the test bed needs is missing (CI installs them).
fn require_tools() {
    for tool in ["ip", "nsenter", "nft", "tc"] {
        let found = Command::new(tool)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        assert!(
            found,
            "the network test bed needs `{tool}` (Debian: iproute2, util-linux, nftables); \
             scripts/install-deps installs them"
        );
    }
}
