"""tensorwire as a Ray Direct Transport, with a real local Ray (2 CPUs, no dashboard)."""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

if os.environ.get("TENSORWIRE_REQUIRE_RAY"):  # scripts/test-all: Ray must be there
    import ray
else:
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'tensorwire[ray]'")

import tensorwire as tw  # noqa: E402
import tensorwire.ray as twr  # noqa: E402
from helpers import need  # noqa: E402

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    twr.register()
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": HERE}},
    )
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def pair(cluster: None) -> tuple[Any, Any]:
    from ray_actors import Consumer, Producer

    return Producer.remote(), Consumer.remote()


def fetched(consumer: Any, route: str) -> int:
    return int(ray.get(consumer.stats.remote()).get(f"fetched_{route}", 0))


@pytest.mark.parametrize("count", [1, 16])
@pytest.mark.parametrize("nbytes", [1, 4096, MiB, 64 * MiB], ids=["1B", "4KiB", "1MiB", "64MiB"])
def test_arrays_arrive_intact_over_shared_memory(
    pair: tuple[Any, Any], nbytes: int, count: int
) -> None:
    producer, consumer = pair
    before = fetched(consumer, "shm")
    ref = producer.make.remote(nbytes, count)
    seen = ray.get(consumer.check.remote(ref, nbytes, count))
    assert seen["intact"] and seen["count"] == count
    # Shared memory the producer's node lent: read-only views, no copy in the consumer.
    assert seen["writable"] == [False] * count
    assert fetched(consumer, "shm") == before + 1


