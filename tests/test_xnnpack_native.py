"""texir's own XNNPACK backend (`texir.backends.xnnpack`) against ExecuTorch 1.5.1's.

The oracle is ExecuTorch's XnnpackBackend run by texir on the same partitions (the sub-programs
`lower(ep, [executorch_partitioner(XnnpackPartitioner())])` leaves): its blobs and named data.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap

import pytest

from texir.backends.xnnpack import schema as s
from texir.backends.xnnpack.flatbuffer import (
    XnnpackBlobError,
    decode_blob,
    decode_graph,
    encode_blob,
    encode_graph,
    split_blob,
)
from texir.ir import LoweredBackendModule

ROUND_TRIP = ["mlp", "deep_mlp", "convnet", "resnet_tiny", "attention", "cat_stack"]


@functools.lru_cache(maxsize=None)
def executorch_modules(name: str) -> tuple[LoweredBackendModule, ...]:
    """The lowered modules ExecuTorch's partitioner and backend make of zoo model `name`."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from tests.zoo import cached_export
    from texir.adapters.executorch import executorch_partitioner
    from texir.lowering import lower

    program = lower(cached_export(name, decompose=False), [executorch_partitioner(XnnpackPartitioner())])
    return tuple(m.module for m in program.lowered_modules)


# -- schema, writer, reader ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ROUND_TRIP)
def test_executorch_blobs_decode_and_reencode_byte_equal(name: str) -> None:
    modules = executorch_modules(name)
    assert modules
    for module in modules:
        graph = decode_blob(module.processed_bytes)
        assert graph.version == "0"
        assert graph.constant_data[0] == s.ConstantDataOffset()
        assert encode_blob(graph) == module.processed_bytes
        assert decode_graph(encode_graph(graph)) == graph


def test_writer_follows_the_worked_mlp_layout() -> None:
    """A graph built in code: header fields, identifier, root offset and the version string last."""
    graph = s.XNNGraph(
        xnodes=(s.XNode(xnode_union=s.XNNClamp(input_id=0, output_id=1), debug_handle=7,
                        output_min_max=s.OutputMinMax(output_min=-1.0, output_max=float("inf"))),),
        xvalues=tuple(
            s.XValue(xvalue_union=s.XNNTensorValue(
                datatype=s.XNNDatatype.xnn_datatype_fp32, num_dims=2, dims=(2, 3), external_id=i, flags=1 + i,
                id_out=i))
            for i in range(2)
        ),
        num_externs=2, input_ids=(0,), output_ids=(1,), constant_data=(s.ConstantDataOffset(),),
    )
    blob = encode_blob(graph)
    assert blob[:4] == b"\0\0\0\0" and blob[4:8] == b"XH00"
    fb, constants = split_blob(blob)
    assert constants == b"" and len(blob) % 16 == 0
    assert fb[4:8] == b"XN01"
    assert fb.endswith(b"\x01\x00\x00\x000\x00\x00\x00")  # the version string "0" is created first
    assert decode_blob(blob) == graph


def test_damaged_blobs_are_typed_errors() -> None:
    with pytest.raises(XnnpackBlobError, match="identifier"):
        decode_graph(b"\0" * 16)
    with pytest.raises(XnnpackBlobError, match="past the blob's end"):
        split_blob(b"\0\0\0\0XH00\x1e\x00" + (10_000).to_bytes(4, "little") + b"\0" * 20)
    with pytest.raises(XnnpackBlobError, match="not a member of its union"):
        encode_graph(s.XNNGraph(xvalues=(s.XValue(xvalue_union=s.OutputMinMax()),)))  # type: ignore[arg-type]  # the bad input under test


def test_backends_import_neither_torch_nor_executorch() -> None:
    code = textwrap.dedent("""
        import sys
        import texir.backends.xnnpack
        import texir.backends.xnnpack.flatbuffer
        bad = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "executorch"))
        assert not bad, bad
    """)
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))
