"""texir's own XNNPACK backend (`texir.backends.xnnpack`) against ExecuTorch 1.5.1's.

The oracle is ExecuTorch's XnnpackBackend run by texir on the same partitions (the sub-programs
`lower(ep, [executorch_partitioner(XnnpackPartitioner())])` leaves): its blobs and named data.
"""

from __future__ import annotations

import functools
import os
import pathlib
import subprocess
import sys
import textwrap
from typing import Any

import msgspec
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
from texir.backends.xnnpack.backend import XnnpackNativeBackend, build_graph
from texir.backends.xnnpack.errors import XnnpackCompileSpecError, XnnpackUnsupportedError
from texir.backends.xnnpack import registered
from texir.backends.xnnpack.partitioner import partitioner
from texir.ir import CompileSpec, LoweredBackendModule, Program
from texir.lowering.errors import PartitionerError

ROUND_TRIP = ["mlp", "deep_mlp", "convnet", "resnet_tiny", "attention", "cat_stack"]
BYTE_EQUAL = ["mlp", "conv_bn", "convnet", "attention", "dynamic_mlp", "matmul_variants", "pad_slice"]
"""Zoo models whose every ExecuTorch partition the native backend compiles to the same bytes (the
backend alone, on ExecuTorch's partitions; partitioner and backend together on every zoo, real and
quantized model: tests/test_executorch_backends*.py)."""
SAME_PTE = ["mlp", "conv_bn", "convnet", "attention", "transformer_block", "buffers"]
"""Zoo models the native partitioner and backend lower to ExecuTorch's very .pte."""


@functools.lru_cache(maxsize=None)
def executorch_lowered(name: str) -> Program:
    """Zoo model `name` lowered by ExecuTorch's partitioner and backend (through texir)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from tests.zoo import cached_export
    from texir.executorch import executorch_partitioner
    from texir.orchestrate import lower

    return lower(cached_export(name, decompose=False), [executorch_partitioner(XnnpackPartitioner())]).program


def executorch_modules(name: str) -> tuple[LoweredBackendModule, ...]:
    return tuple(m.module for m in executorch_lowered(name).lowered_modules)


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


def test_inspect_shows_a_delegates_nodes() -> None:
    from texir.backends.xnnpack.inspect import format_blob

    text = format_blob(executorch_modules("convnet")[0].processed_bytes)
    assert "%0: f32[2, 3, 12, 12] input ext=0" in text
    assert "StaticTranspose(num_dims=4, perm=(0, 2, 3, 1), input_id=%0, output_id=%1)  # dh=65535" in text
    assert "FullyConnected(input1_id=%11, filter_id=%12, bias_id=%13, output_id=%14)  # dh=10" in text


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
        from texir.backends.xnnpack import backend, flatbuffer, graph, partitioner, partition_order, serialize
        from texir.backends.xnnpack import batch_norm, channels_last, int4, op_checks, per_op, quant, quant_partition, visitors
        bad = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "executorch"))
        assert not bad, bad
    """)
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))


# -- the backend against ExecuTorch's -------------------------------------------------------------


@pytest.mark.parametrize("name", BYTE_EQUAL)
def test_native_blobs_and_named_data_equal_executorchs(name: str) -> None:
    backend = XnnpackNativeBackend()
    for module in executorch_modules(name):
        result = backend.preprocess(module.original_program, module.compile_specs)
        assert result.processed_bytes == module.processed_bytes
        assert [(e.key, e.alignment) for e in result.named_data] == [(e.key, e.alignment) for e in module.named_data]
        for mine, theirs in zip(result.named_data, module.named_data, strict=True):
            assert mine.data is not None and theirs.data is not None
            assert mine.data.tobytes() == theirs.data.tobytes()
        assert result.debug_handle_map is None  # ExecuTorch's XnnpackBackend returns an empty map


def test_unchanged_weights_are_the_programs_own_payloads() -> None:
    """A weight stored as it is (linear) is the IR's Blob, not a copy; a transformed one (a conv
    filter in NHWC) is a new payload."""
    module = executorch_modules("convnet")[0]
    program = module.original_program
    result = XnnpackNativeBackend().preprocess(program, ())
    payloads = {id(e.value.data) for e in program.state}
    stored = [id(e.data) in payloads for e in result.named_data]
    assert any(stored) and not all(stored)


@functools.lru_cache(maxsize=None)
def native_lowered(name: str) -> Program:
    """Zoo model `name` lowered by the native partitioner and backend, registered as XnnpackBackend
    for this call only."""
    from tests.zoo import cached_export
    from texir.backends.xnnpack import registered
    from texir.orchestrate import lower

    # (registered() puts back what was there, with its flag: a registry restored by hand once
    # turned the bridge's implicit ExecuTorch backend into the user's choice for later tests)
    with registered():
        return lower(cached_export(name, decompose=False), [partitioner()]).program