def test_cpu_torch_tensors_travel_over_the_torch_transport(pair: tuple[Any, Any]) -> None:
    need("torch")
    producer, consumer = pair
    before = fetched(consumer, "shm")
    seen = ray.get(consumer.check_torch.remote(producer.make_torch.remote(MiB // 4), MiB // 4))
    assert seen == {
        "types": ["Tensor", "Tensor"],
        "dtypes": ["torch.float32", "torch.bfloat16"],
        "intact": True,
        "writable": [True, True],
    }
    assert fetched(consumer, "shm") == before + 1


def test_ray_put_in_the_driver_and_ray_get_in_the_driver(pair: tuple[Any, Any]) -> None:
    from ray_actors import pattern

    producer, consumer = pair
    array = pattern(MiB, 5)
    ref = ray.put(array, _tensor_transport="tensorwire")
    assert ray.get(consumer.get.remote([ref], MiB))
    (from_actor,) = ray.get(producer.put.remote(MiB))
    back = ray.get(from_actor)
    assert np.array_equal(back, array) and not back.flags.writeable
    assert twr.stats()["fetched_shm"] >= 1


def test_a_plain_ray_task_fetches_after_registering_from_the_metadata(
    pair: tuple[Any, Any],
) -> None:
    import uuid

    from ray_actors import pattern
    from ray_plain_task import fetch_in_a_task

    ref = ray.put(pattern(4096, 5), _tensor_transport="tensorwire")
    # A runtime_env of its own: a fresh worker, which never imported tensorwire.
    fresh = {"env_vars": {"PYTHONPATH": HERE, "FRESH_WORKER": uuid.uuid4().hex}}
    seen = ray.get(fetch_in_a_task.options(runtime_env=fresh).remote([ref], 4096), timeout=120)
    assert seen == {"registered": True, "intact": True}


def test_arrays_from_empty_travel_without_a_copy_and_never_change(pair: tuple[Any, Any]) -> None:
    from ray_actors import pattern

    producer, consumer = pair
    before = ray.get(producer.stats.remote())["process"]
    ref = producer.make_loaned.remote(64 * MiB)
    ray.get(producer.scribble.remote())  # after Ray holds it: goes to a private copy
    seen = ray.get(consumer.check.remote(ref, 64 * MiB, 1, 3))
    after = ray.get(producer.stats.remote())["process"]
    assert seen["intact"], "the consumer saw the producer's later writes, or wrong bytes"
    assert after["shm_bytes_copied"] == before["shm_bytes_copied"]
    assert after["shm_zero_copy_buffers"] >= before["shm_zero_copy_buffers"] + 1
    assert np.array_equal(ray.get(ref), pattern(64 * MiB, 3))


def test_an_empty_array_returned_again_carries_its_new_bytes(pair: tuple[Any, Any]) -> None:
    producer, consumer = pair
    first = producer.make_loaned.remote(MiB)
    second = producer.again.remote(7)  # the same array, rewritten, returned again
    assert ray.get(consumer.check.remote(second, MiB, 1, 7))["intact"]
    assert ray.get(consumer.check.remote(first, MiB, 1, 3))["intact"]


def test_ptr1_when_the_consumer_prefers_it(cluster: None) -> None:
    from ray_actors import Consumer, Producer

    env = {"env_vars": {"PYTHONPATH": HERE, "TENSORWIRE_RAY_TRANSPORT": "raw"}}
    producer = Producer.remote()
    consumer = Consumer.options(runtime_env=env).remote()
    for nbytes, count in [(4096, 16), (64 * MiB, 1)]:
        seen = ray.get(consumer.check.remote(producer.make.remote(nbytes, count), nbytes, count))
        assert seen["intact"]
        assert seen["writable"] == [True] * count  # this process's own receive memory
    assert fetched(consumer, "raw") == 2 and fetched(consumer, "shm") == 0


def test_the_producer_lets_go_when_the_ref_goes_out_of_scope(cluster: None) -> None:
    from ray_actors import Consumer, Producer, wait_for

    producer, consumer = Producer.remote(), Consumer.remote()
    idle = ray.get(producer.stats.remote())
    ref = producer.make_one.remote(256 * MiB)
    assert ray.get(consumer.check.remote(ref, 256 * MiB, 1))["intact"]
    held = ray.get(producer.stats.remote())
    assert held["objects_held"] == 1 and held["bytes_held"] == 256 * MiB
    del ref
    assert wait_for(lambda: ray.get(producer.stats.remote())["objects_held"] == 0, 30)
    freed = ray.get(producer.stats.remote())
    assert freed["bytes_held"] == 0
    assert freed["rss"] < held["rss"] - 200 * MiB, (idle["rss"], held["rss"], freed["rss"])


def test_the_consumers_peak_rss_for_a_256_mib_array_is_about_the_array(cluster: None) -> None:
    from ray_actors import Consumer, Producer

    producer, consumer = Producer.remote(), Consumer.remote()
    idle = ray.get(consumer.rss.remote())
    seen = ray.get(consumer.peak_rss_of.remote(producer.make_one.remote(256 * MiB)))
    assert seen["sum"] == int(_pattern_sum(256 * MiB))
    assert seen["rss"] - idle <= 1.1 * 256 * MiB, (idle, seen["rss"])


def test_a_dead_producer_is_an_error_with_the_reason_not_a_hang(cluster: None) -> None:
    from ray_actors import Consumer, Producer

    producer, consumer = Producer.remote(), Consumer.remote()
    ref = producer.make.remote(MiB, 1)
    ray.wait([ref], fetch_local=False)
    ray.get(producer.stats.remote())  # the object exists
    ray.kill(producer)
    time.sleep(0.5)
    started = time.monotonic()
    with pytest.raises(Exception) as caught:
        ray.get(consumer.check.remote(ref, MiB, 1), timeout=90)
    assert time.monotonic() - started < 90
    assert _mentions_a_reason(caught.value), caught.value


def test_killing_the_producer_mid_fetch_is_an_error_not_a_hang(cluster: None) -> None:
    from ray_actors import Consumer, Producer, wait_for

    producer, consumer = Producer.remote(), Consumer.remote()
    ref = producer.make.remote(MiB, 1)
    ray.get(producer.stall.remote())
    pending = consumer.check.remote(ref, MiB, 1)
    assert wait_for(lambda: ray.get(producer.stats.remote()).get("stalled", 0) >= 1, 30)
    ray.kill(producer)
    started = time.monotonic()
    with pytest.raises(Exception) as caught:
        ray.get(pending, timeout=90)
    assert time.monotonic() - started < 90
    assert _mentions_a_reason(caught.value), caught.value
    # The consumer survived its failed fetch.
    assert ray.get(consumer.stats.remote())["fetch_failures"] >= 1


def test_a_stalled_fetch_ends_at_its_timeout_and_both_actors_carry_on(cluster: None) -> None:
    from ray_actors import Consumer, Producer

    env = {"env_vars": {"PYTHONPATH": HERE, "TENSORWIRE_RAY_TIMEOUT": "2"}}
    producer, consumer = Producer.remote(), Consumer.options(runtime_env=env).remote()
    ref = producer.make.remote(4096, 1)
    ray.get(producer.stall.remote())
    started = time.monotonic()
    with pytest.raises(Exception) as caught:
        ray.get(consumer.check.remote(ref, 4096, 1), timeout=60)
    assert time.monotonic() - started < 30
    assert "FetchTimeout" in str(caught.value), caught.value
    ray.get(producer.unstall.remote())
    assert ray.get(consumer.check.remote(producer.make.remote(4096, 1), 4096, 1))["intact"]


def test_ray_get_of_several_refs_fetches_them_at_once(cluster: None) -> None:
    from ray_actors import Producer, pattern, wait_for

    producer = Producer.remote()
    refs = [producer.make_one.remote(MiB) for _ in range(4)]
    ray.wait(refs, num_returns=4, fetch_local=False)
    ray.get(producer.stall.remote())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        got = pool.submit(ray.get, refs)
        # All four asks are out before the first answer: they overlap.
        assert wait_for(lambda: twr.stats().get("fetches_in_flight", 0) == 4, 30), twr.stats()
        ray.get(producer.unstall.remote())
        arrays = got.result(timeout=60)
    assert all(np.array_equal(a, pattern(MiB, 0)) for a in arrays)


def test_a_consumer_actor_ray_cannot_fetch_for_gets_a_clear_error(cluster: None) -> None:
    from ray_actors import Producer

    @ray.remote
    class NoTransport:
        def take(self, array: np.ndarray) -> int:
            return int(array.size)

    producer, consumer = Producer.remote(), NoTransport.remote()
    ref = producer.make_one.remote(4096)
    ray.wait([ref], fetch_local=False)
    with pytest.raises(ValueError, match="enable_tensor_transport=True"):
        consumer.take.remote(ref)


def test_abort_cancels_a_fetch_in_flight(cluster: None) -> None:
    rt, manager, meta = _held_here("abort-me", [np.ones(8)])
    release = _stall_here(rt)
    try:
        request = manager.fetch_multiple_tensors("abort-me", meta, None)
        threading.Timer(0.2, manager.abort_transport, ("abort-me", None)).start()
        with pytest.raises(twr.FetchError, match="aborted"):
            manager.wait_fetch_complete(request, timeout=30)
        # A fetch Ray starts after the abort fails at once.
        with pytest.raises(twr.FetchError, match="aborted"):
            manager.fetch_multiple_tensors("abort-me", meta, None)
    finally:
        release()
    assert rt.stats()["fetches_aborted"] >= 1
    assert wait_for_stat(rt, "fetches_in_flight", 0)


def test_target_buffers_are_filled_in_place(cluster: None) -> None:
    arrays = [np.arange(10, dtype=np.float32), np.arange(6, dtype=np.int64).reshape(2, 3)]
    _, manager, meta = _held_here("targets", arrays)
    targets = [np.zeros(10, np.float32), np.zeros((2, 3), np.int64)]
    out = manager.recv_multiple_tensors("targets", meta, None, targets)
    assert out[0] is targets[0] and out[1] is targets[1]
    assert all(np.array_equal(a, b) for a, b in zip(targets, arrays, strict=True))
    with pytest.raises(ValueError, match="target buffer #1"):
        manager.recv_multiple_tensors("targets", meta, None, [targets[0], np.zeros(6, np.int64)])


def test_a_fetch_without_the_objects_token_gets_nothing(cluster: None) -> None:
    import json

    rt, manager, meta = _held_here("guarded", [np.ones(4)])
    refused = rt.stats().get("requests_refused", 0)

    def ask(request: Any, buffers: tuple[bytes, ...] = ()) -> Any:
        body = request if isinstance(request, bytes) else json.dumps(request).encode()
        return ref.ask(tw.TensorMessage(body, list(buffers)), timeout=10)

    with tw.Node() as stranger:
        ref = stranger.ref(rt.address, twr._runtime.ENDPOINT)
        good = {"schema": twr._runtime.SCHEMA, "object": "guarded", "token": meta.token}
        assert len(ask(good).buffers) == 1  # the right token gets the bytes
        for token in ("0" * 32, "é" * 32, meta.token[:-1]):
            with pytest.raises(tw.RemoteError, match="not held|fetch request"):
                ask({**good, "token": token})
        for bad in (b"\xff not json", b"[" * 100_000, b"{}"):
            with pytest.raises(tw.RemoteError, match="fetch request"):
                ask(bad)
        with pytest.raises(tw.RemoteError, match="fetch request"):
            ask(good, (b"unasked",))
        # Freed by Ray: the right token gets nothing either.
        manager.garbage_collect("guarded", meta, [])
        with pytest.raises(tw.RemoteError, match="not held"):
            ask(good)
    assert rt.stats()["requests_refused"] == refused + 8


def test_an_actor_whose_node_cannot_start_fails_at_the_call_with_the_reason(cluster: None) -> None:
    from ray_actors import Producer

    # 203.0.113.1 (TEST-NET-3) is no address of this host: binding it fails, nothing is sent.
    env = {"env_vars": {"PYTHONPATH": HERE, "TENSORWIRE_RAY_BIND": "203.0.113.1:0"}}
    producer = Producer.options(runtime_env=env).remote()
    with pytest.raises(ValueError, match="cannot start"):
        producer.make.remote(4096, 1)


def test_register_refuses_other_settings_once_registered(cluster: None) -> None:
    twr._runtime.runtime()  # this process's node runs (started by an earlier test, or now)
    twr.register()  # the settings it runs with: nothing to do
    with pytest.raises(ValueError, match="already runs"):
        twr.register(transport="raw")
    with pytest.raises(ValueError, match="transport="):
        twr.register(transport="carrier-pigeon")


def wait_for_stat(rt: Any, name: str, value: int) -> bool:
    from ray_actors import wait_for

    return wait_for(lambda: rt.stats().get(name) == value, 10)


def _held_here(obj_id: str, arrays: list[np.ndarray]) -> tuple[Any, Any, Any]:
    """An object held by this process's runtime, the registered manager and its metadata."""
    from ray.experimental.rdt.util import get_tensor_transport_manager

    manager = get_tensor_transport_manager("TENSORWIRE")
    meta = manager.extract_tensor_transport_metadata(obj_id, arrays)
    rt = twr._runtime.current()
    assert rt is not None
    return rt, manager, meta


def _stall_here(rt: Any) -> Any:
    release = threading.Event()
    lookup = rt.store.lookup

    def stalled(obj_id: str, token: str) -> Any:
        release.wait(30)
        return lookup(obj_id, token)

    rt.store.lookup = stalled

    def undo() -> None:
        release.set()
        rt.store.lookup = lookup

    return undo


def _pattern_sum(nbytes: int) -> int:
    from ray_actors import pattern

    return int(pattern(nbytes, 0).sum(dtype=np.uint64))


def _mentions_a_reason(error: BaseException) -> bool:
    """tensorwire's reason reached the Ray user: which fetch failed, and why."""
    text = str(error)
    return "FetchError" in text and "producing process has probably exited" in text
