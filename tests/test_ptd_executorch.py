"""texir's `.ptd` writer against ExecuTorch 1.5.1's own (`FlatTensorSerializer`, which builds the
FlatTensor flatbuffer with flatc from JSON): the same bytes for the same entries, header included."""

from __future__ import annotations

import pytest
from executorch.exir._serialize.data_serializer import DataEntry, DataPayload
from executorch.exir.scalar_type import ScalarType as EtScalarType
from executorch.exir.tensor_layout import TensorLayout as EtTensorLayout
from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

from texir.ir.blob import Blob
from texir.serialize import pte
from texir.serialize.pte.schema import PtdEntry, PtdFile, ScalarType, TensorLayout

_Entry = tuple[str, int, int, tuple[int, tuple[int, ...], tuple[int, ...]] | None]
"""(key, payload index, alignment, (scalar type, sizes, dim order) or None)."""

_PAYLOADS = [bytes(range(7)) * 5, b"\x01" * 64, bytes(range(256)) * 3, b"\xff" * 4]

CASES: dict[str, list[_Entry]] = {
    "tensors": [("w", 0, 16, (6, (5, 7), (0, 1))), ("b", 1, 16, (6, (16,), (0,)))],
    "shared payload": [("embed.weight", 2, 64, (6, (3, 256), (0, 1))), ("9f8e", 2, 64, None), ("x", 3, 16, None)],
    "opaque and channels last": [("blob", 0, 1, None), ("t", 2, 32, (1, (1, 3, 16, 16), (0, 2, 3, 1)))],
    "empty payload": [("none", 3, 16, None), ("zero", 1, 16, (6, (0, 16), (0, 1)))],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_ptd_equals_executorchs_serializer(case: str) -> None:
    entries = CASES[case]
    payloads = [b"" if key == "zero" else _PAYLOADS[i] for key, i, _, _ in entries]
    ours = PtdFile(tag="weights", entries=tuple(
        PtdEntry(key=key, data=Blob(payload), alignment=align, layout=None if layout is None else TensorLayout(
            scalar_type=ScalarType(layout[0]), sizes=layout[1], dim_order=layout[2]))
        for (key, _, align, layout), payload in zip(entries, payloads)
    ))
    buffers: list[bytes] = []
    index: dict[bytes, int] = {}
    named: dict[str, DataEntry] = {}
    for (key, _, align, layout), payload in zip(entries, payloads):
        at = index.setdefault(payload, len(buffers))
        if at == len(buffers):
            buffers.append(payload)
        named[key] = DataEntry(buffer_index=at, alignment=align, tensor_layout=None if layout is None else EtTensorLayout(
            scalar_type=EtScalarType(layout[0]), sizes=list(layout[1]), dim_order=list(layout[2])))
    theirs = bytes(FlatTensorSerializer().serialize(DataPayload(buffers=buffers, named_data=named)))
    assert pte.dumps_ptd(ours) == theirs
