"""texir's native XNNPACK partitioner and backend on torchao's 8da4w (int8 activations quantized at
run time per token, int4 weights in groups of 32: `Int8DynamicActivationIntxWeightConfig`, what
ExecuTorch's LLM recipes use; and its 8-bit per-channel sibling, 8da8w) against ExecuTorch 1.5.1's XnnpackPartitioner and backend, on a small
MLP: same partitions and implicit q/dq, blobs byte-equal, named data equal (nibble-packed weights,
bfloat16 scales), the .pte equal and bitwise equal in the runtime.
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec
import numpy as np
import pytest
import torch
from torch import nn

from texir.backends.xnnpack import schema as s
from texir.backends.xnnpack.backend import XnnpackNativeBackend, registered
from texir.backends.xnnpack.errors import XnnpackUnsupportedError
from texir.backends.xnnpack.flatbuffer import decode_blob
from texir.backends.xnnpack.int4 import bf16_bytes, pack_int4
from texir.backends.xnnpack.partitioner import partitioner
from texir.ir import IntArg, ListArg, Program
from tests.test_xnnpack_native_quant import _first_difference, pte


class _MLP(nn.Module):
    """Two linears: 64 -> 32 (two groups per row, a bias, a relu after) and 32 -> 8 (one group per
    row, no bias), on a 3-D batch."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 32), nn.Linear(32, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


SCHEMES = ("8da4w", "8da8w")
"""int4 weights in groups of 32, and int8 weights per output channel (torchao's PerAxis(0))."""


@functools.lru_cache(maxsize=None)
def quantized(scheme: str = "8da4w") -> tuple[torch.export.ExportedProgram, tuple[torch.Tensor, ...]]:
    from torchao.quantization import quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig

    torch.manual_seed(0)
    module = _MLP().eval()
    weights = dict(weight_dtype=torch.int4, weight_granularity=PerGroup(32)) if scheme == "8da4w" else dict(
        weight_dtype=torch.int8, weight_granularity=PerAxis(0))
    quantize_(module, Int8DynamicActivationIntxWeightConfig(**weights))  # type: ignore[arg-type]  # dtype and granularity
    args = (torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(1)),)
    return torch.export.export(module, args, strict=False), args


@functools.lru_cache(maxsize=None)
def executorch_lowered(scheme: str = "8da4w") -> Program:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from texir.executorch import executorch_partitioner
    from texir.orchestrate import lower

    return lower(quantized(scheme)[0], [executorch_partitioner(XnnpackPartitioner())], cache=None).program


@functools.lru_cache(maxsize=None)
def native_lowered(scheme: str = "8da4w") -> Program:
    from texir.orchestrate import lower

    with registered():
        return lower(quantized(scheme)[0], [partitioner()], cache=None).program


@pytest.mark.parametrize("scheme", SCHEMES)
def test_native_8da4w_lowering_equals_executorchs(scheme: str) -> None:
    from tests.xnnpack_oracle import texir_partitions

    mine, theirs = native_lowered(scheme), executorch_lowered(scheme)
    assert texir_partitions(mine) == texir_partitions(theirs)
    assert len(mine.lowered_modules) == len(theirs.lowered_modules) == 1
    (a,), (b,) = mine.lowered_modules, theirs.lowered_modules
    implicit = {m.node for m in b.module.original_program.backend_meta if m.key == "IS_IMPLICIT_Q_DQ_TAG"}
    assert {m.node for m in a.module.original_program.backend_meta} == implicit
    if a.module.processed_bytes != b.module.processed_bytes:
        pytest.fail(f"blob differs at {_first_difference(decode_blob(a.module.processed_bytes), decode_blob(b.module.processed_bytes))}")
    assert [(e.key, e.alignment) for e in a.module.named_data] == [(e.key, e.alignment) for e in b.module.named_data]
    for x, y in zip(a.module.named_data, b.module.named_data, strict=True):
        assert x.data is not None and y.data is not None and x.data.tobytes() == y.data.tobytes()
    assert pte(mine) == pte(theirs)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_lowered_8da4w_programs_parse_back_from_their_text(scheme: str) -> None:
    """Natively lowered (bfloat16 scales as `scale_<sha256>` named data) and without a partitioner."""
    from tests.text_round_trip import assert_text_round_trip
    from texir.orchestrate import lower

    assert_text_round_trip(native_lowered(scheme), f"{scheme} (native XNNPACK)")
    assert_text_round_trip(lower(quantized(scheme)[0], [], cache=None).program, f"{scheme} (no partitioner)")


