"""Two Ray actors hand numpy arrays to each other through tensorwire; Ray stays the scheduler.

    pip install 'tensorwire[ray]'          # or: scripts/python-env (tensorwire and Ray in .venv)
    python examples/python/ray_actors.py [--mib 64] [--steps 5] [--transport auto|raw|shm]

The producer returns a dict of arrays from a ``tensor_transport="tensorwire"`` method (and
one array it fills in place in a tensorwire shared-memory slot); the consumer receives them as
read-only zero-copy views and answers with checksums, which the driver checks. At the end
each side prints which path its fetches took.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import ray

import tensorwire.ray as twr


@ray.remote(enable_tensor_transport=True)
class Producer:
    @ray.method(tensor_transport="tensorwire")
    def weights(self, mib: int, step: int) -> dict[str, np.ndarray]:
        n = mib * (1 << 20) // 4
        return {
            "w": np.full(n, step, dtype=np.float32),
            "b": np.arange(1024, dtype=np.float32) + step,
        }

    @ray.method(tensor_transport="tensorwire")
    def filled_in_place(self, mib: int, step: int) -> np.ndarray:
        array = twr.empty(mib * (1 << 20) // 4, np.float32)  # a shared-memory slot
        array.fill(step)  # written once, where the consumer will map it: no copy
        return array


# Consumers need enable_tensor_transport=True too: Ray fetches beside the running task.
@ray.remote(enable_tensor_transport=True)
class Consumer:
    def checksum(self, arrays: dict[str, np.ndarray] | np.ndarray) -> float:
        if isinstance(arrays, np.ndarray):
            arrays = {"x": arrays}
        return float(sum(a.sum(dtype=np.float64) for a in arrays.values()))

    def stats(self) -> dict[str, int]:
        return {k: v for k, v in twr.stats().items() if k.startswith("fetched_")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--transport", default=None, help="auto (default), raw, shm, http2")
    args = parser.parse_args()

    twr.register(transport=args.transport)  # before the actors are created
    ray.init(num_cpus=2, include_dashboard=False)
    producer, consumer = Producer.remote(), Consumer.remote()
    n = args.mib * (1 << 20) // 4
    for step in range(args.steps):
        started = time.perf_counter()
        got = ray.get(consumer.checksum.remote(producer.weights.remote(args.mib, step)))
        expected = float(step) * n + float((np.arange(1024) + step).sum())
        assert got == expected, (got, expected)
        in_place = ray.get(
            consumer.checksum.remote(producer.filled_in_place.remote(args.mib, step))
        )
        assert in_place == float(step) * n, in_place
        print(f"step {step}: {2 * args.mib} MiB checked in {time.perf_counter() - started:.3f} s")
    # ray.put works too; ray.get in the driver fetches like any consumer.
    ref = ray.put(np.ones(1000), _tensor_transport="tensorwire")
    assert ray.get(consumer.checksum.remote(ref)) == 1000.0
    print("the consumer's fetches, by path:", ray.get(consumer.stats.remote()))
    ray.shutdown()


if __name__ == "__main__":
    main()
