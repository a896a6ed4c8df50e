"""The node visitors: one per edge op (`VISITORS`), each defining its values on the `Serializer`
in ExecuTorch 1.5.1's order and emitting its XNNPACK node."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from texir.backends.xnnpack import schema as s
from texir.backends.xnnpack.checks import refuse
from texir.backends.xnnpack.errors import XnnpackUnsupportedError
from texir.backends.xnnpack.graph import CHANNELS_LAST, CONTIGUOUS, WorkNode
from texir.backends.xnnpack.ops import OPS, UNSQUEEZE, Bounds, OpSpec, VisitorName
from texir.backends.xnnpack.qdq import QDQ_VISITORS
from texir.backends.xnnpack.quant import QuantParams, bias_params, from_inputs, from_weights
from texir.backends.xnnpack.serialize import KEEP_DIMS, NCHW_TO_NHWC, NHWC_TO_NCHW, Serializer
from texir.ir.analysis import same_dim_order

__all__ = ["VISITORS", "Visitor"]

Visitor = Callable[[Serializer, WorkNode], None]


def _arg(n: WorkNode, i: int, default: Any = None) -> Any:
    return n.args[i] if len(n.args) > i else default


def _linear(ser: Serializer, n: WorkNode) -> None:
    x, w = n.args[0], n.args[1]
    b = _arg(n, 2)
    ser.define(x)
    ser.define(w, quant=from_weights(ser, w))
    xq = from_inputs(ser, x)
    # XNNPACK has no dynamically quantized GEMM with a half-precision bias: it is stored as fp32.
    dynamic = xq is not None and xq.is_dynamic
    bias = ser.define(b, quant=_bias(ser, b, x, w), force_fp32=dynamic) if b is not None else s.INVALID_ID
    ser.emit(n, s.XNNFullyConnected(input1_id=ser.id(x), filter_id=ser.id(w), bias_id=bias,
                                    output_id=ser.define(n)), min_max=n.min_max)


def _bias(ser: Serializer, b: WorkNode, x: WorkNode, w: WorkNode) -> QuantParams | None:
    return bias_params(b, from_weights(ser, w), from_inputs(ser, x))


TRANSPOSE_WEIGHTS: Final = 1


def _addmm(ser: Serializer, n: WorkNode) -> None:
    """addmm(bias, input, weight): output, input, weight, bias; XNNPACK transposes the [in, out] weight."""
    b, x, w = n.args[:3]
    out = ser.define(n)
    ser.define(x)
    ser.define(w)
    ser.define(b)
    ser.emit(n, s.XNNFullyConnected(input1_id=ser.id(x), filter_id=ser.id(w), bias_id=ser.id(b), output_id=out,
                                    flags=TRANSPOSE_WEIGHTS))


def _mm(ser: Serializer, n: WorkNode) -> None:
    ser.io(n)
    x, w = n.args[:2]
    ser.emit(n, s.XNNFullyConnected(input1_id=ser.id(x), filter_id=ser.id(w), bias_id=s.INVALID_ID,
                                    output_id=ser.id(n), flags=TRANSPOSE_WEIGHTS))


def _conv(ser: Serializer, n: WorkNode) -> None:
    x, w, b, stride, padding, dilation, transposed, output_padding, groups = n.args[:9]
    ser.define(x, nhwc=True)
    kernel = ser.g.shape(w)
    if transposed:
        gin, gout = kernel[0] // groups, kernel[1]
    else:
        gin, gout = kernel[1], kernel[0] // groups
    depthwise = gin == 1 and gout % gin == 0 and not transposed
    if len(stride) != 2:
        raise XnnpackUnsupportedError(f"'{n.name}': only 2-D convolutions are supported", node=n.name, op=n.target)
    wq = from_weights(ser, w)
    if wq is not None and (transposed or (depthwise and wq.per_channel and wq.axis != 0)):
        raise XnnpackUnsupportedError(
            f"'{n.name}': a quantized transposed convolution, or a depthwise one quantized per input channel, is not "
            "supported by the native XNNPACK backend", node=n.name, op=n.target)
    ser.define(w, nhwc=True, swap=depthwise or bool(transposed), groups=groups if transposed else 1,
               force_fp32=True, quant=wq)
    out = ser.define(n, nhwc=True)
    bias = ser.define(b, force_fp32=True, quant=_bias(ser, b, x, w)) if b is not None else s.INVALID_ID
    cls = s.XNNDepthwiseConv2d if depthwise else s.XNNConvTranspose2d if transposed else s.XNNConv2d
    ser.emit(n, cls(
        padding_top=padding[0], padding_right=padding[1], padding_bottom=padding[0], padding_left=padding[1],
        kernel_height=kernel[2], kernel_width=kernel[3], subsampling_height=stride[0], subsampling_width=stride[1],
        dilation_height=dilation[0], dilation_width=dilation[1], group_input_channels=gin,
        group_output_channels=gout, groups=groups, adjustment_height=output_padding[0],
        adjustment_width=output_padding[1], input1_id=ser.id(x), filter_id=ser.id(w), bias_id=bias, output_id=out,
    ), min_max=n.min_max)


def _binary(cls: type[Any], *, fused: bool) -> Visitor:
    """add/sub/mul define input1, input2, output and take a fused activation; the others use the
    output-first helper."""

    def visit(ser: Serializer, n: WorkNode) -> None:
        a, b = n.args[0], n.args[1]
        if not isinstance(b, WorkNode):
            raise XnnpackUnsupportedError(
                f"'{n.name}' ({n.target}) has a scalar operand; XNNPACK needs two tensors", node=n.name, op=n.target)
        if fused:
            ser.define(a)
            ser.define(b)
            out = ser.define(n)
        else:
            ser.io(n)
            out = ser.id(n)
        ser.emit(n, cls(input1_id=ser.id(a), input2_id=ser.id(b), output_id=out),
                 min_max=n.min_max if fused else None)

    return visit


def _unary(cls: type[Any], bounds: Bounds | None = None) -> Visitor:
    def visit(ser: Serializer, n: WorkNode) -> None:
        ser.io(n)
        ser.emit(n, cls(input_id=ser.id(n.args[0]), output_id=ser.id(n)),
                 min_max=None if bounds is None else bounds(n.args))

    return visit


def _softmax(ser: Serializer, n: WorkNode) -> None:
    dim, rank = n.args[1], n.args[0].rank
    if dim not in (-1, rank - 1):
        raise XnnpackUnsupportedError(f"'{n.name}': softmax over dim {dim} (XNNPACK: last dim only)",
                                      node=n.name, op=n.target)
    _unary(s.XNNSoftmax)(ser, n)


def _pair(v: Any, default: list[int]) -> list[int]:
    if isinstance(v, int):
        return [v, v]
    values = list(v) if v is not None else []
    if not values:
        return default
    return [values[0], values[0]] if len(values) == 1 else [values[0], values[1]]


def _pool(n: WorkNode, dilation: bool) -> tuple[list[int], list[int], list[int], list[int]]:
    kernel = _pair(_arg(n, 1), [])
    return (kernel, _pair(_arg(n, 2), kernel), _pair(_arg(n, 3), [0, 0]),
            _pair(_arg(n, 4), [1, 1]) if dilation else [1, 1])


def _pool_4d(n: WorkNode) -> None:
    if n.args[0].rank != 4:
        raise refuse("pool_rank", n, f"the input is {n.args[0].rank}-D", "pool a 4-D (N, C, H, W) tensor")


def _max_pool(ser: Serializer, n: WorkNode) -> None:
    _pool_4d(n)
    ser.io(n, nhwc=True)
    kernel, stride, pad, dil = _pool(n, True)
    bottom, right = pad[0], pad[1]
    if _arg(n, 5, False):
        h, w = ser.g.shape(n.args[0])[2:]
        bottom += _ceil_pad(h, kernel[0], stride[0], pad[0], dil[0])
        right += _ceil_pad(w, kernel[1], stride[1], pad[1], dil[1])
    ser.emit(n, s.XNNMaxPooling2d(
        padding_top=pad[0], padding_right=right, padding_bottom=bottom, padding_left=pad[1],
        pooling_height=kernel[0], pooling_width=kernel[1], stride_height=stride[0], stride_width=stride[1],
        dilation_height=dil[0], dilation_width=dil[1], input_id=ser.id(n.args[0]), output_id=ser.id(n),
        flags=KEEP_DIMS))


def _amax(ser: Serializer, n: WorkNode) -> None:
    """amax over H or W of a 4-D tensor with keepdim (a max.dim whose indices nobody reads): a max
    pooling over that whole dim, in NHWC."""
    dim = _arg(n, 1)
    if len(n.args) != 3 or dim not in (2, 3):
        raise XnnpackUnsupportedError(f"'{n.name}': max over dim {dim} (XNNPACK takes dim 2 or 3 with keepdim=True)",
                                      node=n.name, op=n.target)
    _pool_4d(n)
    ser.io(n, nhwc=True)
    h, w = ser.g.shape(n.args[0])[2:]
    height, width = (h, 1) if dim == 2 else (1, w)
    ser.emit(n, s.XNNMaxPooling2d(
        padding_top=0, padding_right=0, padding_bottom=0, padding_left=0, pooling_height=height,
        pooling_width=width, stride_height=height, stride_width=width, dilation_height=1, dilation_width=1,
        input_id=ser.id(n.args[0]), output_id=ser.id(n), flags=0))


def _ceil_pad(size: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    span = size + 2 * pad - dilation * (kernel - 1) - 1
    out = (span + stride - 1) // stride + 1
    partial = span % stride
    return stride - partial if partial > 0 and not (out - 1) * stride >= size + pad else 0


def _avg_pool(ser: Serializer, n: WorkNode) -> None:
    ser.io(n, nhwc=True)
    kernel, stride, pad, _ = _pool(n, False)
    ser.emit(n, s.XNNAvgPooling2d(
        padding_top=pad[0], padding_right=pad[1], padding_bottom=pad[0], padding_left=pad[1],
        pooling_height=kernel[0], pooling_width=kernel[1], stride_height=stride[0], stride_width=stride[1],
        input_id=ser.id(n.args[0]), output_id=ser.id(n), flags=KEEP_DIMS))


def _mean(ser: Serializer, n: WorkNode) -> None:
    ser.io(n, nhwc=True)
    dims = sorted(d % 4 for d in n.args[1])
    if n.args[0].rank != 4 or dims != [2, 3] or not _arg(n, 2, False) or n.kwargs.get("dtype") is not None:
        raise XnnpackUnsupportedError(
            f"'{n.name}': XNNPACK takes mean over dims (2, 3) of a 4-D tensor with keepdim only",
            node=n.name, op=n.target)
    ser.emit(n, s.XNNGlobalAvgPooling2d(input_id=ser.id(n.args[0]), output_id=ser.id(n), flags=KEEP_DIMS))


def _view(ser: Serializer, n: WorkNode) -> None:
    ser.io(n)
    shape = [d if d != -1 else 0 for d in n.args[1]]
    if not all(isinstance(d, int) for d in shape):
        raise XnnpackUnsupportedError(f"'{n.name}': symbolic reshape sizes are not supported",
                                      node=n.name, op=n.target)
    if n.nhwc:
        _nhwc_4d(n, len(shape))
        shape = [shape[NCHW_TO_NHWC[i]] for i in range(4)]
    _one_dynamic_size(n, shape)
    ser.emit(n, s.XNNStaticReshape(num_dims=len(shape), new_shape=tuple(shape), input_id=ser.id(n.args[0]),
                                   output_id=ser.id(n)))


def _permute(ser: Serializer, n: WorkNode) -> None:
    ser.io(n)
    rank = n.args[0].rank
    perm = [d + rank if d < 0 else d for d in n.args[1]]
    if n.nhwc:
        _nhwc_4d(n, len(perm))
        contiguous = [NHWC_TO_NCHW[i] for i in perm]
        perm = [contiguous[i] for i in NCHW_TO_NHWC]
    ser.emit(n, s.XNNStaticTranspose(num_dims=len(perm), perm=tuple(perm), input_id=ser.id(n.args[0]),
                                     output_id=ser.id(n)))


def _to_copy(ser: Serializer, n: WorkNode) -> None:
    fmt = n.kwargs.get("memory_format", CONTIGUOUS)
    if fmt not in (CHANNELS_LAST, CONTIGUOUS):
        raise XnnpackUnsupportedError(f"'{n.name}': a copy to memory format {fmt} (XNNPACK converts to channels-last "
                                      "or contiguous only)", node=n.name, op=n.target)
    to_nhwc = fmt == CHANNELS_LAST
    src = n.args[0]
    ser.define(src, nhwc=not to_nhwc and src.rank == 4)
    out = ser.define(n, nhwc=to_nhwc)
    perm = NCHW_TO_NHWC if to_nhwc else NHWC_TO_NCHW
    ser.emit(n, s.XNNStaticTranspose(num_dims=len(ser.g.shape(n)), perm=perm, input_id=ser.id(src), output_id=out))


_CATS: Final = {2: s.XNNConcatenate2, 3: s.XNNConcatenate3, 4: s.XNNConcatenate4, 5: s.XNNConcatenate5}


def _cat(ser: Serializer, n: WorkNode) -> None:
    tensors = list(n.args[0])
    if len(tensors) not in _CATS:
        raise XnnpackUnsupportedError(f"'{n.name}': concatenation of {len(tensors)} tensors (2 to 5 supported)",
                                      node=n.name, op=n.target)
    for t in tensors:
        ser.define(t)
    out = ser.define(n)
    axis = _arg(n, 1, 0)
    if axis < 0:
        axis += tensors[0].rank
    if n.nhwc:
        axis = NHWC_TO_NCHW[axis]
    ids = [ser.id(t) for t in tensors] + [s.INVALID_ID] * (5 - len(tensors))
    ser.emit(n, _CATS[len(tensors)](axis=axis, input1_id=ids[0], input2_id=ids[1], input3_id=ids[2],
                                    input4_id=ids[3], input5_id=ids[4], output_id=out))


def _copy(ser: Serializer, n: WorkNode) -> None:
    if not same_dim_order(n.tensor, n.args[0].tensor):
        raise refuse("clone_dim_order", n, "the clone changes its input's dim order (XNNPACK's Copy keeps it)",
                     "leave the node out of the partition (texir's partitioner does)")
    ser.define(n)
    ser.define(n.args[0])
    ser.emit(n, s.XNNCopy(input_id=ser.id(n.args[0]), output_id=ser.id(n)))


def _pad(ser: Serializer, n: WorkNode) -> None:
    ser.io(n)
    pads = list(n.args[1])
    rank = len(ser.g.shape(n.args[0]) or [1])
    if len(pads) % 2:
        raise XnnpackUnsupportedError(f"'{n.name}': odd number of padding values {pads}", node=n.name, op=n.target)
    pads += [0] * (2 * rank - len(pads))
    pre, post = pads[-2::-2], pads[::-2]
    if n.nhwc:
        _nhwc_4d(n, len(pre))
        pre, post = [pre[i] for i in NCHW_TO_NHWC], [post[i] for i in NCHW_TO_NHWC]
    ser.emit(n, s.XNNStaticConstantPad(pre_paddings=tuple(pre), post_paddings=tuple(post),
                                       padding_value=float(_arg(n, 2, 0.0)), input_id=ser.id(n.args[0]),
                                       output_id=ser.id(n)))


def _slice(ser: Serializer, n: WorkNode) -> None:
    ser.io(n)
    src = n.args[0]
    in_shape, out_shape = ser.g.shape(src), ser.g.shape(n)
    dim = _arg(n, 1, 0)
    if n.nhwc:
        in_shape = [in_shape[i] for i in NCHW_TO_NHWC]
        out_shape = [out_shape[i] for i in NCHW_TO_NHWC]
        dim = NHWC_TO_NCHW[dim]
    begin = _arg(n, 2) or 0
    if begin < 0:
        begin += in_shape[dim]
    if _arg(n, 4, 1) != 1:
        raise XnnpackUnsupportedError(f"'{n.name}': slice with a step other than 1", node=n.name, op=n.target)
    offsets = [0] * len(in_shape)
    offsets[dim] = begin
    ser.emit(n, s.XNNStaticSlice(num_dims=len(in_shape), offsets=tuple(offsets), sizes=tuple(out_shape),
                                 input_id=ser.id(src), output_id=ser.id(n)))


def _nhwc_4d(n: WorkNode, rank: int) -> None:
    if rank != 4:
        raise refuse("nhwc_rank", n, f"a {rank}-D value is tagged channels-last", "report it: the channels-last "
                     "pass tags only 4-D values")


def _one_dynamic_size(n: WorkNode, shape: list[int]) -> None:
    if shape.count(0) > 1:
        raise refuse("reshape_dynamic_dims", n, f"new shape {shape} has {shape.count(0)} dynamic (0 or -1) sizes",
                     "give every size but one statically")


def _squeeze(ser: Serializer, n: WorkNode) -> None:
    """(un)squeeze of the last dim as a reshape; the one symbolic size (if any) becomes 0."""
    dim, rank = _arg(n, 1), n.args[0].rank
    last = rank if n.target == UNSQUEEZE else rank - 1
    if dim not in (-1, last):
        raise refuse("squeeze_last_dim", n, f"dim {dim} of a {rank}-D input is not the last",
                     "(un)squeeze the last dim, or leave the node out of the partition")
    ser.io(n)
    shape = [d if isinstance(d, int) else 0 for d in n.tensor.shape]
    if any(not isinstance(d, int) for d in n.tensor.shape):
        _one_dynamic_size(n, shape)
    ser.emit(n, s.XNNStaticReshape(num_dims=len(shape), new_shape=tuple(shape), input_id=ser.id(n.args[0]),
                                   output_id=ser.id(n)))


def _leaky_relu(ser: Serializer, n: WorkNode) -> None:
    """The slope is absent from the args when it is torch's default, 0.01."""
    ser.io(n)
    slope = float(_arg(n, 1, 0.01))
    ser.emit(n, s.XNNLeakyReLU(negative_slope=slope, input_id=ser.id(n.args[0]), output_id=ser.id(n)))