def test_4bit_weights_and_bf16_scales_in_the_blob() -> None:
    """Each filter is qbint4 with its logical [out, in] dims, stored as the IR's int8 values plus 8,
    two per byte (even column low); its scales are bfloat16 named data `scale_<sha256>`, one per
    group of 32 columns."""
    (lowered,) = native_lowered().lowered_modules
    graph = decode_blob(lowered.module.processed_bytes)
    named = {e.key: e.data.tobytes() for e in lowered.module.named_data if e.data is not None}
    program = lowered.module.original_program
    state = {e.target: e.value for e in program.state}
    filters = []
    for node in graph.xnodes:
        u = node.xnode_union
        if isinstance(u, s.XNNFullyConnected):
            w = graph.xvalues[u.filter_id].xvalue_union
            assert isinstance(w, s.XNNQuantizedTensorValue) and w.tensor_value is not None
            assert w.tensor_value.datatype == s.XNNDatatype.xnn_datatype_qbint4
            assert isinstance(w.quant_params, s.PerChannelGroupQuant) and w.quant_params.group_size == 32
            filters.append((w.tensor_value, w.quant_params))
    assert [tuple(t.dims) for t, _ in filters] == [(32, 64), (8, 32)]
    for (tensor, params), layer in zip(filters, ("fc1", "fc2"), strict=True):
        qdata, scale = (state[f"{layer}.parametrizations.weight.original{i}"] for i in (0, 1))
        assert qdata.data is not None and scale.data is not None
        values = np.frombuffer(qdata.data.tobytes(), dtype=np.int8).reshape(qdata.meta.shape)
        weight = named[graph.constant_data[tensor.constant_buffer_idx].named_key]
        assert weight == pack_int4(values, layer).tobytes() and len(weight) == values.size // 2
        scales = torch.frombuffer(bytearray(scale.data.tobytes()), dtype=torch.float32)
        expected = scales.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
        assert named[graph.constant_data[params.scale_buffer_idx].named_key] == expected
        assert params.num_scales == scales.numel() == tensor.dims[0] * tensor.dims[1] // 32


def test_nibble_packing_and_bf16_rounding() -> None:
    packed = pack_int4(np.array([[-8, 7, 0], [1, -1, 3]], dtype=np.int8), "w")
    assert packed.tolist() == [[0xF0, 0x88], [0x79, 0x8B]]  # rows of odd length padded with 0 (+8)
    values = np.array([1.0, 1.00390625, 1.01171875, -2.5e-39, np.inf, 3.3895314e38, 1e-3], dtype=np.float32)
    expected = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    assert bf16_bytes(values, "scales") == expected
    with pytest.raises(XnnpackUnsupportedError, match=r"\[-8, 7\]"):
        pack_int4(np.array([[8]], dtype=np.int8), "w")
    with pytest.raises(XnnpackUnsupportedError, match="NaN"):
        bf16_bytes(np.array([np.nan], dtype=np.float32), "scales")


def test_native_8da4w_pte_runs_bitwise_as_executorchs() -> None:
    from tests.xnnpack_oracle import executorch_xnnpack, run_pte

    ep, args = quantized()
    reference = executorch_xnnpack(ep)
    assert reference.pte is not None, reference.error
    mine, theirs = run_pte(pte(native_lowered()), args)[0], run_pte(reference.pte, args)[0]
    assert mine and len(mine) == len(theirs)
    for a, b in zip(mine, theirs, strict=True):
        assert torch.equal(a, b)
    assert torch.allclose(mine[0], ep.module()(*args), atol=0.05)


def test_8da8w_weights_are_per_channel_int8_and_run() -> None:
    """int8 weights quantized per row by torchao: qcint8 filters with fp32 per-channel scales (its
    .pte equals ExecuTorch's, above); the runtime's outputs are close to eager."""
    from tests.xnnpack_oracle import run_pte

    (lowered,) = native_lowered("8da8w").lowered_modules
    graph = decode_blob(lowered.module.processed_bytes)
    filters = [graph.xvalues[n.xnode_union.filter_id].xvalue_union for n in graph.xnodes
               if isinstance(n.xnode_union, s.XNNFullyConnected)]
    assert [type(f.quant_params).__name__ for f in filters if isinstance(f, s.XNNQuantizedTensorValue)] == [
        "PerChannelQuant", "PerChannelQuant"]
    assert all(isinstance(f, s.XNNQuantizedTensorValue) and f.tensor_value is not None
               and f.tensor_value.datatype == s.XNNDatatype.xnn_datatype_qcint8 for f in filters)
    ep, args = quantized("8da8w")
    out = run_pte(pte(native_lowered("8da8w")), args)[0][0]
    assert torch.allclose(out, ep.module()(*args), atol=0.05)


def test_a_group_size_xnnpack_cannot_take_forced_into_a_partition_is_a_typed_error() -> None:
    """A weight grouped by 16 columns (XNNPACK needs a multiple of 32) in a partition the native
    partitioner would not make: the backend names the node before writing any bytes."""
    program = executorch_lowered().lowered_modules[0].module.original_program

    def group_of_16(n: Any) -> Any:
        if getattr(n, "name", "") == "torchao_dequantize_affine_default_1":
            return msgspec.structs.replace(n, args=(n.args[0], ListArg(items=(IntArg(value=1), IntArg(value=16))),
                                                    *n.args[2:]))
        return n

    nodes = tuple(group_of_16(n) for n in program.graph.nodes)
    forced = msgspec.structs.replace(program, graph=msgspec.structs.replace(program.graph, nodes=nodes))
    with pytest.raises(XnnpackUnsupportedError, match="multiple of 32") as info:
        XnnpackNativeBackend().preprocess(forced, ())
    assert info.value.node == "torchao_dequantize_affine_default_1"
