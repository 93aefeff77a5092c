"""Shared memory is safe for the people it is for: a received tensor never changes however
long it is held, a node that requires TLS or client certificates keeps that rule on every
path, and a process of another user squatting on the way is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import tensorwire as tw
from pki import make_pki

HOLD_SECONDS = float(os.environ.get("TENSORWIRE_HOLD_SECONDS", "75"))

SENDER = textwrap.dedent(
    """
    import sys, time, numpy as np, tensorwire as tw
    address, seconds = sys.argv[1], float(sys.argv[2])
    with tw.Node() as node:
        ref = node.ref(address, "inbox")
        ref.tell(tw.TensorMessage(b"held", [np.full(1 << 20, 0xAB, np.uint8)]))
        print(ref.route().path, flush=True)
        end, sent = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            ref.tell(tw.TensorMessage(b"churn", [np.full(1 << 20, sent % 251, np.uint8)]))
            sent += 1
            time.sleep(0.02)
        print(f"sent {sent}", flush=True)
        sys.stdin.readline()
    """
)


def test_a_buffer_held_past_any_hold_limit_never_changes_while_the_sender_goes_on() -> None:
    with tw.Node() as receiver:
        inbox = receiver.endpoint("inbox", capacity=1024)
        with subprocess.Popen(
            [sys.executable, "-c", SENDER, receiver.address, str(HOLD_SECONDS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        ) as sender:
            assert sender.stdin is not None and sender.stdout is not None
            first = inbox.recv(timeout=30)
            assert first is not None and first.message.metadata == b"held"
            held = np.frombuffer(first.message.buffers[0], np.uint8)
            del first
            assert sender.stdout.readline().strip() == "shm", "the default route is shared memory"
            churned = 0
            end = time.monotonic() + HOLD_SECONDS
            while time.monotonic() < end:
                request = inbox.recv(timeout=1)
                if request is not None:
                    churned += 1  # dropped at once: its slot goes back and is reused
                assert held[0] == 0xAB and held[-1] == 0xAB
            assert np.all(held == 0xAB), "every byte of the held buffer is what was sent"
            assert churned > 100, f"the sender kept sending meanwhile ({churned})"
            assert sender.stdout.readline().startswith("sent")
            sender.stdin.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return make_pki(tmp_path_factory.mktemp("pki"))


SERVER = textwrap.dedent(
    """
    # An mTLS node in a process of its own: prints its address, then one line per request
    # that reaches its handler (metadata, credentials, identity), until stdin closes.
    import json, sys, threading, tensorwire as tw
    cert, key, ca, shared_memory = sys.argv[1:5]
    with tw.Node(cert=cert, key=key, ca=ca, require_client_cert=True,
                 shared_memory=True if shared_memory == "auto" else shared_memory) as node:
        inbox = node.endpoint("inbox")
        def serve():
            while True:
                try:
                    r = inbox.recv()
                except tw.ShutDown:
                    return
                print(json.dumps([bytes(r.message.metadata).decode(), r.credentials,
                                  r.identity is not None]), flush=True)
        threading.Thread(target=serve, daemon=True).start()
        print(node.address, flush=True)
        sys.stdin.readline()
    """
)


def _mtls_server(pki, shared_memory: str) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    return subprocess.Popen(
        [sys.executable, "-c", SERVER, pki.server_cert, pki.server_key, pki.ca, shared_memory],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_an_mtls_node_is_not_reachable_over_shared_memory_without_a_certificate(pki) -> None:  # type: ignore[no-untyped-def]
    with _mtls_server(pki, "auto") as server:
        assert server.stdin is not None and server.stdout is not None
        address = server.stdout.readline().strip()
        with tw.Node() as anonymous:
            for transport in ("auto", "shm"):
                ref = anonymous.ref(address, "inbox", transport=transport)
                route = ref.route()
                assert route.path != "shm", route
                assert "requires TLS" in route.reason, route.reason
                with pytest.raises(tw.Error):
                    ref.tell(tw.TensorMessage(b"sneak", []), timeout=5)
        # With a certificate it goes over TLS, and the handler sees who sent it.
        with tw.Node(cert=pki.client_cert, key=pki.client_key, ca=pki.ca) as client:
            ref = client.ref(address, "inbox")
            assert ref.route().path == "http2"
            ref.tell(tw.TensorMessage(b"signed", []))
        assert json.loads(server.stdout.readline()) == ["signed", None, True], "nothing else got in"
        server.stdin.close()


def test_an_mtls_node_that_allows_same_user_peers_shows_their_uid_and_pid(pki) -> None:  # type: ignore[no-untyped-def]
    with _mtls_server(pki, "same-user") as server:
        assert server.stdin is not None and server.stdout is not None
        address = server.stdout.readline().strip()
        with tw.Node() as peer:
            ref = peer.ref(address, "inbox", transport="shm")
            assert ref.route().path == "shm", ref.route()
            ref.tell(tw.TensorMessage(b"local", [np.arange(100, dtype=np.uint8)]))
        assert json.loads(server.stdout.readline()) == ["local", [os.getuid(), os.getpid()], False]
        server.stdin.close()


SQUATTER = textwrap.dedent(
    """
    # Pretends to be a node of the victim's user: answers the knock on TCP with its own
    # shared-memory socket, claiming the victim's uid. Reports what reached its socket.
    import os, socket, struct, sys, select
    victim_uid = int(sys.argv[1])
    tcp = socket.socket(); tcp.bind(("127.0.0.1", 0)); tcp.listen()
    name = f"tensorwire/{victim_uid}/squatter-{os.getpid()}"
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    unix.bind("\\0" + name); unix.listen()
    print(tcp.getsockname()[1], flush=True)
    boot = open("/proc/sys/kernel/random/boot_id").read().strip().encode()
    conns, hellos = 0, 0
    while True:
        ready, _, _ = select.select([tcp, unix, sys.stdin], [], [])
        if sys.stdin in ready:
            break
        if tcp in ready:
            c, _ = tcp.accept()
            if c.recv(4) == b"TWSK":
                reply = b"TWSK\\x03\\x00" + struct.pack("<II", os.getpid(), victim_uid)
                reply += bytes([len(boot)]) + boot + bytes([len(name)]) + name.encode()
                reply += struct.pack("<Q", 7) + b"s" * 16
                c.sendall(reply)
            c.close()
        if unix in ready:
            u, _ = unix.accept()
            conns += 1
            u.settimeout(1)
            try:
                if u.recv(65536):
                    hellos += 1
            except OSError:
                pass
    print(f"connections {conns} hellos {hellos}", flush=True)
    """
)


def test_a_squatter_of_another_user_is_refused_and_the_send_stays_on_tcp() -> None:
    if os.geteuid() != 0:
        pytest.skip("running a squatter as another user needs root (CI runs as root)")
    with subprocess.Popen(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            sys.executable,
            "-c",
            SQUATTER,
            str(os.getuid()),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as squatter:
        assert squatter.stdin is not None and squatter.stdout is not None
        port = int(squatter.stdout.readline())
        with tw.Node() as client:
            route = client.ref(f"127.0.0.1:{port}", "inbox").route()
            assert route.path == "raw", route
            assert "uid 65534" in route.reason and "refused" in route.reason, route.reason
            assert client.stats()["shm"]["connections"] == 0
        squatter.stdin.close()
        out = squatter.stdout.read()
    assert "hellos 0" in out, f"no hello (and no descriptor) ever went to the squatter: {out}"
