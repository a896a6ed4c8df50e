"""The native XNNPACK backend refuses what ExecuTorch 1.5.1's XNNPACK preprocess refuses, with a typed
error naming the node, the check and the fix, before any bytes are written (docs/xnnpack-checks.md).

Each case is a tiny pt2e model made wrong the way a user (or a broken quantizer) makes it: never run
before convert_pt2e, or one quantization parameter changed in the exported program. The same program
goes once through ExecuTorch's own partitioner and backend (through texir's bridge), which raise too.
"""

from __future__ import annotations

import copy
import functools
import pathlib
from collections.abc import Callable

import msgspec
import pytest
import torch
from torch import nn

from tests.real_models import pattern_graphs_reused
from texir.backends.xnnpack.backend import XnnpackNativeBackend, registered
from texir.backends.xnnpack.checks import CHECKS
from texir.backends.xnnpack.errors import XnnpackCheckError
from texir.backends.xnnpack.partitioner import partitioner
from texir.cli.main import main
from texir.ir import CallFunction, IntArg, ListArg, Program
from texir.ir.types import Argument
from texir.lowering.errors import BackendPreprocessError
from texir.orchestrate import lower

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "xnnpack-checks.md"
_ARGS = (torch.randn(2, 32, generator=torch.Generator().manual_seed(1)),)


class _Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


@functools.lru_cache(maxsize=None)
def _quantized(*, dynamic: bool, per_channel: bool, calibrate: bool) -> torch.export.ExportedProgram:
    """A linear 32 -> 64 through XNNPACKQuantizer and torchao's pt2e prepare/convert, then exported."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(0)
    module = _Linear().eval()
    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=per_channel, is_dynamic=dynamic))
    with pattern_graphs_reused():
        prepared = prepare_pt2e(torch.export.export(module, _ARGS, strict=False).module(), quantizer)  # type: ignore[arg-type]  # a GraphModule from export
    if calibrate:
        prepared(*_ARGS)
    return torch.export.export(convert_pt2e(prepared), _ARGS, strict=False)


def _uncalibrated_dynamic() -> torch.export.ExportedProgram:
    """"Dynamic needs no calibration": the per-channel weights get one scale for 64 channels."""
    return _quantized(dynamic=True, per_channel=True, calibrate=False)


def _with_constant(name: str, make: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], torch.export.ExportedProgram]:
    """The calibrated static per-channel linear with one lifted constant (scales, zero points) replaced."""

    def build() -> torch.export.ExportedProgram:
        ep = copy.deepcopy(_quantized(dynamic=False, per_channel=True, calibrate=True))
        for table in (ep.state_dict, ep.constants):
            if name in table:
                table[name] = make(table[name])
                return ep
        raise AssertionError(f"no constant {name!r} in {sorted(ep.state_dict)} {sorted(ep.constants)}")

    return build


def _with_input_qparams(index: int, value: object) -> Callable[[], torch.export.ExportedProgram]:
    """The calibrated static per-tensor linear with argument `index` (1: scale, 2: zero point) of the
    input's quantize and dequantize set to `value` (both, so they stay one pair)."""

    def build() -> torch.export.ExportedProgram:
        ep = copy.deepcopy(_quantized(dynamic=False, per_channel=False, calibrate=True))
        x = next(n for n in ep.graph.nodes if n.op == "placeholder" and n.name == "x")
        q = next(iter(x.users))
        for node in (q, *q.users):
            args = list(node.args)
            args[index] = value
            node.args = tuple(args)
        ep.graph_module.recompile()
        return ep

    return build


# check id: (program, what ExecuTorch's error says)
CASES: dict[str, tuple[Callable[[], torch.export.ExportedProgram], str]] = {
    "per_channel_scales": (_uncalibrated_dynamic, "Invalid size of per channel quantization scales"),
    "per_channel_zero_points": (
        _with_constant("_zero_point_0", lambda t: t[:1].clone()), "Invalid size of per channel quantization zero-points"),
    "finite_normal_scales": (_with_constant("_scale_0", lambda t: torch.cat([t[:3], torch.zeros(1), t[4:]])),
                             "Scales must be finite and normal"),
    "zero_point_range": (_with_input_qparams(2, 300), "Found invalid zeropoint"),
}
PER_TENSOR_SCALES: dict[str, float] = {
    "zero": 0.0, "infinite": float("inf"), "nan": float("nan"), "float32_subnormal": 1e-39, "beyond_float32": 1e39}