@pytest.mark.parametrize("name", SAME_PTE)
def test_native_lowering_writes_executorchs_pte(name: str) -> None:
    """Native partitioner + backend: the same partitions, in the same order, as XnnpackPartitioner,
    and a .pte byte-equal to the one ExecuTorch's partitioner and backend give."""
    from tests.xnnpack_oracle import texir_partitions
    from texir.emit import emit
    from texir.serialize.pte.codec import dumps

    mine, theirs = native_lowered(name), executorch_lowered(name)
    assert texir_partitions(mine) == texir_partitions(theirs)
    assert dumps(emit(mine)) == dumps(emit(theirs))


def test_native_pte_runs_in_the_executorch_runtime() -> None:
    """The native .pte runs in the ExecuTorch 1.5.1 runtime, outputs bitwise those of ExecuTorch's."""
    import torch

    from tests.xnnpack_oracle import run_pte
    from tests.zoo import zoo_model
    from texir.emit import emit
    from texir.serialize.pte.codec import dumps

    for name in ("convnet", "attention"):
        args = zoo_model(name).build()[1]
        mine = run_pte(dumps(emit(native_lowered(name))), args)[0]
        theirs = run_pte(dumps(emit(executorch_lowered(name))), args)[0]
        assert mine and len(mine) == len(theirs)
        for a, b in zip(mine, theirs, strict=True):
            assert torch.equal(a, b)


def test_turned_down_nodes_carry_a_reason() -> None:
    from tests.zoo import cached_export
    from texir.adapters import from_exported_program

    program = from_exported_program(cached_export("cat_stack"))
    reasons = partitioner().reasons(program)
    assert reasons and all(isinstance(why, str) and why for why in reasons.values())
    assert any("aten::sum.dim_IntList has no XNNPACK config" in why for why in reasons.values()), reasons


def test_partitioner_options_are_validated() -> None:
    with pytest.raises(PartitionerError, match="per_op_mod"):
        partitioner(per_op_mod=True)
    with pytest.raises(PartitionerError, match="takes 'fp32' with optionally 'static_int8'"):
        partitioner(config_precisions=("static_int8",))
    with pytest.raises(PartitionerError, match="4-bit weights"):
        partitioner(config_precisions=("fp32", "int4"))
    partitioner(config_precisions=("fp32", "dynamic_int8"))


_BLOCKED_LOWERING = """
import importlib.abc, sys

class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "executorch":
            raise ImportError(f"executorch is blocked in this test ({name})")
        return None

sys.meta_path.insert(0, _Block())
from tests.zoo import cached_export
from texir.backends import xnnpack
from texir.emit import emit
from texir.orchestrate import lower
from texir.serialize.pte.codec import dumps

xnnpack.register()
program = lower(cached_export("convnet", decompose=False), [xnnpack.partitioner()], cache=None).program
assert [m.module.backend_id for m in program.lowered_modules] == ["XnnpackBackend"]
open(sys.argv[1], "wb").write(dumps(emit(program)))
assert not [m for m in sys.modules if m.split(".")[0] == "executorch"]
"""


def test_native_lowering_needs_no_executorch(tmp_path: pathlib.Path) -> None:
    """A fresh interpreter where importing executorch fails lowers convnet natively and writes the
    .pte ExecuTorch's partitioner and backend write."""
    from texir.emit import emit
    from texir.serialize.pte.codec import dumps

    out = tmp_path / "convnet.pte"
    root = pathlib.Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    subprocess.run([sys.executable, "-c", _BLOCKED_LOWERING, str(out)], check=True, env=env, cwd=root)
    assert out.read_bytes() == dumps(emit(executorch_lowered("convnet")))


# -- bad input -------------------------------------------------------------------------------------


def test_an_op_without_a_visitor_is_a_typed_error_naming_node_and_op() -> None:
    module = executorch_modules("mlp")[0]
    program = module.original_program
    graph = program.graph
    nodes = tuple(
        msgspec.structs.replace(n, target="aten::erf.default") if getattr(n, "target", "") == "aten::relu.default"
        else n
        for n in graph.nodes
    )
    bad = msgspec.structs.replace(program, graph=msgspec.structs.replace(graph, nodes=nodes))
    with pytest.raises(XnnpackUnsupportedError, match=r"aten_relu_default.*aten::erf\.default") as info:
        XnnpackNativeBackend().preprocess(bad, ())
    assert info.value.node == "aten_relu_default" and info.value.op == "aten::erf.default"


def test_unknown_compile_specs_are_refused() -> None:
    program = executorch_modules("mlp")[0].original_program
    with pytest.raises(XnnpackCompileSpecError, match="'dqlinear_partitioner'"):
        build_graph(program, (CompileSpec(key="dqlinear_partitioner", value=b""),))