ALIGN_CORNERS: Final = 0x8
"""XNNPACK's XNN_FLAG_ALIGN_CORNERS."""


def _upsample_bilinear(ser: Serializer, n: WorkNode) -> None:
    """Channels-last resize to the output's static height and width."""
    if not all(isinstance(d, int) for d in n.tensor.shape[-2:]):
        raise refuse("upsample_static", n, f"output size {list(n.tensor.shape)} is symbolic",
                     "export with a static height and width, or leave the node out of the partition")
    ser.define(n, nhwc=True)
    ser.define(n.args[0], nhwc=True)
    height, width = ser.g.shape(n)[-2:]
    ser.emit(n, s.XNNStaticResizeBilinear2D(new_height=height, new_width=width, input_id=ser.id(n.args[0]),
                                            output_id=ser.id(n), flags=ALIGN_CORNERS if _arg(n, 2) else 0))


_BY_NAME: Final[dict[VisitorName, Callable[[OpSpec], Visitor]]] = {
    "linear": lambda spec: _linear,
    "conv": lambda spec: _conv,
    "addmm": lambda spec: _addmm,
    "mm": lambda spec: _mm,
    "binary": lambda spec: _binary(_xnn(spec), fused=bool(spec.fuses)),
    "unary": lambda spec: _unary(_xnn(spec), spec.bounds),
    "leaky_relu": lambda spec: _leaky_relu,
    "upsample_bilinear": lambda spec: _upsample_bilinear,
    "softmax": lambda spec: _softmax,
    "max_pool": lambda spec: _max_pool,
    "amax": lambda spec: _amax,
    "avg_pool": lambda spec: _avg_pool,
    "mean": lambda spec: _mean,
    "view": lambda spec: _view,
    "permute": lambda spec: _permute,
    "to_copy": lambda spec: _to_copy,
    "cat": lambda spec: _cat,
    "pad": lambda spec: _pad,
    "slice": lambda spec: _slice,
    "squeeze": lambda spec: _squeeze,
    "copy": lambda spec: _copy,
    **{name: (lambda visit: lambda spec: visit)(visit) for name, visit in QDQ_VISITORS.items()},
}
"""How an `OpSpec.visitor` name becomes its visitor (the generic ones specialised by the entry)."""


def _xnn(spec: OpSpec) -> type[Any]:
    if spec.xnn is None:
        raise XnnpackUnsupportedError(f"OPS entry {spec.target}: visitor '{spec.visitor}' needs the XNNPACK node "
                                      "it emits (give the entry `xnn=`)", op=spec.target)
    return spec.xnn


VISITORS: Final[dict[str, Visitor]] = {spec.target: _BY_NAME[spec.visitor](spec) for spec in OPS
                                       if spec.visitor is not None}
"""Node visitor per edge op, from `ops.OPS`; an op without one cannot be delegated."""
