"""A message over a size limit is LimitExceeded on every path, whichever side's limit it was,
naming that side and the variable; limits smaller than an error text still get an answer."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import tensorwire as tw

PATHS = ["raw", "shm", "http2"]
METADATA = "PULSING_MAX_TENSOR_METADATA_BYTES"


def small_node(monkeypatch: pytest.MonkeyPatch, **limits: str) -> tw.Node:
    """A node whose limits (read from the environment when it starts) are ``limits``."""
    with monkeypatch.context() as env:
        for variable, value in limits.items():
            env.setenv(variable, value)
        return tw.Node()


@pytest.fixture
def nodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[tw.Node, tw.Node]]:
    """A node with a 1 KiB metadata limit and one with the defaults, both serving ``echo`` and
    ``big`` (a reply with as many metadata bytes as the request's metadata says)."""
    with small_node(monkeypatch, **{METADATA: "1024"}) as small, tw.Node() as large:
        for node in (small, large):
            node.serve("echo", lambda m: m)
            node.serve("big", lambda m: tw.TensorMessage(b"m" * int(bytes(m.metadata)), []))
        yield small, large


@pytest.mark.parametrize("path", PATHS)
def test_a_request_over_the_receivers_limit_is_limit_exceeded_naming_the_peer(
    nodes: tuple[tw.Node, tw.Node], path: str
) -> None:
    small, large = nodes
    ref = large.ref(small.address, "echo", transport=path)
    for send in (ref.ask, ref.tell):
        with pytest.raises(tw.LimitExceeded) as info:
            send(tw.TensorMessage(b"x" * 5000, []), timeout=10)
        assert (info.value.side, info.value.variable) == ("peer", METADATA)
        assert "over the peer's limit" in str(info.value) and "5000" in str(info.value)


@pytest.mark.parametrize("path", PATHS)
def test_a_request_over_the_senders_limit_is_limit_exceeded_naming_this_node(
    nodes: tuple[tw.Node, tw.Node], path: str
) -> None:
    small, large = nodes
    with pytest.raises(tw.LimitExceeded) as info:
        small.ref(large.address, "echo", transport=path).ask(tw.TensorMessage(b"x" * 5000, []))
    assert (info.value.side, info.value.variable) == ("local", METADATA)
    assert "over this node's limit" in str(info.value)


@pytest.mark.parametrize("path", PATHS)
def test_a_reply_over_either_sides_limit_is_limit_exceeded_naming_that_side(
    nodes: tuple[tw.Node, tw.Node], path: str
) -> None:
    small, large = nodes
    # The replier's own limit refuses to send it.
    with pytest.raises(tw.LimitExceeded) as info:
        large.ref(small.address, "big", transport=path).ask(tw.TensorMessage(b"5000", []))
    assert (info.value.side, info.value.variable) == ("peer", METADATA)
    # The asker's limit refuses to receive it.
    with pytest.raises(tw.LimitExceeded) as info:
        small.ref(large.address, "big", transport=path).ask(tw.TensorMessage(b"5000", []))
    assert (info.value.side, info.value.variable) == ("local", METADATA)


@pytest.mark.parametrize("path", PATHS)
def test_limits_smaller_than_the_error_text_still_answer_and_the_next_request_goes_through(
    monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    tiny = {
        METADATA: "200",
        "PULSING_MAX_TENSOR_WIRE_BYTES": "100",
        "PULSING_MAX_TENSOR_BUFFERS": "2",
    }
    with small_node(monkeypatch, **tiny) as small, tw.Node() as large:
        small.serve("echo", lambda m: m)
        ref = large.ref(small.address, "echo", transport=path)
        for _ in range(10):
            with pytest.raises(tw.LimitExceeded, match="over the peer's limit"):
                ref.ask(tw.TensorMessage(b"m" * 1000, []), timeout=10)
            with pytest.raises(tw.LimitExceeded, match="buffer count is 3"):
                ref.tell(tw.TensorMessage(b"", [b"a", b"b", b"c"]), timeout=10)
            # A refused request leaves nothing behind that fails the next one.
            reply = ref.ask(tw.TensorMessage(b"ok", [np.zeros(8, np.uint8)]), timeout=10)
            assert isinstance(reply, tw.TensorMessage) and reply.metadata == b"ok"


def test_a_handler_that_quotes_a_limit_is_still_a_remote_error(node: tw.Node) -> None:
    def quoting(message: tw.TensorMessage) -> None:
        raise ValueError("buffer count is 3, over the limit of 2 (PULSING_MAX_TENSOR_BUFFERS)")

    with tw.Node() as server:
        server.serve("quoting", quoting)
        for path in PATHS:
            with pytest.raises(tw.RemoteError) as info:
                node.ref(server.address, "quoting", transport=path).ask(tw.TensorMessage(b"", []))
            assert not isinstance(info.value, tw.LimitExceeded), path


@pytest.mark.parametrize("path", PATHS)
def test_an_unknown_endpoint_is_unknown_endpoint_on_every_path(node: tw.Node, path: str) -> None:
    with tw.Node() as server, pytest.raises(tw.UnknownEndpoint, match="no endpoint at path"):
        node.ref(server.address, "nobody", transport=path).ask(tw.TensorMessage(b"", []))