# -- float ops beyond the zoo ----------------------------------------------------------------------


def _lowered_both_ways(module: Any, args: tuple[Any, ...]) -> tuple[Program, Program]:
    """A tiny model lowered by the native partitioner and backend, and by ExecuTorch's."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from texir.executorch import executorch_partitioner
    from texir.backends.xnnpack import registered
    from texir.orchestrate import lower

    torch.manual_seed(0)
    ep = torch.export.export(module.eval(), args, strict=False)
    theirs = lower(ep, [executorch_partitioner(XnnpackPartitioner())]).program
    with registered():
        mine = lower(ep, [partitioner()]).program
    return mine, theirs


def assert_lowers_like_executorch(module: Any, args: tuple[Any, ...]) -> Program:
    """Same partitions as ExecuTorch's partitioner (at least one), each blob and its named data
    byte-equal to ExecuTorch's backend's, and runtime outputs bitwise equal. Returns the native program."""
    import torch

    from tests.xnnpack_oracle import run_pte, texir_partitions
    from texir.emit import emit
    from texir.serialize.pte.codec import dumps

    mine, theirs = _lowered_both_ways(module, args)
    assert texir_partitions(mine) == texir_partitions(theirs)
    assert len(mine.lowered_modules) == len(theirs.lowered_modules) >= 1
    for a, b in zip(mine.lowered_modules, theirs.lowered_modules, strict=True):
        assert a.module.processed_bytes == b.module.processed_bytes
        assert [(e.key, e.alignment) for e in a.module.named_data] == [(e.key, e.alignment) for e in b.module.named_data]
        for x, y in zip(a.module.named_data, b.module.named_data, strict=True):
            assert x.data is not None and y.data is not None and x.data.tobytes() == y.data.tobytes()
    outputs_mine = run_pte(dumps(emit(mine)), args)[0]
    outputs_theirs = run_pte(dumps(emit(theirs)), args)[0]
    assert outputs_mine and len(outputs_mine) == len(outputs_theirs)
    for p, q in zip(outputs_mine, outputs_theirs, strict=True):
        assert torch.equal(p, q)
    return mine


def _blob_nodes(program: Program) -> list[Any]:
    return [x.xnode_union for m in program.lowered_modules for x in decode_blob(m.module.processed_bytes).xnodes]


def test_leaky_relu_default_and_given_slope() -> None:
    import torch
    from torch import nn

    class LeakyNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return nn.functional.leaky_relu(nn.functional.leaky_relu(self.fc(x)), 0.2)

    program = assert_lowers_like_executorch(LeakyNet(), (torch.randn(2, 8, generator=torch.Generator().manual_seed(1)),))
    slopes = [n.negative_slope for n in _blob_nodes(program) if isinstance(n, s.XNNLeakyReLU)]
    assert slopes == pytest.approx([0.01, 0.2])


@pytest.mark.parametrize("channels", [8, 1], ids=["per_channel", "shared"])
def test_prelu_per_channel_and_shared_slope(channels: int) -> None:
    import torch
    from torch import nn

    class PReLUNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.act = nn.Conv2d(3, 8, 3, padding=1), nn.PReLU(channels, init=0.1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.act(self.conv(x))

    x = torch.randn(1, 3, 6, 6, generator=torch.Generator().manual_seed(2))
    program = assert_lowers_like_executorch(PReLUNet(), (x,))
    assert any(isinstance(n, s.XNNPReLU) for n in _blob_nodes(program))


def test_elu_is_not_taken_as_executorch_1_5_1_leaves_its_config_off() -> None:
    """ExecuTorch 1.5.1 lists EluConfig but leaves it out of its configs: elu is decomposed and
    its parts are partitioned as ExecuTorch's partitioner does (no XNNELU node)."""
    import torch
    from torch import nn

    class EluNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return nn.functional.elu(self.fc(x), 0.5)

    program = assert_lowers_like_executorch(EluNet(), (torch.randn(2, 8, generator=torch.Generator().manual_seed(3)),))
    assert not any(isinstance(n, s.XNNELU) for n in _blob_nodes(program))