def _native_refusal(ep: torch.export.ExportedProgram) -> XnnpackCheckError:
    with registered(), pytest.raises(BackendPreprocessError) as info:
        lower(ep, [partitioner()], cache=None)
    cause = info.value.__cause__
    assert isinstance(cause, XnnpackCheckError), repr(info.value)
    return cause


@pytest.mark.parametrize("check", sorted(CASES))
def test_native_refuses_what_executorch_refuses(check: str) -> None:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from texir.executorch import executorch_partitioner

    build, theirs = CASES[check]
    error = _native_refusal(build())
    assert error.check == check and error.node and error.node in str(error)
    assert "ExecuTorch's XNNPACK backend refuses it too" in str(error)
    with pytest.raises(BackendPreprocessError, match=theirs):
        lower(build(), [executorch_partitioner(XnnpackPartitioner())], cache=None)


def test_an_uncalibrated_model_is_told_to_run_the_prepared_model() -> None:
    error = _native_refusal(_uncalibrated_dynamic())
    assert "1 per-channel scales along axis 0 of a tensor of shape [64, 32] (64 channels)" in str(error)
    assert "run the prepared model on example inputs before convert_pt2e" in str(error)
    assert error.op == "quantized_decomposed::dequantize_per_channel.default"


@pytest.mark.parametrize("kind", sorted(PER_TENSOR_SCALES))
def test_a_per_tensor_scale_that_is_not_finite_and_normal_is_refused(kind: str) -> None:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from texir.executorch import executorch_partitioner

    build = _with_input_qparams(1, PER_TENSOR_SCALES[kind])
    error = _native_refusal(build())
    assert error.check == "finite_normal_scales", error
    with pytest.raises(BackendPreprocessError, match="Scales must be finite and normal"):
        lower(build(), [executorch_partitioner(XnnpackPartitioner())], cache=None)


def test_a_float32_normal_scale_passes() -> None:
    """The bound is float32's smallest normal number, as torch judges a Python float scale."""
    with registered():
        lower(_with_input_qparams(1, 1.2e-38)(), [partitioner()], cache=None)


