"""The XNNPACK blob reader on damaged delegates (issue 38, items 5 and 8).

Hypothesis mutates the delegate blob of real native-XNNPACK `.pte` files (zeroed ranges, truncations,
bit flips, extreme 32-bit words) and reads each result as `texir inspect`, `texir show` and the Python
reader do: only texir's errors, each one line, and never more memory than a bounded multiple of the
input (tracemalloc peak <= _PER_BYTE * size + _SLACK). The files in tests/data/xnnpack_reader/ (seeds and
reproducers) come from tools/make_xnnpack_reader_data.py.
"""

from __future__ import annotations

import functools
import os
import re
import struct
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from texir.backends.xnnpack import schema as s
from texir.backends.xnnpack.flatbuffer import encode_blob
from texir.backends.xnnpack.reader import XnnpackBlobError, check_graph, decode_blob, split_blob
from texir.cli.main import main
from texir.cli.pte_report import check_xnnpack_delegates, inspect_pte
from texir.errors import PteError
from texir.ir.blob import Blob
from texir.serialize import bpte, pte
from texir.serialize.fb_reader import FbReader, PteDecodeError

DATA = Path(__file__).parent / "data" / "xnnpack_reader"
SEEDS = ("seed_convnet.pte", "seed_linear_int8.pte", "seed_linear_dynamic.pte")
_PER_BYTE = 256
_SLACK = 1 << 20
"""Allocation allowed: the reader decodes at most (size + 4096) elements, each a few dozen bytes."""


@functools.cache
def _seed(index: int) -> tuple[pte.PteProgram, bytes]:
    """A seed's logical program and its XNNPACK delegate's blob."""
    x = pte.loads((DATA / SEEDS[index]).read_bytes())
    (data,) = x.program.backend_delegate_data
    return x, data.data.tobytes()


def _with_blob(x: pte.PteProgram, blob: bytes) -> bytes:
    (data,) = x.program.backend_delegate_data
    program = msgspec.structs.replace(
        x.program, backend_delegate_data=(msgspec.structs.replace(data, data=Blob(blob)),)
    )
    return pte.dumps(msgspec.structs.replace(x, program=program))


def _peak(fn: Callable[[], object]) -> tuple[int, BaseException | None]:
    """(tracemalloc peak while `fn` runs, what it raised)."""
    tracemalloc.start()
    try:
        fn()
        raised = None
    except PteError as exc:
        raised = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak, raised


def _read(blob: bytes, seed: int) -> None:
    """The blob alone (the Python reader), then in its .pte (`texir inspect`, `texir show`)."""
    data = _with_blob(_seed(seed)[0], blob)
    for fn, n in (
        (lambda: decode_blob(blob), len(blob)),
        (lambda: inspect_pte(data), len(data)),
        (lambda: check_xnnpack_delegates(pte.loads(data)), len(data)),
    ):
        peak, raised = _peak(fn)
        assert peak <= _PER_BYTE * n + _SLACK, f"{peak} bytes allocated reading {n} bytes"
        if raised is not None:
            assert isinstance(raised, XnnpackBlobError), raised  # the .pte around it is intact
            assert "\n" not in str(raised)


