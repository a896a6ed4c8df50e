"""texir's native XNNPACK partitioner and backend on pt2e int8 models (XNNPACKQuantizer: static with
per-tensor and per-channel weights, dynamic with per-channel weights) against ExecuTorch 1.5.1's
XnnpackPartitioner and backend.

The reference of each model is ExecuTorch's partitioner and backend run by texir on the same program
(`lower(ep, [executorch_partitioner(XnnpackPartitioner())])`); tests/test_executorch_backends.py
shows that route writes ExecuTorch's own .pte, and one test here runs ExecuTorch's pipeline itself.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Final

import msgspec
import pytest
import torch
from torch import nn

from tests.real_models import pattern_graphs_reused
from texir.backends.xnnpack import schema as s
from texir.backends.xnnpack.backend import XnnpackNativeBackend, registered
from texir.backends.xnnpack.errors import XnnpackUnsupportedError
from texir.backends.xnnpack.flatbuffer import decode_blob
from texir.backends.xnnpack.partitioner import partitioner
from texir.ir import CallFunction, DType, DTypeArg, IntArg, Program, Ref

_seed = torch.Generator().manual_seed


class _Linear(nn.Module):
    def __init__(self, relu: bool) -> None:
        super().__init__()
        self.fc, self.relu = nn.Linear(8, 4), relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return torch.relu(y) if self.relu else y


class _Conv(nn.Module):
    def __init__(self, relu: bool) -> None:
        super().__init__()
        self.conv, self.relu = nn.Conv2d(4, 8, 3, padding=1), relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return torch.relu(y) if self.relu else y


class _Add(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = torch.relu(x + y)
        return z * y - x


class _ConvNet(nn.Module):
    """conv-relu-conv-add-avgpool-linear, with a max pool, a depthwise conv, a hardtanh and an eval
    dropout (a clone between q/dq pairs, removed with them) on the way.
    With `flat_mean` the average pool is a mean without keepdim, which XNNPACK's mean config refuses:
    its q/dq stay explicit (Converts) and the graph splits into two partitions."""

    def __init__(self, flat_mean: bool = False) -> None:
        super().__init__()
        self.flat_mean = flat_mean
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.c3 = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = nn.Linear(8, 4)
        self.dropout = nn.Dropout(0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.c1(x))
        z = self.c2(y) + y
        z = nn.functional.hardtanh(self.c3(nn.functional.max_pool2d(z, 2)), 0.0, 6.0)
        pooled = z.mean((2, 3)) if self.flat_mean else nn.functional.adaptive_avg_pool2d(z, 1).flatten(1)
        return self.fc(self.dropout(pooled))


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class _Cat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([x, y], dim=1))


class _ToChannelsLast(nn.Module):
    """A memory-format conversion between two quantized convolutions: its input is dequantized and a
    quantize follows it."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c2(self.c1(x).to(memory_format=torch.channels_last))


class _Shuffle(nn.Module):
    """ShuffleNet's channel shuffle between two quantized convolutions: view, permute (pt2e shares its
    q/dq params with its input's), a contiguous clone of dequantized values, view."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(4, 8, 1), nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.c1(x)
        b, c, h, w = y.shape
        y = y.view(b, 2, c // 2, h, w).transpose(1, 2).contiguous().view(b, c, h, w)
        return self.c2(y)


class _Sub(nn.Module):
    """A sub of two quantized convolutions' outputs, quantized for the next one (XNNPACK's quantizer
    does not annotate sub: its int8 form comes from the q/dq around it)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(self.a(x) - self.b(x))


class _Slice(nn.Module):
    """A channel slice of a quantized convolution's output, read by another (pt2e shares the slice's
    q/dq params with its input's)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(4, 4, 1), nn.Conv2d(2, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c2(self.c1(x)[:, 1:3])


class _SamePad(nn.Module):
    """A quantized convolution with padding="same" and an even kernel: export pads its input (a
    constant_pad_nd between the dequantize and the convolution), which ExecuTorch's convolution config
    takes into the int8 pattern."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 4, padding="same")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c2(self.c1(x))


class _Clamp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c2(torch.clamp(self.c1(x), -0.5, 0.5))


