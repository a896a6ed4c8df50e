"""Every operator the native XNNPACK backend knows, one `OpSpec` each in `OPS`: what the partitioner
checks, which arguments are weights, which activations fuse, its layout class, its int8 pattern,
its node visitor and the op a backend pass rewrites it to. Every per-op table of the backend is
derived here (or, for the visitors, in `visitors.py` from `OpSpec.visitor`); no other module of the
backend spells an op (tests/test_xnnpack_ops.py greps for it)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal

import msgspec

from texir.backends.xnnpack import op_checks as c
from texir.backends.xnnpack import schema as s
from texir.ir.names import GETITEM

__all__ = [
    "AFFINE", "ACTIVATION_BOUNDS", "AMAX", "BN", "BROADCAST_OPS", "CAT", "CHECKS", "CHOOSE_QPARAMS", "CLAIMS",
    "CLONE", "CLONE_DIM_ORDER", "CONV", "DEQUANTIZE", "DQ_AFFINE", "DQ_PER_CHANNEL", "DQ_PER_TENSOR", "DYNAMIC_DQ",
    "DYNAMIC_Q", "FUSES", "GEMMS", "GETITEM", "INT8_GEMMS", "INT8_GENERIC", "INT8_IO", "KEPT_OPS", "LINEAR",
    "MAX_DIM", "NCHW_OPS", "NHWC_OPS", "OPS", "OpSpec", "PAD", "PARAMS", "PATTERN_CHECKS", "Q_AFFINE",
    "Q_PER_CHANNEL", "Q_PER_TENSOR", "QUANTIZE", "SPECS", "SQUEEZE", "TO_COPY", "TO_DIM_ORDER_COPY", "TUPLE_OPS",
    "UNSQUEEZE", "VisitorName",
]

# -- op strings used by name outside their entry (passes and visitors that rewrite or test for them) --

CONV: Final = "aten::convolution.default"
LINEAR: Final = "aten::linear.default"
BN: Final = "aten::_native_batch_norm_legit_no_training.default"
MAX_DIM: Final = "aten::max.dim"
AMAX: Final = "aten::amax.default"
CAT: Final = "aten::cat.default"
PAD: Final = "aten::constant_pad_nd.default"
CLONE: Final = "aten::clone.default"
CLONE_DIM_ORDER: Final = "dim_order_ops::_clone_dim_order.default"
TO_DIM_ORDER_COPY: Final = "dim_order_ops::_to_dim_order_copy.default"
TO_COPY: Final = "aten::_to_copy.default"
SQUEEZE: Final = "aten::squeeze_copy.dim"
UNSQUEEZE: Final = "aten::unsqueeze_copy.default"
RELU: Final = "aten::relu.default"
HARDTANH: Final = "aten::hardtanh.default"
Q_PER_TENSOR: Final = "quantized_decomposed::quantize_per_tensor.default"
DQ_PER_TENSOR: Final = "quantized_decomposed::dequantize_per_tensor.default"
Q_PER_CHANNEL: Final = "quantized_decomposed::quantize_per_channel.default"
DQ_PER_CHANNEL: Final = "quantized_decomposed::dequantize_per_channel.default"
Q_AFFINE: Final = "torchao::quantize_affine.default"
DQ_AFFINE: Final = "torchao::dequantize_affine.default"

VisitorName = Literal[
    "linear", "conv", "addmm", "mm", "binary", "unary", "leaky_relu", "upsample_bilinear", "softmax", "max_pool",
    "amax", "avg_pool", "mean", "view", "permute", "to_copy", "cat", "pad", "slice", "squeeze", "copy",
    "quantize", "dequantize", "dynamic_quantize", "dynamic_dequantize", "choose_qparams", "getitem",
]
"""The node visitors of `visitors.py` (and the q/dq ones of `qdq.py`) an entry can name; `binary` and
`unary` emit `OpSpec.xnn`."""

Bounds = Callable[[Sequence[Any]], tuple[float, float]]
"""An activation's output bounds from its (working-graph) arguments."""


def _relu_bounds(args: Sequence[Any]) -> tuple[float, float]:
    return (0.0, math.inf)


def _hardtanh_bounds(args: Sequence[Any]) -> tuple[float, float]:
    return (float(args[1]) if len(args) > 1 else -1.0, float(args[2]) if len(args) > 2 else 1.0)


def _clamp_bounds(args: Sequence[Any]) -> tuple[float, float]:
    low, high = (args[i] if len(args) > i else None for i in (1, 2))
    return (-math.inf if low is None else float(low), math.inf if high is None else float(high))


_GEMM_ACTS: Final = frozenset({RELU, HARDTANH})


class OpSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What the native XNNPACK backend knows of one operator. An op the partitioner takes (`check`,
    `tuple_result` or an int8 role) either has a `visitor` or names in `lowered_to` the op a backend
    pass rewrites it to, which has one."""

    target: str
    """The canonical op string ("aten::add.Tensor")."""
    check: c.Check | None = None
    """The partitioner's condition on a node of this op (after `common_check`); None: no config takes
    the op by itself (a pass makes it, or an int8 pattern or a graph rule takes it)."""
    int8_io: bool = False
    """`common_check` lets int8 tensors through (the per-tensor q/dq nodes)."""
    keep: bool = False
    """Kept undecomposed when the partitioner takes a node of it (ExecuTorch's `get_original_aten`)."""
    activation: int | None = None
    """A GEMM's activation (input) argument position."""
    weight: int | None = None
    """A GEMM's weight argument position (the partitioner claims the constant with the node)."""
    bias: int | None = None
    """A GEMM's bias argument position."""
    params: tuple[int, ...] = ()
    """Other constant arguments the op's config takes with the node (batch norm's, prelu's weight)."""
    tuple_result: str | None = None
    """A multi-result op the partitioner takes with its getitems by a graph rule: why it turns one down."""
    config_acts: frozenset[str] = frozenset()
    """Activations after the op its config partitions with it (ExecuTorch's `fused_act`: a GEMM's in
    per-op mode and in its int8 pattern, an int8 element-wise op's)."""
    fuses: frozenset[str] = frozenset()
    """Activations `fuse_activations` folds into the op's output bounds."""
    bounds: Bounds | None = None
    """An activation's (clamp's) output bounds."""
    layout: Literal["nhwc", "nchw", "broadcast"] | None = None
    """The channels-last pass's class: runs in NHWC, needs NCHW, or broadcasts two inputs (follows them)."""
    int8: Literal["gemm", "generic"] | None = None
    """Its static-int8 pattern: a GEMM's (quantized weight) or an element-wise/shape op's."""
    int8_check: c.PatternCheck | None = None
    """A condition on the op's int8 pattern (the dequantize before it, the quantize after it)."""
    visitor: VisitorName | None = None
    """The node visitor that serializes it."""
    xnn: type[Any] | None = None
    """The XNNPACK node a `binary` or `unary` visitor emits."""
    lowered_to: str | None = None
    """The op a backend pass rewrites it to before the visitors run."""


def _unary(target: str, xnn: type[Any]) -> OpSpec:
    """An element-wise op XNNPACK takes on any float tensor, as one `xnn` node."""
    return OpSpec(target=target, check=c.ok, visitor="unary", xnn=xnn)

OPS: Final[tuple[OpSpec, ...]] = (
    # GEMMs
    OpSpec(target=LINEAR, check=c.linear, keep=True, activation=0, weight=1, bias=2, config_acts=_GEMM_ACTS,
           fuses=_GEMM_ACTS, layout="nchw", int8="gemm", visitor="linear"),
    OpSpec(target=CONV, check=c.conv, activation=0, weight=1, bias=2, config_acts=_GEMM_ACTS, fuses=_GEMM_ACTS,
           layout="nhwc", int8="gemm", visitor="conv"),
    OpSpec(target="aten::addmm.default", check=c.addmm, activation=1, weight=2, bias=0, config_acts=_GEMM_ACTS,
           visitor="addmm"),
    OpSpec(target="aten::mm.default", check=c.mm, activation=0, weight=1, config_acts=_GEMM_ACTS, visitor="mm"),
    OpSpec(target="aten::bmm.default", check=c.ok, visitor="binary", xnn=s.XNNBatchMatrixMultiply),
    # element-wise binary
    OpSpec(target="aten::add.Tensor", check=c.alpha_one, config_acts=frozenset({RELU}), fuses=_GEMM_ACTS,
           layout="broadcast", int8="generic", visitor="binary", xnn=s.XNNAdd),
    OpSpec(target="aten::sub.Tensor", check=c.alpha_one, fuses=_GEMM_ACTS, layout="broadcast", int8="generic",
           visitor="binary", xnn=s.XNNSubtract),
    OpSpec(target="aten::mul.Tensor", check=c.two_tensors, fuses=_GEMM_ACTS, layout="broadcast", int8="generic",
           visitor="binary", xnn=s.XNNMultiply),
    OpSpec(target="aten::div.Tensor", check=c.two_tensors, layout="broadcast", visitor="binary", xnn=s.XNNDiv),
    OpSpec(target="aten::minimum.default", check=c.ok, visitor="binary", xnn=s.XNNMinimum),
    OpSpec(target="aten::maximum.default", check=c.ok, visitor="binary", xnn=s.XNNMaximum),
    OpSpec(target="aten::prelu.default", check=c.prelu, keep=True, params=(1,), layout="nhwc", visitor="binary",
           xnn=s.XNNPReLU),
    # activations and element-wise unary
    OpSpec(target=RELU, check=c.ok, bounds=_relu_bounds, int8="generic", visitor="unary", xnn=s.XNNClamp),
    OpSpec(target=HARDTANH, check=c.ok, bounds=_hardtanh_bounds, int8="generic", visitor="unary", xnn=s.XNNClamp),
    OpSpec(target="aten::clamp.default", check=c.ok, bounds=_clamp_bounds, int8="generic", visitor="unary",
           xnn=s.XNNClamp),
    _unary("aten::sigmoid.default", s.XNNSigmoid),
    _unary("aten::tanh.default", s.XNNTanh),
    OpSpec(target="aten::gelu.default", check=c.gelu, visitor="unary", xnn=s.XNNGelu),
    _unary("aten::abs.default", s.XNNAbs),
    _unary("aten::neg.default", s.XNNNegate),
    _unary("aten::floor.default", s.XNNFloor),
    _unary("aten::ceil.default", s.XNNCeiling),
    _unary("aten::sqrt.default", s.XNNSquareRoot),
    _unary("aten::rsqrt.default", s.XNNReciprocalSquareRoot),
    _unary("aten::exp.default", s.XNNExp),
    _unary("aten::log.default", s.XNNLog),
    _unary("aten::sin.default", s.XNNSin),
    _unary("aten::cos.default", s.XNNCos),
    OpSpec(target="aten::hardswish.default", check=c.ok, keep=True, visitor="unary", xnn=s.XNNHardswish),
    OpSpec(target="aten::pow.Tensor_Scalar", check=c.square, visitor="unary", xnn=s.XNNSquare),
    OpSpec(target="aten::leaky_relu.default", check=c.ok, visitor="leaky_relu"),
    OpSpec(target="aten::_softmax.default", check=c.softmax, visitor="softmax"),
    # pools, reductions, resize
    OpSpec(target="aten::upsample_bilinear2d.vec", check=c.static_output, keep=True, layout="nhwc",
           visitor="upsample_bilinear"),
    OpSpec(target="aten::max_pool2d.default", check=c.max_pool, keep=True, layout="nhwc", int8="generic",
           visitor="max_pool"),
    OpSpec(target="aten::avg_pool2d.default", check=c.avg_pool, layout="nhwc", visitor="avg_pool"),
    OpSpec(target="aten::mean.dim", check=c.mean, layout="nhwc", int8="generic", visitor="mean"),
    OpSpec(target=MAX_DIM, tuple_result="max.dim of other than a 4-D float tensor, or its indices are read",
           layout="nhwc", lowered_to=AMAX),
    OpSpec(target=AMAX, layout="nhwc", visitor="amax"),
    OpSpec(target=BN, params=(1, 2, 3, 4), lowered_to=CONV, tuple_result=(
        "a batch norm the preprocess can neither fold into a static convolution or linear nor make a depthwise "
        "convolution (a rank 2-4 float input with static channels, constant statistics and parameters, only "
        "its output read)")),
    # shapes and copies
    OpSpec(target="aten::view_copy.default", check=c.view, layout="nchw", int8="generic", visitor="view"),
    OpSpec(target="aten::permute_copy.default", check=c.ok, int8="generic", visitor="permute"),
    OpSpec(target=CAT, check=c.cat, int8="generic", visitor="cat"),
    OpSpec(target=PAD, check=c.pad, visitor="pad"),
    OpSpec(target="aten::slice_copy.Tensor", check=c.slice_copy, int8="generic", int8_check=c.same_qparams,
           visitor="slice"),
    OpSpec(target=SQUEEZE, layout="nchw", visitor="squeeze"),
    OpSpec(target=UNSQUEEZE, check=c.unsqueeze, layout="nchw", int8="generic", visitor="squeeze"),
    OpSpec(target=CLONE, check=c.clone, visitor="copy"),
    OpSpec(target=CLONE_DIM_ORDER, check=c.clone_dim_order, visitor="copy"),
    OpSpec(target=TO_DIM_ORDER_COPY, check=c.same_dtype, int8="generic", lowered_to=TO_COPY),
    OpSpec(target=TO_COPY, visitor="to_copy"),
    # quantize and dequantize (static, dynamic, torchao's affine), and what feeds a dynamic one
    OpSpec(target=Q_PER_TENSOR, check=c.ok, int8_io=True, visitor="quantize"),
    OpSpec(target=DQ_PER_TENSOR, check=c.ok, int8_io=True, visitor="dequantize"),
    OpSpec(target=Q_PER_CHANNEL, visitor="quantize"),
    OpSpec(target=DQ_PER_CHANNEL, visitor="dequantize"),
    OpSpec(target="quantized_decomposed::quantize_per_tensor.tensor", visitor="dynamic_quantize"),
    OpSpec(target="quantized_decomposed::quantize_per_token.default", visitor="dynamic_quantize"),
    OpSpec(target=Q_AFFINE, visitor="dynamic_quantize"),
    OpSpec(target="quantized_decomposed::dequantize_per_tensor.tensor", visitor="dynamic_dequantize"),
    OpSpec(target="quantized_decomposed::dequantize_per_token.default", visitor="dynamic_dequantize"),
    OpSpec(target=DQ_AFFINE, visitor="dynamic_dequantize"),
    OpSpec(target="quantized_decomposed::choose_qparams.tensor", visitor="choose_qparams"),
    OpSpec(target="quantized_decomposed::choose_qparams_per_token_asymmetric.default", visitor="choose_qparams"),
    OpSpec(target="torchao::choose_qparams_affine.default", visitor="choose_qparams"),
    OpSpec(target=GETITEM, visitor="getitem"),
)
"""The native XNNPACK backend's operators."""

SPECS: Final[Mapping[str, OpSpec]] = {spec.target: spec for spec in OPS}
"""`OPS` by target."""

# -- tables derived from OPS ------------------------------------------------------------------------

CHECKS: Final[Mapping[str, c.Check]] = {spec.target: spec.check for spec in OPS if spec.check is not None}
"""The ops the partitioner takes by a check, with the conditions ExecuTorch's configs put on them."""
INT8_IO: Final = frozenset(spec.target for spec in OPS if spec.int8_io)
KEPT_OPS: Final = tuple(spec.target for spec in OPS if spec.keep)
"""Ops kept undecomposed when the partitioner takes them (ExecuTorch's `get_original_aten`, those
this backend supports)."""
TUPLE_OPS: Final[Mapping[str, str]] = {spec.target: spec.tuple_result for spec in OPS if spec.tuple_result is not None}
"""The ops taken with their getitems: why one is turned down."""
CLAIMS: Final[Mapping[str, tuple[int, ...]]] = {
    spec.target: (*(i for i in (spec.weight, spec.bias) if i is not None), *spec.params)
    for spec in OPS if spec.weight is not None or spec.params
}
"""The constant arguments an op's config takes into the node's partition (GEMM, batch-norm and prelu configs)."""
GEMMS: Final[Mapping[str, OpSpec]] = {spec.target: spec for spec in OPS if spec.weight is not None}
PARAMS: Final[Mapping[str, tuple[int, ...]]] = {
    spec.target: spec.params for spec in OPS if spec.weight is None and (spec.params or spec.tuple_result)
}
"""Ops (not GEMMs) whose config takes constant arguments, and for tuple results the getitems, with the node."""
INT8_GEMMS: Final[Mapping[str, OpSpec]] = {spec.target: spec for spec in OPS if spec.int8 == "gemm"}
INT8_GENERIC: Final[Mapping[str, frozenset[str]]] = {
    spec.target: spec.config_acts for spec in OPS if spec.int8 == "generic"
}
"""Element-wise and shape ops the native backend serializes in their static-int8 form, with the
activations fused into each under quantization."""
PATTERN_CHECKS: Final[Mapping[str, c.PatternCheck]] = {
    spec.target: spec.int8_check for spec in OPS if spec.int8_check is not None
}
FUSES: Final[Mapping[str, frozenset[str]]] = {spec.target: spec.fuses for spec in OPS if spec.fuses}
ACTIVATION_BOUNDS: Final[Mapping[str, Bounds]] = {
    act: bounds for act in sorted(frozenset().union(*FUSES.values()))
    if (bounds := SPECS[act].bounds) is not None
}
"""The activations `fuse_activations` folds, with their bounds."""
NHWC_OPS: Final = frozenset(spec.target for spec in OPS if spec.layout == "nhwc")
NCHW_OPS: Final = frozenset(spec.target for spec in OPS if spec.layout == "nchw")
BROADCAST_OPS: Final = frozenset(spec.target for spec in OPS if spec.layout == "broadcast")
QUANTIZE: Final = frozenset(spec.target for spec in OPS if spec.visitor == "quantize")
DEQUANTIZE: Final = frozenset(spec.target for spec in OPS if spec.visitor == "dequantize")
DYNAMIC_Q: Final = frozenset(spec.target for spec in OPS if spec.visitor == "dynamic_quantize")
"""Quantizes whose params are computed at run time (when they come from a choose_qparams)."""
DYNAMIC_DQ: Final = frozenset(spec.target for spec in OPS if spec.visitor == "dynamic_dequantize")
CHOOSE_QPARAMS: Final = frozenset(spec.target for spec in OPS if spec.visitor == "choose_qparams")
AFFINE: Final = frozenset({Q_AFFINE, DQ_AFFINE})
"""torchao's q/dq (8da4w): (input, block_size, scale, zero_point, dtype, qmin, qmax[, output dtype])."""
