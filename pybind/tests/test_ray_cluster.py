"""Two Ray nodes (two raylets on this machine, ``ray.cluster_utils.Cluster``) exchange arrays
through tensorwire over PTR1."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

if os.environ.get("TENSORWIRE_REQUIRE_RAY"):  # scripts/test-all: Ray must be there
    import ray
else:
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'tensorwire[ray]'")

import tensorwire.ray as twr  # noqa: E402

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    twr.register()
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": {"first": 1}, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=1, resources={"second": 1})
    ray.init(
        address=cluster.address,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": HERE, "TENSORWIRE_RAY_TRANSPORT": "raw"}},
    )
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_arrays_cross_between_two_raylets_over_ptr1(two_nodes: Any) -> None:
    from ray_actors import Consumer, Producer

    producer = Producer.options(resources={"first": 0.01}).remote()
    consumer = Consumer.options(resources={"second": 0.01}).remote()
    assert ray.get(producer.node_id.remote()) != ray.get(consumer.node_id.remote())
    for nbytes, count in [(1, 1), (4096, 16), (MiB, 1), (64 * MiB, 1)]:
        seen = ray.get(consumer.check.remote(producer.make.remote(nbytes, count), nbytes, count))
        assert seen["intact"] and seen["writable"] == [True] * count
    stats = ray.get(consumer.stats.remote())
    assert stats["fetched_raw"] == 4 and stats.get("fetched_shm", 0) == 0
