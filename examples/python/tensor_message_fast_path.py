"""The seed's example: two nodes in one process, the remote one reached over TCP (or HTTP/2),
a float32 buffer out, a small ack back.

    python examples/python/tensor_message_fast_path.py [--transport raw|http2|auto]
"""

from __future__ import annotations

import argparse

import numpy as np

import tensorwire as tw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", default="raw", choices=["raw", "http2", "auto"])
    parser.add_argument("--size", type=int, default=1 << 20, help="float32 elements")
    args = parser.parse_args()

    with tw.Node() as client, tw.Node() as server:

        def receive(msg: tw.TensorMessage) -> bytes:
            x = np.frombuffer(msg.buffers[0], dtype=np.float32)
            return f"ack {x.size} floats, sum {float(x.sum(dtype=np.float64)):.1f}".encode()

        server.serve("tensor_sink", receive)
        ref = client.ref(server.address, "tensor_sink", transport=args.transport)
        x = np.arange(args.size, dtype=np.float32)
        reply = ref.ask(tw.TensorMessage(b'{"dtype":"float32"}', [x]))
        route = ref.route()
        print(f"{reply.decode()} over {route.path} ({route.reason})")
        stats = tw.tensor_transport_stats()
        print({k: v for k, v in stats.items() if v})


if __name__ == "__main__":
    main()
