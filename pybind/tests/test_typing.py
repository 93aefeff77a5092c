"""What an ask returns is typed: mypy checks code that uses a reply (``Ref[Answer]``, or
``Ref[Any]`` with ``pickle=True``), and ``tensors.unpack`` returns the sender's ``extra``."""

from __future__ import annotations

from pathlib import Path

from helpers import need

USER_CODE = """
import tensorwire as tw
from tensorwire import tensors

node = tw.Node()
ref = node.ref("127.0.0.1:1", "echo")
reply = ref.ask(tw.TensorMessage(b"", []))
reveal_type(reply)
print(reply.buffers)
if isinstance(reply, tw.TensorMessage):
    reveal_type(tensors.unpack(reply).extra)
pickled = node.ref("127.0.0.1:1", "echo", pickle=True)
reveal_type(pickled.ask(tw.TensorMessage(b"", [])))
"""


def test_mypy_checks_what_user_code_does_with_a_reply(tmp_path: Path) -> None:
    api = need("mypy.api")
    (tmp_path / "user.py").write_text(USER_CODE)
    out, err, _ = api.run(
        [
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(tmp_path / "user.py"),
        ]
    )
    notes = [line.split(": ", 2)[-1] for line in out.splitlines()]
    answer = '"tensorwire._native.TensorMessage | bytes | tuple[str, bytes] | None"'
    assert f"Revealed type is {answer}" in notes, out + err
    # Using the reply as a TensorMessage without checking is caught.
    assert any('Item "bytes" of' in n and 'has no attribute "buffers"' in n for n in notes), out
    assert 'Revealed type is "Any"' in notes, out  # extra, and pickled replies: any object
    assert len([n for n in notes if n.startswith("Revealed")]) == 3, out