def test_a_memory_format_conversion_is_a_transpose() -> None:
    """`.to(memory_format=torch.channels_last)` (a dim-order copy in edge) is taken as ExecuTorch
    takes it: reverted to a memory-format copy, serialized as a static transpose."""
    import torch
    from torch import nn

    class ToChannelsLast(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(4, 4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(x).to(memory_format=torch.channels_last)
            return self.conv(y) + y

    x = torch.randn(1, 4, 4, 4, generator=torch.Generator().manual_seed(4))
    program = assert_lowers_like_executorch(ToChannelsLast(), (x,))
    assert any(isinstance(n, s.XNNStaticTranspose) for n in _blob_nodes(program))


def test_conv1d_is_lowered_as_conv2d_between_unsqueeze_and_squeeze() -> None:
    """A conv1d + relu (fused), a depthwise conv1d and a grouped transposed one: each a 2-D
    convolution over a trailing unit dim, its input reshaped up and its output reshaped back, as
    ExecuTorch's Conv1dUnsqueezePass does."""
    import torch
    from torch import nn

    class Conv1dNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1 = nn.Conv1d(4, 8, 3, padding=1)
            self.c2 = nn.Conv1d(8, 8, 3, stride=2, groups=8, bias=False)
            self.c3 = nn.ConvTranspose1d(8, 6, 3, stride=2, padding=1, output_padding=1, groups=2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c3(self.c2(torch.relu(self.c1(x))))

    x = torch.randn(2, 4, 10, generator=torch.Generator().manual_seed(4))
    program = assert_lowers_like_executorch(Conv1dNet(), (x,))
    nodes = _blob_nodes(program)
    assert [type(n) for n in nodes if "Conv" in type(n).__name__] == [
        s.XNNConv2d, s.XNNDepthwiseConv2d, s.XNNConvTranspose2d]
    assert any(isinstance(n, s.XNNStaticReshape) for n in nodes)


def test_conv1d_applied_twice_shares_one_weight() -> None:
    """One Conv1d called twice: both convolutions read the one weight, given its unit dim once."""
    import torch
    from torch import nn

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c = nn.Conv1d(4, 4, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c(torch.relu(self.c(x)))

    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from tests.xnnpack_oracle import run_pte
    from texir.emit import emit
    from texir.executorch import executorch_partitioner
    from texir.lowering.errors import BackendPreprocessError
    from texir.orchestrate import lower
    from texir.serialize.pte.codec import dumps

    module, x = Twice().eval(), torch.randn(1, 4, 9, generator=torch.Generator().manual_seed(5))
    ep = torch.export.export(module, (x,), strict=False)
    # ExecuTorch 1.5.1's Conv1dUnsqueezePass reshapes the shared weight at the first conv and then
    # fails retracing the second ("Expected 4-dimensional input for 4-dimensional weight").
    with pytest.raises(BackendPreprocessError, match="Conv1dUnsqueezePass"):
        lower(ep, [executorch_partitioner(XnnpackPartitioner())])
    with registered():
        program = lower(ep, [partitioner()]).program
    assert [type(n) for n in _blob_nodes(program) if "Conv" in type(n).__name__] == [s.XNNConv2d, s.XNNConv2d]
    (got,) = run_pte(dumps(emit(program)), (x,))[0]
    torch.testing.assert_close(got, module(x), rtol=1e-5, atol=1e-5)


def test_concatenations_of_more_than_5_inputs_are_split() -> None:
    """A cat of 7 channels-last tensors (after a conv) and one of 12 (some repeated): chains of
    Concatenate nodes of at most 5 inputs, as ExecuTorch's DecomposeConcatenate makes them."""
    import torch
    from torch import nn

    class WideCat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = self.conv(x)
            seven = torch.cat([y, torch.relu(y), y, torch.tanh(y), y, torch.sigmoid(y), y], dim=1)
            parts = [a, b, a * b, a + b, a - b, torch.relu(a), torch.tanh(b), a, b, torch.sigmoid(a), b, a]
            return seven, torch.cat(parts, dim=-1)

    g = torch.Generator().manual_seed(5)
    args = (torch.randn(1, 3, 5, 5, generator=g), torch.randn(2, 3, generator=g), torch.randn(2, 3, generator=g))
    program = assert_lowers_like_executorch(WideCat(), args)
    cats = [type(n).__name__ for n in _blob_nodes(program) if "Concatenate" in type(n).__name__]
    assert sorted(cats) == sorted(["XNNConcatenate5", "XNNConcatenate3"] + ["XNNConcatenate5"] * 2 + ["XNNConcatenate4"])


@pytest.mark.parametrize("align_corners", [False, True])
def test_upsample_bilinear2d(align_corners: bool) -> None:
    import torch
    from torch import nn

    class Upsample(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = nn.functional.interpolate(self.conv(x), scale_factor=2.0, mode="bilinear", align_corners=align_corners)
            return nn.functional.interpolate(y, size=(7, 9), mode="bilinear", align_corners=align_corners)

    x = torch.randn(1, 3, 4, 5, generator=torch.Generator().manual_seed(6))
    program = assert_lowers_like_executorch(Upsample(), (x,))
    sizes = [(n.new_height, n.new_width, n.flags) for n in _blob_nodes(program)
             if isinstance(n, s.XNNStaticResizeBilinear2D)]
    assert sizes == [(8, 10, 8 * align_corners), (7, 9, 8 * align_corners)]