class _Unsqueeze(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 4), nn.Linear(1, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x).unsqueeze(-1))


def _inputs(*shapes: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(*shape, generator=_seed(i + 1)) for i, shape in enumerate(shapes))


MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[tuple[int, ...], ...], bool]] = {
    # name: (module, input shapes, per-channel weights)
    "linear": (lambda: _Linear(relu=False), ((2, 8),), False),
    "linear_relu_pc": (lambda: _Linear(relu=True), ((2, 8),), True),
    "conv_relu_pc": (lambda: _Conv(relu=True), ((1, 4, 6, 6),), True),
    "add_relu_mul_sub": (_Add, ((1, 4, 4, 4), (1, 4, 4, 4)), False),
    "convnet_flat_mean": (lambda: _ConvNet(flat_mean=True), ((1, 3, 8, 8),), False),
    "convnet_pc": (_ConvNet, ((1, 3, 8, 8),), True),
    "cat_linear": (_Cat, ((2, 4), (2, 4)), False),
    "shuffle_conv_pc": (_Shuffle, ((1, 4, 4, 4),), True),
    "sub_conv": (_Sub, ((1, 4, 4, 4),), False),
    "slice_conv_pc": (_Slice, ((1, 4, 4, 4),), True),
    "same_pad_conv_pc": (_SamePad, ((1, 4, 6, 6),), True),
    "clamp_conv_pc": (_Clamp, ((1, 4, 4, 4),), True),
    "unsqueeze_linear_pc": (_Unsqueeze, ((2, 4),), True),
    "to_channels_last_conv": (_ToChannelsLast, ((1, 4, 4, 4),), False),
}
DYNAMIC_MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[tuple[int, ...], ...], bool]] = {
    # activations quantized at run time, per-channel int8 weights (XNNPACKQuantizer's dynamic scheme)
    "linear_dynamic": (lambda: _Linear(relu=False), ((2, 8),), True),
    "mlp_dynamic_3d": (_MLP, ((2, 3, 8),), True),
}
DYNAMIC_CONV: Final = "conv_dynamic"
"""A dynamically quantized convolution: ExecuTorch's partitioner takes it, the native one not yet."""
DYNAMIC: Final = "linear_dynamic"