# `make test`: 50 examples per test, the same ones every run; `make fuzz` sets TEXIR_FUZZ_EXAMPLES=2600
# (866 random examples per test, 3,464 blobs each read three ways).
_FUZZ = os.environ.get("TEXIR_FUZZ_EXAMPLES")
_SETTINGS = settings(
    max_examples=max(int(_FUZZ or "150") // 3, 1), derandomize=_FUZZ is None, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
_SEED = st.integers(0, len(SEEDS) - 1)


@_SETTINGS
@given(seed=_SEED, data=st.data())
def test_zeroed_ranges(seed: int, data: st.DataObject) -> None:
    blob = bytearray(_seed(seed)[1])
    start = data.draw(st.integers(0, len(blob) - 1))
    length = data.draw(st.integers(1, 512))
    blob[start : start + length] = bytes(len(blob[start : start + length]))
    _read(bytes(blob), seed)


@_SETTINGS
@given(seed=_SEED, data=st.data())
def test_truncations(seed: int, data: st.DataObject) -> None:
    blob = _seed(seed)[1]
    _read(blob[: data.draw(st.integers(0, len(blob) - 1))], seed)


@_SETTINGS
@given(seed=_SEED, data=st.data())
def test_bit_flips(seed: int, data: st.DataObject) -> None:
    blob = bytearray(_seed(seed)[1])
    for bit in data.draw(st.lists(st.integers(0, 8 * len(blob) - 1), min_size=1, max_size=8)):
        blob[bit // 8] ^= 1 << (bit % 8)
    _read(bytes(blob), seed)


@_SETTINGS
@given(seed=_SEED, data=st.data())
def test_hostile_words(seed: int, data: st.DataObject) -> None:
    """Aligned 32-bit words (offsets, lengths, vtable references) set to extreme values."""
    blob = bytearray(_seed(seed)[1])
    words = st.sampled_from([0, 1, 4, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFC, len(blob), 2**16 - 2])
    for index, value in data.draw(st.lists(st.tuples(st.integers(0, len(blob) // 4 - 1), words), min_size=1, max_size=4)):
        struct.pack_into("<I", blob, 4 * index, value)
    _read(bytes(blob), seed)


# -- what must always be refused -----------------------------------------------------------------


@pytest.mark.parametrize("seed", range(len(SEEDS)))
def test_seeds_decode_and_reencode(seed: int) -> None:
    """The seeds are sound: the reader accepts them and they are the bytes the writer gives."""
    blob = _seed(seed)[1]
    assert encode_blob(decode_blob(blob)) == blob


@pytest.mark.parametrize("seed", range(len(SEEDS)))
def test_a_zeroed_window_that_changes_the_interface_is_refused(seed: int) -> None:
    """Every 400-byte window zeroed (16-byte steps): what the reader accepts keeps the seed's
    externs, inputs and outputs and each value's flags (issue 38 item 5: a graph shown with
    `externs=0 inputs=[] outputs=[]` whose values were still flagged input/output)."""
    blob = _seed(seed)[1]
    graph = decode_blob(blob)
    refused = 0
    for start in range(32, len(blob), 16):
        damaged = blob[:start] + bytes(len(blob[start : start + 400])) + blob[start + 400 :]
        try:
            got = decode_blob(damaged)
        except XnnpackBlobError:
            refused += 1
            continue
        assert (got.num_externs, got.input_ids, got.output_ids) == (
            graph.num_externs, graph.input_ids, graph.output_ids), start
    assert refused


def test_issue_item5_zeroed_delegate_fails_inspect_and_show(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = DATA / "zeroed_400.pte"
    bundled = tmp_path / "zeroed_400.bpte"
    bundled.write_bytes(bpte.dumps(bpte.BundledProgram(method_test_suites=(), program=Blob(path.read_bytes()))))
    for command, file in (("inspect", path), ("show", path), ("inspect", bundled), ("show", bundled)):
        assert main([command, str(file)]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert err.count("\n") == 1
        assert "delegate 0 (XnnpackBackend): damaged XNNPACK graph: xvalues[0] (id 0): external_id 0 not below " \
            "num_externs 0" in err, err
    with pytest.raises(XnnpackBlobError, match="num_externs 0"):
        inspect_pte(path.read_bytes(), brief=True)  # --brief reads the delegate too


def test_issue_item8_short_xh00_blob() -> None:
    blob = (DATA / "short_xh00.bin").read_bytes()
    assert len(blob) < 30 and blob[4:8] == b"XH00"
    with pytest.raises(XnnpackBlobError, match="24 bytes is shorter than the 30-byte XH00 header"):
        split_blob(blob)
    with pytest.raises(XnnpackBlobError, match="delegate 0 .*shorter than the 30-byte XH00 header"):
        inspect_pte((DATA / "short_xh00.pte").read_bytes())


def test_issue_item8_shared_offsets_stay_within_the_budget(capsys: pytest.CaptureFixture[str]) -> None:
    """1024 offsets to one value of 1024 dims: a reader without an element budget held 1024^2 ints
    (38 MB for this 8 KB blob); texir's decodes the value once and refuses the graph."""
    blob = (DATA / "shared_offsets.bin").read_bytes()
    peak, raised = _peak(lambda: decode_blob(blob))
    assert peak <= _PER_BYTE * len(blob) + _SLACK
    assert isinstance(raised, XnnpackBlobError) and "damaged XNNPACK graph" in str(raised)
    data = (DATA / "shared_offsets.pte").read_bytes()
    peak, raised = _peak(lambda: inspect_pte(data))
    assert peak <= _PER_BYTE * len(data) + _SLACK
    assert isinstance(raised, XnnpackBlobError)
    assert main(["inspect", str(DATA / "shared_offsets.pte")]) == 2
    assert "num_dims 0 but 1024 dims" in capsys.readouterr().err


def test_overlapping_vtables_are_charged() -> None:
    """512 tables, each with its own 32 KiB vtable over the same bytes: each vtable costs its slots, so
    the budget stops the read instead of holding 512 x 16K slots."""
    tables, vt_base, vt_size = 512, 4 * 512, 0x7FFC
    n = vt_base + 2 * tables + vt_size
    buf = bytearray(n)
    struct.pack_into(f"<{(n - vt_base) // 2}H", buf, vt_base, *[vt_size] * ((n - vt_base) // 2))
    for j in range(tables):
        struct.pack_into("<i", buf, 4 * j, 4 * j - (vt_base + 2 * j))
    reader = FbReader(memoryview(bytes(buf)), n)

    def read_all() -> None:
        for j in range(tables):
            reader.table(4 * j, f"table {j}")

    peak, raised = _peak(read_all)
    assert isinstance(raised, PteDecodeError) and "exceeds the input size" in str(raised)
    assert peak <= _PER_BYTE * n + _SLACK


def test_check_graph_names_what_is_wrong() -> None:
    value = s.XNNTensorValue(datatype=s.XNNDatatype.xnn_datatype_fp32, num_dims=1, dims=(2,), flags=1,
                             external_id=0, id_out=0)
    out = msgspec.structs.replace(value, flags=2, external_id=1, id_out=1)
    good = s.XNNGraph(
        xvalues=(s.XValue(xvalue_union=value), s.XValue(xvalue_union=out)),
        xnodes=(s.XNode(xnode_union=s.XNNAbs(input_id=0, output_id=1)),),
        num_externs=2, input_ids=(0,), output_ids=(1,), constant_data=(s.ConstantDataOffset(),),
    )
    check_graph(good, constant_data_size=0)
    cases = {
        "input_ids lists value 1, which is not flagged input (flags 2)": msgspec.structs.replace(good, input_ids=(0, 1)),
        "input_ids lists 5, which no value defines": msgspec.structs.replace(good, input_ids=(0, 5)),
        "value 0 is flagged input but input_ids [] does not list it": msgspec.structs.replace(good, input_ids=()),
        "xnodes[0] (Abs, debug handle 0): output_id 7 is not a value id":
            msgspec.structs.replace(good, xnodes=(s.XNode(xnode_union=s.XNNAbs(input_id=0, output_id=7)),)),
        "constant_data[1] at 0+64 lies outside the blob's 0 bytes":
            msgspec.structs.replace(good, constant_data=(s.ConstantDataOffset(), s.ConstantDataOffset(size=64))),
        "external_id 1 not below num_externs 1": msgspec.structs.replace(good, num_externs=1),
        "id defined twice": msgspec.structs.replace(good, xvalues=(s.XValue(xvalue_union=value),) * 2),
    }
    for message, graph in cases.items():
        with pytest.raises(XnnpackBlobError, match=re.escape(message)):
            check_graph(graph, constant_data_size=0)
