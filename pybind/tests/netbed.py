"""A test bed of hosts for pytest: network namespaces joined by a bridge, with faults.

The same shape as the Rust harness (`netbed/src/lib.rs`): a switch namespace with a bridge,
and hosts whose `eth0` is at `10.201.0.(i + 1)/24`. The namespaces are unnamed and held by
file descriptors of this process, so nothing outlives it, also when a test fails or pytest
is killed. Programs run inside a host through `nsenter`. Needs root, iproute2, nftables and ethtool.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import threading
from collections.abc import Sequence

CLONE_NEWNET = 0x40000000


class Namespace:
    """A new network namespace, held by a descriptor of this process."""

    def __init__(self, name: str) -> None:
        self.name = name
        made: list[int] = []
        failed: list[str] = []

        def unshare() -> None:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(CLONE_NEWNET) != 0:
                failed.append(os.strerror(ctypes.get_errno()))
                return
            made.append(os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC))

        # The thread that unshares ends right after: only its descriptor stays inside.
        thread = threading.Thread(target=unshare)
        thread.start()
        thread.join()
        if failed:
            raise RuntimeError(f"cannot make a network namespace (root is needed): {failed[0]}")
        self.fd = made[0]

    @property
    def path(self) -> str:
        return f"/proc/{os.getpid()}/fd/{self.fd}"

    def argv(self, args: Sequence[str]) -> list[str]:
        return ["nsenter", f"--net={self.path}", "--", *args]

    def run(self, *args: str, stdin: str | None = None) -> None:
        out = subprocess.run(
            self.argv(args), input=stdin, capture_output=True, text=True, timeout=30
        )
        if out.returncode != 0:
            raise RuntimeError(f"{list(args)} in {self.name} failed: {out.stderr.strip()}")

    def close(self) -> None:
        os.close(self.fd)


class Host(Namespace):
    """A host of the bed: `eth0` at `ip`, loopback up."""

    def __init__(self, index: int) -> None:
        super().__init__(f"host{index}")
        self.index = index
        self.ip = f"10.201.0.{index + 1}"

    def popen(self, args: Sequence[str], **kwargs: object) -> subprocess.Popen[str]:
        """`args` as a child process inside this host."""
        return subprocess.Popen(self.argv(args), text=True, **kwargs)  # type: ignore[call-overload, no-any-return]


class NetBed:
    """A switch and `hosts` hosts; a context manager that removes everything on exit."""

    def __init__(self, hosts: int) -> None:
        for tool in ("ip", "nsenter", "nft", "ethtool"):
            if shutil.which(tool) is None:
                raise RuntimeError(
                    f"the network test bed needs `{tool}` (Debian: iproute2, util-linux, "
                    "nftables, ethtool); scripts/install-deps installs them"
                )
        self.switch = Namespace("switch")
        self.hosts: list[Host] = []
        try:
            self.switch.run("ip", "link", "set", "lo", "up")
            self.switch.run("ip", "link", "add", "br0", "type", "bridge")
            self.switch.run("ip", "link", "set", "br0", "up")
            for index in range(hosts):
                host = Host(index)
                self.hosts.append(host)
                port = f"p{index}"
                self.switch.run(
                    "ip",
                    "link",
                    "add",
                    port,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    host.path,
                )
                self.switch.run("ip", "link", "set", port, "master", "br0", "up")
                host.run("ip", "addr", "add", f"{host.ip}/24", "dev", "eth0")
                host.run("ip", "link", "set", "eth0", "up")
                host.run("ip", "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def drop_randomly(self, host: int, per_mille: int) -> None:
        """Drops `per_mille` of every thousand frames on host `host`'s link, both ways, at
        random (nftables on the bridge). Segmentation offload goes off on every host first, so
        each frame is one packet on a wire: a veth otherwise carries 64 KiB GSO packets whole."""
        for each in self.hosts:
            each.run("ethtool", "-K", "eth0", "tso", "off", "gso", "off")
        port, rule = f"p{host}", f"numgen random mod 1000 < {per_mille} drop"
        self.switch.run(
            "nft",
            "-f",
            "-",
            stdin=(
                f"table bridge twloss{host} {{\n"
                "  chain forward { type filter hook forward priority 0; policy accept;\n"
                f'    iifname "{port}" {rule}; oifname "{port}" {rule}; }}\n'
                "}\n"
            ),
        )

    def __enter__(self) -> NetBed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for host in self.hosts:
            host.close()
        self.hosts.clear()
        self.switch.close()