@functools.lru_cache(maxsize=None)
def quantized(name: str) -> tuple[torch.export.ExportedProgram, tuple[torch.Tensor, ...]]:
    """The model quantized with XNNPACK's quantizer (calibrated on its example input) and exported."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    conv = (lambda: _Conv(relu=False), ((1, 4, 6, 6),), True)
    make, shapes, per_channel = {**MODELS, **DYNAMIC_MODELS, DYNAMIC_CONV: conv}[name]
    torch.manual_seed(0)
    module, args = make().eval(), _inputs(*shapes)
    config = get_symmetric_quantization_config(is_per_channel=per_channel, is_dynamic=name in DYNAMIC_MODELS or name == DYNAMIC_CONV)
    quantizer = XNNPACKQuantizer().set_global(config)
    with pattern_graphs_reused():
        prepared = prepare_pt2e(torch.export.export(module, args, strict=False).module(), quantizer)  # type: ignore[arg-type]  # a GraphModule from export
    prepared(*args)
    return torch.export.export(convert_pt2e(prepared), args, strict=False), args


@functools.lru_cache(maxsize=None)
def executorch_lowered(name: str) -> Program:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from texir.executorch import executorch_partitioner
    from texir.orchestrate import lower

    return lower(quantized(name)[0], [executorch_partitioner(XnnpackPartitioner())]).program


@functools.lru_cache(maxsize=None)
def native_lowered(name: str) -> Program:
    from texir.orchestrate import lower

    with registered():
        return lower(quantized(name)[0], [partitioner()]).program


@functools.lru_cache(maxsize=None)
def pte(program: Program) -> bytes:
    from texir.emit import emit
    from texir.serialize.pte.codec import dumps

    return dumps(emit(program))


def _first_difference(mine: s.XNNGraph, theirs: s.XNNGraph) -> str:
    """The first field (path) where two decoded graphs differ."""

    def walk(a: Any, b: Any, path: str) -> str | None:
        if type(a) is not type(b):
            return f"{path}: {type(a).__name__} != {type(b).__name__}"
        if isinstance(a, msgspec.Struct):
            for f in a.__struct_fields__:
                found = walk(getattr(a, f), getattr(b, f), f"{path}.{f}")
                if found:
                    return found
            return None
        if isinstance(a, tuple):
            if len(a) != len(b):
                return f"{path}: {len(a)} items != {len(b)}"
            for i, (x, y) in enumerate(zip(a, b)):
                found = walk(x, y, f"{path}[{i}]")
                if found:
                    return found
            return None
        return None if a == b else f"{path}: {a!r} != {b!r}"

    return walk(mine, theirs, "graph") or "the decoded tables are equal (layout differs)"


# -- partitions, blobs, named data, runtime --------------------------------------------------------


@pytest.mark.parametrize("name", [*MODELS, *DYNAMIC_MODELS])
def test_native_int8_lowering_equals_executorchs(name: str) -> None:
    """Same partitions (ops and shapes, q/dq included) and implicit q/dq tags; each blob byte-equal
    (else the first differing field is named); named data equal; the whole .pte equal."""
    from tests.xnnpack_oracle import texir_partitions

    mine, theirs = native_lowered(name), executorch_lowered(name)
    assert texir_partitions(mine) == texir_partitions(theirs)
    assert len(mine.lowered_modules) == len(theirs.lowered_modules) >= 1
    for a, b in zip(mine.lowered_modules, theirs.lowered_modules, strict=True):
        implicit = {m.node for m in b.module.original_program.backend_meta if m.key == "IS_IMPLICIT_Q_DQ_TAG"}
        assert {m.node for m in a.module.original_program.backend_meta} == implicit
        if a.module.processed_bytes != b.module.processed_bytes:
            mine_graph, theirs_graph = decode_blob(a.module.processed_bytes), decode_blob(b.module.processed_bytes)
            pytest.fail(f"{name}: blob differs at {_first_difference(mine_graph, theirs_graph)}")
        assert [(e.key, e.alignment) for e in a.module.named_data] == [(e.key, e.alignment) for e in b.module.named_data]
        for x, y in zip(a.module.named_data, b.module.named_data, strict=True):
            assert x.data is not None and y.data is not None and x.data.tobytes() == y.data.tobytes()
    assert pte(mine) == pte(theirs)


@pytest.mark.parametrize("name", [*MODELS, *DYNAMIC_MODELS])
def test_lowered_int8_programs_parse_back_from_their_text(name: str) -> None:
    """The native lowering (per-channel scales are named data keyed `scale_<sha256>`, whose sha256
    field is the payload's digest: issue #38) and the edge program without a partitioner."""
    from tests.text_round_trip import assert_text_round_trip
    from texir.orchestrate import lower

    assert_text_round_trip(native_lowered(name), f"{name} (native XNNPACK)")
    assert_text_round_trip(lower(quantized(name)[0], []).program, f"{name} (no partitioner)")


def test_a_refused_op_keeps_its_q_dq_explicit() -> None:
    """The mean without keepdim stays out, so the quantize after it starts the second partition
    as an explicit Convert fed by an external fp32 input (not an implicit q)."""
    program = native_lowered("convnet_flat_mean")
    assert len(program.lowered_modules) == 2
    graph = decode_blob(program.lowered_modules[1].module.processed_bytes)
    first = graph.xnodes[0].xnode_union
    assert isinstance(first, s.XNNConvert) and first.input_id in graph.input_ids


def test_quantized_values_in_the_blob() -> None:
    """What the per-channel conv net's blob holds: qint8 activations with their per-tensor params,
    qcint8 filters and qcint32 biases whose scales are `scale_<sha256>` named data."""
    import hashlib

    module = native_lowered("convnet_pc").lowered_modules[0].module
    graph = decode_blob(module.processed_bytes)
    named = {e.key: e.data for e in module.named_data}
    kinds = set()
    for v in graph.xvalues:
        u = v.xvalue_union
        if isinstance(u, s.XNNQuantizedTensorValue):
            assert u.tensor_value is not None
            kinds.add((u.tensor_value.datatype, type(u.quant_params).__name__))
            if isinstance(u.quant_params, s.PerChannelQuant):
                entry = graph.constant_data[u.quant_params.scale_buffer_idx]
                data = named[entry.named_key]
                assert data is not None and entry.named_key == "scale_" + hashlib.sha256(data.tobytes()).hexdigest()
                assert entry.size == 4 * u.quant_params.num_scales
    assert kinds == {
        (s.XNNDatatype.xnn_datatype_qint8, "PerTensorQuant"),
        (s.XNNDatatype.xnn_datatype_qcint8, "PerChannelQuant"),
        (s.XNNDatatype.xnn_datatype_qcint32, "PerChannelQuant"),
    }
    converts = [n for n in graph.xnodes if isinstance(n.xnode_union, s.XNNConvert)]
    assert len(converts) == 2  # the input's quantize and the output's dequantize; the rest are implicit


def test_native_int8_pte_runs_bitwise_as_executorchs() -> None:
    """The native .pte in the ExecuTorch 1.5.1 runtime: outputs bitwise those of the .pte ExecuTorch's
    own pipeline (to_edge_transform_and_lower + to_executorch) writes."""
    from tests.xnnpack_oracle import executorch_xnnpack, run_pte

    ep, args = quantized("convnet_pc")
    reference = executorch_xnnpack(ep)
    assert reference.pte is not None, reference.error
    mine, theirs = run_pte(pte(native_lowered("convnet_pc")), args)[0], run_pte(reference.pte, args)[0]
    assert mine and len(mine) == len(theirs)
    for a, b in zip(mine, theirs, strict=True):
        assert torch.equal(a, b)
    assert torch.allclose(mine[0], ep.module()(*args), atol=0.1)  # int8 kernels vs the float simulation of q/dq


# -- what the native backend does not take ---------------------------------------------------------


def test_a_slice_whose_quantize_changes_the_params_is_turned_down() -> None:
    """XNNPACK's int8 slice keeps its input's quantization: with another scale on the quantize after
    it (edited into ExecuTorch's sub-program), the slice is turned down with the reason, as
    ExecuTorch's config turns it down."""
    from texir.ir import FloatArg

    program = executorch_lowered("slice_conv_pc").lowered_modules[0].module.original_program
    reasons = partitioner().reasons(program)
    (slice_node,) = [n for n in program.graph.nodes if getattr(n, "target", "") == "aten::slice_copy.Tensor"]
    assert slice_node.name not in reasons
    (q,) = [n for n in program.graph.nodes if isinstance(n, CallFunction) and Ref(name=slice_node.name) in n.args]

    def rescaled(n: Any) -> Any:
        return msgspec.structs.replace(n, args=(n.args[0], FloatArg(value=0.5), *n.args[2:])) if n is q else n

    edited = msgspec.structs.replace(program, graph=msgspec.structs.replace(
        program.graph, nodes=tuple(rescaled(n) for n in program.graph.nodes)))
    why = partitioner().reasons(edited).get(slice_node.name, "")
    assert why.startswith("XNNPACK's static-int8 slice needs the quantize after it to have its input's")


def test_a_nonzero_pad_before_a_quantized_conv_is_turned_down() -> None:
    """Only a zero padding joins a quantized convolution's pattern: with another pad value (edited
    into ExecuTorch's sub-program) the convolution is turned down with the reason."""
    from texir.ir import FloatArg

    program = executorch_lowered("same_pad_conv_pc").lowered_modules[0].module.original_program
    (pad,) = [n for n in program.graph.nodes if getattr(n, "target", "") == "aten::constant_pad_nd.default"]
    (conv,) = [n for n in program.graph.nodes if isinstance(n, CallFunction) and Ref(name=pad.name) in n.args]
    assert not partitioner().reasons(program)

    def ones(n: Any) -> Any:
        return msgspec.structs.replace(n, args=(*n.args[:2], FloatArg(value=1.0))) if n is pad else n

    edited = msgspec.structs.replace(program, graph=msgspec.structs.replace(
        program.graph, nodes=tuple(ones(n) for n in program.graph.nodes)))
    why = partitioner().reasons(edited).get(conv.name, "")
    assert why.startswith("a padding before a quantized convolution must pad the spatial dims"), why


def test_dynamic_values_in_the_blob() -> None:
    """The dynamic MLP's blob: each run-time quantize is a Convert from the fp32 value to a qdint8 one
    (per token, 1 non-batch dim) carrying the quantize's debug handle; the linears read it with qcint8
    filters and fp32 biases; the dequantizes, choose_qparams and getitems emit nothing."""
    program = native_lowered("mlp_dynamic_3d")
    (lowered,) = program.lowered_modules
    graph = decode_blob(lowered.module.processed_bytes)
    values = [v.xvalue_union for v in graph.xvalues]
    kinds = [type(n.xnode_union).__name__ for n in graph.xnodes]
    assert kinds == ["XNNConvert", "XNNFullyConnected", "XNNConvert", "XNNFullyConnected"]
    sub = lowered.module.original_program.graph
    quantizes = [h for n, h in zip(sub.nodes, sub.debug_handles())
                 if getattr(n, "target", "") == "quantized_decomposed::quantize_per_tensor.tensor"]
    assert [n.debug_handle for n in graph.xnodes if isinstance(n.xnode_union, s.XNNConvert)] == quantizes
    for node in graph.xnodes:
        u = node.xnode_union
        if isinstance(u, s.XNNConvert):
            src, out = values[u.input_id], values[u.output_id]
            assert isinstance(src, s.XNNTensorValue) and src.datatype == s.XNNDatatype.xnn_datatype_fp32
            assert isinstance(out, s.XNNQuantizedTensorValue) and out.tensor_value is not None
            assert out.tensor_value.datatype == s.XNNDatatype.xnn_datatype_qdint8
            assert out.quant_params == s.PerTokenDynamicQuant(num_nonbatch_dims=1)
            assert out.tensor_value.dims[:2] == (2, 3)
        elif isinstance(u, s.XNNFullyConnected):
            x, w, b = values[u.input1_id], values[u.filter_id], values[u.bias_id]
            assert isinstance(x, s.XNNQuantizedTensorValue) and isinstance(x.quant_params, s.PerTokenDynamicQuant)
            assert isinstance(w, s.XNNQuantizedTensorValue) and isinstance(w.quant_params, s.PerChannelQuant)
            assert w.tensor_value is not None and w.tensor_value.datatype == s.XNNDatatype.xnn_datatype_qcint8
            assert isinstance(b, s.XNNTensorValue) and b.datatype == s.XNNDatatype.xnn_datatype_fp32
    assert graph.xnodes[1].output_min_max is not None  # the relu is fused into the first linear


def test_native_dynamic_int8_pte_runs_bitwise_as_executorchs() -> None:
    """The dynamic MLP (a 3-D input batch) in the runtime: outputs bitwise those of ExecuTorch's own
    pipeline's .pte."""
    from tests.xnnpack_oracle import executorch_xnnpack, run_pte

    ep, args = quantized("mlp_dynamic_3d")
    reference = executorch_xnnpack(ep)
    assert reference.pte is not None, reference.error
    mine, theirs = run_pte(pte(native_lowered("mlp_dynamic_3d")), args)[0], run_pte(reference.pte, args)[0]
    assert mine and len(mine) == len(theirs)
    for a, b in zip(mine, theirs, strict=True):
        assert torch.equal(a, b)
    assert torch.allclose(mine[0], ep.module()(*args), atol=0.05)


def test_dynamic_int8_can_be_turned_off_and_runs_as_portable_kernels() -> None:
    """Without 'dynamic_int8' the dynamic linear is turned down with the reason; what stays out runs
    as portable kernels (the per-channel dequantize of the weights among them, through its out
    variant from ExecuTorch's quantized kernels)."""
    from texir.adapters import from_exported_program
    from texir.orchestrate import lower
    from tests.xnnpack_oracle import run_pte, texir_partitions

    ep, args = quantized(DYNAMIC)
    options = partitioner(config_precisions=("fp32", "static_int8"))
    reasons = options.reasons(from_exported_program(ep))
    assert reasons.get("linear") == "dynamic_int8 is not in config_precisions", reasons
    with registered():
        program = lower(ep, [options]).program
    assert not any("linear" in op for p in texir_partitions(program) for op in p)
    out = run_pte(pte(program), args)[0][0]
    assert torch.allclose(out, ep.module()(*args), atol=0.1)


def test_a_dynamic_convolution_is_left_undelegated_with_the_reason() -> None:
    """lower's report names the reason; the convolution runs as portable kernels."""
    from texir.orchestrate import lower
    from tests.xnnpack_oracle import run_pte, texir_partitions

    ep, args = quantized(DYNAMIC_CONV)
    with registered():
        result = lower(ep, [partitioner()])
    conv = [u.detail for u in result.report.undelegated if u.target == "aten::convolution.default" and u.reason == "turned_down"]
    assert conv and all(why.startswith("dynamically quantized convolutions are not yet supported") for why in conv)
    assert not any("convolution" in op for p in texir_partitions(result.program) for op in p)
    out = run_pte(pte(result.program), args)[0][0]
    assert torch.allclose(out, ep.module()(*args), atol=0.1)


def test_static_int8_can_be_turned_off() -> None:
    """config_precisions=('fp32',): no q/dq node and no quantized GEMM is delegated."""
    from texir.orchestrate import lower
    from tests.xnnpack_oracle import texir_partitions

    with registered():
        program = lower(quantized("linear")[0], [partitioner(config_precisions=("fp32",))]).program
    assert not any("quantize" in op for p in texir_partitions(program) for op in p)


def _forced(name: str, edit: Callable[[Any], Any]) -> Program:
    """ExecuTorch's sub-program of `name` with every call node passed through `edit`."""
    program = executorch_lowered(name).lowered_modules[0].module.original_program
    nodes = tuple(edit(n) for n in program.graph.nodes)
    return msgspec.structs.replace(program, graph=msgspec.structs.replace(program.graph, nodes=nodes))


@pytest.mark.parametrize("name", ["linear_relu_pc", DYNAMIC])
def test_a_4bit_weight_forced_into_a_partition_is_a_typed_error_naming_the_node(name: str) -> None:
    """A per-channel weight dequantize with 4-bit bounds (qmin -8, qmax 7) that the native
    partitioner would leave out (static or dynamic activations): the backend names the node before
    writing any bytes."""

    def four_bit(n: Any) -> Any:
        if getattr(n, "target", "") == "quantized_decomposed::dequantize_per_channel.default":
            return msgspec.structs.replace(n, args=(*n.args[:4], IntArg(value=-8), IntArg(value=7), n.args[6]))
        return n

    with pytest.raises(XnnpackUnsupportedError, match=r"dequantize_per_channel.*not supported") as info:
        XnnpackNativeBackend().preprocess(_forced(name, four_bit), ())
    assert info.value.node == "quantized_decomposed_dequantize_per_channel_default"


def test_a_tensor_dequantize_not_fed_by_choose_qparams_is_a_typed_error() -> None:
    """A dequantize_per_tensor.tensor whose scale is not a choose_qparams's output (not dynamic
    quantization) forced into a partition: the backend names it before writing any bytes."""

    def constant_scale(n: Any) -> Any:
        if getattr(n, "target", "") == "quantized_decomposed::dequantize_per_tensor.tensor":
            return msgspec.structs.replace(n, args=(n.args[0], Ref(name="p_fc_bias"), *n.args[2:]))
        return n

    with pytest.raises(XnnpackUnsupportedError, match="not a choose_qparams's outputs") as info:
        XnnpackNativeBackend().preprocess(_forced(DYNAMIC, constant_scale), ())
    assert info.value.node == "quantized_decomposed_dequantize_per_tensor_tensor"


def test_a_uint8_activation_forced_into_a_partition_is_a_typed_error() -> None:
    def uint8(n: Any) -> Any:
        if getattr(n, "target", "").startswith("quantized_decomposed::") and "per_tensor" in n.target:
            # a zero point in uint8's range: ExecuTorch's validate_quant_zeropoints (tests/test_xnnpack_checks.py) passes
            return msgspec.structs.replace(
                n, args=(*n.args[:2], IntArg(value=128), *n.args[3:-1], DTypeArg(value=DType.uint8)))
        return n

    with pytest.raises(XnnpackUnsupportedError, match="uint8 quantization.*int8 static only") as info:
        XnnpackNativeBackend().preprocess(_forced("linear", uint8), ())
    assert info.value.node is not None and "quantize" in info.value.node
