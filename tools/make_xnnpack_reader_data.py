"""Write tests/data/xnnpack_reader/: the seed `.pte` files of the XNNPACK reader's fuzz test and the
reproducers of what fuzzing found (issue 38, items 5 and 8).

Run from the repository root with the test extra: `PYTHONPATH=. python tools/make_xnnpack_reader_data.py`.
Seeds are texir's native XNNPACK lowering of three small models (fp32 convnet, static int8 linear with
per-channel weights, dynamic int8 linear); the reproducers are made from the convnet seed:

- `zeroed_400.pte`: 400 zero bytes at offset 80 of its delegate blob (the root table's fields: no
  externs, no inputs or outputs, while values stay flagged input/output; the runtime refuses it).
- `short_xh00.pte` / `short_xh00.bin`: a 24-byte delegate blob starting with the XH00 magic.
- `shared_offsets.pte` / `shared_offsets.bin`: an ~8 KiB blob whose 1024 `xvalues` offsets all point
  to one value with 1024 dims; a reader without an element budget holds 1024 x 1024 ints.
"""

from __future__ import annotations

from pathlib import Path

import flatbuffers
import msgspec

from texir.backends.xnnpack.reader import HEADER_MAGIC

OUT = Path("tests/data/xnnpack_reader")
ZEROED_AT, ZEROED_LEN = 80, 400
SHARED_N = 1024


def _seeds() -> dict[str, bytes]:
    from tests.test_xnnpack_native_quant import quantized
    from tests.zoo import cached_export
    from texir.backends.xnnpack import partitioner, registered
    from texir.emit import emit
    from texir.orchestrate import lower
    from texir.serialize.pte.codec import dumps

    out = {}
    with registered():
        for name, ep in (
            ("seed_convnet", cached_export("convnet", decompose=False)),
            ("seed_linear_int8", quantized("linear_relu_pc")[0]),
            ("seed_linear_dynamic", quantized("linear_dynamic")[0]),
        ):
            out[name] = dumps(emit(lower(ep, [partitioner()], cache=None).program))
    return out


def _with_blob(pte_bytes: bytes, blob: bytes) -> bytes:
    """The .pte with its (single) delegate's blob replaced."""
    from texir.ir.blob import Blob
    from texir.serialize import pte

    x = pte.loads(pte_bytes)
    (data,) = x.program.backend_delegate_data
    program = msgspec.structs.replace(
        x.program, backend_delegate_data=(msgspec.structs.replace(data, data=Blob(blob)),)
    )
    return pte.dumps(msgspec.structs.replace(x, program=program))


def _blob(pte_bytes: bytes) -> bytes:
    from texir.serialize import pte

    (data,) = pte.loads(pte_bytes).program.backend_delegate_data
    return data.data.tobytes()


def shared_offsets_blob(n: int = SHARED_N) -> bytes:
    """An XH00 blob whose XNNGraph lists one XValue `n` times, that value having `n` dims."""
    from texir.backends.xnnpack.reader import HEADER, HEADER_LENGTH

    b = flatbuffers.Builder(16 * n)
    b.StartVector(4, n, 4)
    for i in reversed(range(n)):
        b.PrependUint32(1000 + i)  # above 256: each a distinct int object when decoded
    dims = b.EndVector()
    b.StartObject(7)
    b.PrependInt16Slot(0, 1, 0)
    b.PrependUOffsetTRelativeSlot(2, dims, 0)
    tensor = b.EndObject()
    b.StartObject(2)
    b.PrependUint8Slot(0, 1, 0)
    b.PrependUOffsetTRelativeSlot(1, tensor, 0)
    value = b.EndObject()
    b.StartVector(4, n, 4)
    for _ in range(n):
        b.PrependUOffsetTRelative(value)
    values = b.EndVector()
    b.StartObject(9)
    b.PrependUOffsetTRelativeSlot(2, values, 0)
    root = b.EndObject()
    b.Finish(root, file_identifier=b"XN01")
    fb = bytes(b.Output())
    header = HEADER.pack(b"\0" * 4, HEADER_MAGIC, HEADER_LENGTH, 32, len(fb), 32 + len(fb), 0)
    return header + b"\0\0" + fb


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    seeds = _seeds()
    for name, data in seeds.items():
        (OUT / f"{name}.pte").write_bytes(data)
    convnet = seeds["seed_convnet"]
    blob = bytearray(_blob(convnet))
    blob[ZEROED_AT : ZEROED_AT + ZEROED_LEN] = bytes(ZEROED_LEN)
    (OUT / "zeroed_400.pte").write_bytes(_with_blob(convnet, bytes(blob)))
    short = b"\0\0\0\0" + HEADER_MAGIC + b"\x1e\x00" + bytes(14)
    (OUT / "short_xh00.bin").write_bytes(short)
    (OUT / "short_xh00.pte").write_bytes(_with_blob(convnet, short))
    shared = shared_offsets_blob()
    (OUT / "shared_offsets.bin").write_bytes(shared)
    (OUT / "shared_offsets.pte").write_bytes(_with_blob(convnet, shared))
    for path in sorted(OUT.iterdir()):
        print(f"{path}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