def test_the_cli_writes_nothing_for_a_refused_model(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, out = tmp_path / "uncalibrated.pt2", tmp_path / "model.pte"
    torch.export.save(_uncalibrated_dynamic(), model)
    assert main(["lower", str(model), "--partitioner", "xnnpack", "--no-cache", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "XnnpackCheckError" in err and "run the prepared model on example inputs before convert_pt2e" in err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["uncalibrated.pt2"]


def test_every_check_is_in_the_audit_table_with_a_test_or_why_it_is_unreachable() -> None:
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| ")]
    tests = {name for name, value in globals().items() if name.startswith("test_") and callable(value)}
    for check in CHECKS:
        row = next((r for r in rows if f"`{check}`" in r), None)
        assert row is not None, f"docs/xnnpack-checks.md does not list the native check {check!r}"
        named = {word.strip("`,").split("[")[0] for word in row.split() if word.strip("`,").startswith("test_")}
        assert named or "Not reachable" in row, f"{check}: no test named and no reason: {row}"
    for test in tests - {"test_every_check_is_in_the_audit_table_with_a_test_or_why_it_is_unreachable"}:
        assert test in DOC.read_text(), f"{test} is not in the audit table"


class _MaxPool3d(nn.Module):
    """max_pool2d of an unbatched (C, H, W) input: XNNPACK pools 4-D channels-last tensors only."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.max_pool2d(x * 2, 2)


class _Conv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv2d(4, 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(x)


# check id: (module, input shape, what ExecuTorch's error chain says)
FLOAT_CASES: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...], str]] = {
    "nhwc_compatible": (_MaxPool3d, (2, 4, 4), "Attempting to convert non-NHWC compatible node to NHWC"),
    # a model moved to channels_last: its conv weight is a channels-last placeholder
    "channels_last_inputs": (lambda: _Conv().to(memory_format=torch.channels_last), (1, 4, 6, 6),
                             "to be NCHW in channels last reshape pass"),
}


def _chain(error: BaseException) -> str:
    """The messages of an error and its causes."""
    messages: list[str] = []
    current: BaseException | None = error
    while current is not None:
        messages.append(str(current))
        current = current.__cause__ or current.__context__
    return "\n".join(messages)


@pytest.mark.parametrize("check", sorted(FLOAT_CASES))
def test_native_refuses_the_float_graphs_executorch_refuses(check: str) -> None:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from texir.executorch import executorch_partitioner

    make, shape, theirs = FLOAT_CASES[check]
    args = (torch.randn(*shape, generator=torch.Generator().manual_seed(2)),)
    ep = torch.export.export(make().eval(), args, strict=False)
    error = _native_refusal(copy.deepcopy(ep))
    assert error.check == check and error.node is not None and error.node in str(error), error
    with pytest.raises(BackendPreprocessError) as info:
        lower(ep, [executorch_partitioner(XnnpackPartitioner())], cache=None)
    assert theirs in _chain(info.value)


class _Reshapes(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 2).view(2, 8).unsqueeze(-1)


@functools.lru_cache(maxsize=None)
def _reshapes_partition() -> Program:
    """The native partition of `_Reshapes` (mul, view, unsqueeze), as the backend receives it."""
    ep = torch.export.export(_Reshapes(), (torch.randn(4, 4),), strict=False)
    with registered():
        (module,) = lower(ep, [partitioner()], cache=None).program.lowered_modules
    return module.module.original_program


def _edited(target: str, index: int, value: Argument) -> Program:
    program = _reshapes_partition()
    nodes = tuple(
        msgspec.structs.replace(n, args=tuple(value if i == index else a for i, a in enumerate(n.args)))
        if isinstance(n, CallFunction) and n.target == target else n for n in program.graph.nodes)
    return msgspec.structs.replace(program, graph=msgspec.structs.replace(program.graph, nodes=nodes))


# check id: (target, argument index, new argument); forced: texir's partitioner turns these down
FORCED: dict[str, tuple[str, int, Argument]] = {
    "squeeze_last_dim": ("aten::unsqueeze_copy.default", 1, IntArg(value=0)),
    "reshape_dynamic_dims": ("aten::view_copy.default", 1, ListArg(items=(IntArg(value=-1), IntArg(value=0)))),
}


@pytest.mark.parametrize("check", sorted(FORCED))
def test_a_graph_forced_past_the_partitioner_is_refused_by_the_backend(check: str) -> None:
    XnnpackNativeBackend().preprocess(_reshapes_partition(), ())  # as partitioned: fine
    with pytest.raises(XnnpackCheckError) as info:
        XnnpackNativeBackend().preprocess(_edited(*FORCED[check]), ())
    assert info.value.check == check and info.value.op == FORCED[check][0]


def test_a_q_dq_of_another_dtype_forced_into_a_partition_is_refused() -> None:
    """int16 q/dq around the static linear (texir's partitioner takes int8 only): ExecuTorch's
    validate_quant_zeropoints raises "Unsupported dtype for quantization", native names the node."""
    from tests.test_xnnpack_native_quant import _forced
    from texir.ir import DType, DTypeArg

    def int16(n: object) -> object:
        if isinstance(n, CallFunction) and n.target.startswith("quantized_decomposed::") and "per_tensor" in n.target:
            return msgspec.structs.replace(n, args=(*n.args[:-1], DTypeArg(value=DType.int16)))
        return n

    with pytest.raises(XnnpackCheckError) as info:
        XnnpackNativeBackend().preprocess(_forced("linear", int16), ())
    assert info.value.check == "quantized_dtype" and info.value.node and "quantize" in info.value.node
