"""Hypothesis fuzzing of the .pte decoder: mutated and truncated real files raise only PteError."""

from __future__ import annotations

import functools
import os
import struct

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from texir.cli.cmd_inspect import inspect_pte
from texir.errors import PteError
from texir.serialize import pte
from texir.viz.html import render_html
from texir.viz.pte_view import pte_text


@functools.cache
def _seeds() -> tuple[bytes, ...]:
    """Real files: ExecuTorch-written (plain and XNNPACK-delegated) and texir's re-encodings."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge, to_edge_transform_and_lower

    class Small(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 3)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            b = self.lin(x) + y
            m, _ = torch.max(b, dim=1)
            return torch.sin(b) * 2.5, m

    torch.manual_seed(0)
    args = (torch.randn(2, 4), torch.randn(2, 3))
    plain = to_edge(torch.export.export(Small().eval(), args)).to_executorch().buffer
    xnn = to_edge_transform_and_lower(
        torch.export.export(Small().eval(), args), partitioner=[XnnpackPartitioner()]
    ).to_executorch().buffer
    inline = pte.dumps(pte.loads(xnn), pte.PteOptions(extract_delegate_segments=False))
    return (plain, xnn, pte.dumps(pte.loads(plain)), inline)


def _decode(data: bytes) -> None:
    try:
        inspect_pte(data)  # `texir inspect` reads the raw file: it must fail cleanly too
    except PteError:
        pass
    try:
        x = pte.loads(data)
    except PteError:
        return
    # Whatever decodes is index-checked: `texir show` (text and HTML) must render it, and it must
    # re-encode (or be refused with a PteError), never crash.
    pte_text(x)
    render_html(x, title="fuzz")
    try:
        pte.dumps(x)
    except PteError:
        pass


# 150 examples per test in `make test`; `make fuzz` sets TEXIR_FUZZ_EXAMPLES=2600 (4 tests: 10,400 files).
_EXAMPLES = int(os.environ.get("TEXIR_FUZZ_EXAMPLES", "150"))
_SETTINGS = settings(max_examples=_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(seed=st.integers(0, 3), data=st.data())
def test_byte_flips(seed: int, data: st.DataObject) -> None:
    buf = bytearray(_seeds()[seed])
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(buf) - 1), st.integers(0, 255)), min_size=1, max_size=8))
    for pos, value in flips:
        buf[pos] = value
    _decode(bytes(buf))


@_SETTINGS
@given(seed=st.integers(0, 3), data=st.data())
def test_truncation(seed: int, data: st.DataObject) -> None:
    raw = _seeds()[seed]
    cut = data.draw(st.integers(0, len(raw) - 1))
    _decode(raw[:cut])


@_SETTINGS
@given(seed=st.integers(0, 3), data=st.data())
def test_hostile_words(seed: int, data: st.DataObject) -> None:
    """Overwrite aligned 32-bit words (offsets, lengths, vtable refs) with extreme values."""
    buf = bytearray(_seeds()[seed])
    words = data.draw(
        st.lists(
            st.tuples(
                st.integers(0, len(buf) // 4 - 1),
                st.sampled_from([0, 1, 4, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFC, len(buf), 2**20]),
            ),
            min_size=1,
            max_size=4,
        )
    )
    for index, value in words:
        struct.pack_into("<I", buf, 4 * index, value)
    _decode(bytes(buf))


@_SETTINGS
@given(junk=st.binary(max_size=256))
def test_arbitrary_bytes_with_identifier(junk: bytes) -> None:
    _decode(junk[:4] + b"ET12" + junk[4:])
