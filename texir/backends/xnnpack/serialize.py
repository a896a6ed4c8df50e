"""The walk from the rewritten graph to an `XNNGraph`: values in ExecuTorch's definition order,
constants as named data, and one node visitor per op (`VISITORS`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final

import numpy as np

from texir.backends.xnnpack import schema as s
from texir.backends.xnnpack.errors import XnnpackUnsupportedError
from texir.backends.xnnpack.graph import CHANNELS_LAST, XGraph, XNode
from texir.backends.xnnpack.quant import (
    QDQ_VISITORS,
    QuantParams,
    bias_params,
    from_inputs,
    from_outputs,
    from_weights,
    quantize,
    schema_params,
    swapped_axis,
)
from texir.ir import DType
from texir.ir.blob import Blob, digest_all

__all__ = ["Serializer", "VISITORS"]

UINT64_MAX: Final = 2**64 - 1
NO_HANDLE: Final = 65535
"""The debug handle of nodes preprocess creates (ExecuTorch's DEFAULT_DEBUG_HANDLE)."""
KEEP_DIMS: Final = 0x40
NCHW_TO_NHWC: Final = (0, 2, 3, 1)
NHWC_TO_NCHW: Final = (0, 3, 1, 2)
_DATATYPES: Final = {
    DType.float32: s.XNNDatatype.xnn_datatype_fp32,
    DType.float16: s.XNNDatatype.xnn_datatype_fp16,
    DType.bfloat16: s.XNNDatatype.xnn_datatype_bf16,
}


class Serializer:
    """Mutable state of one graph walk (ExecuTorch's `vals_to_ids` and the XNNGraph lists)."""

    def __init__(self, g: XGraph) -> None:
        self.g = g
        self.ids: dict[int, int] = {}
        self.values: list[s.XValue] = []
        self.xnodes: list[s.XNode] = []
        self.input_ids: list[int] = []
        self.output_ids: list[int] = []
        self.constants: list[tuple[Blob, str | None]] = []
        """Payload and key of `constant_data` entries 1, 2, ... (None: hash the payload)."""
        self.named: dict[str, Blob] = {}
        inputs = [n for n in g.nodes if n.user_input]
        outputs = g.outputs()
        self.externals: dict[int, tuple[int, int]] = {id(n): (i, 1) for i, n in enumerate(inputs)}
        for i, n in enumerate(outputs):
            if id(n) in self.externals:
                raise XnnpackUnsupportedError(
                    f"'{n.name}' is both an input and an output of the partition; XNNPACK cannot return an input",
                    node=n.name,
                )
            self.externals[id(n)] = (len(inputs) + i, 2)
        self.num_externs = len(inputs) + len(outputs)

    def id(self, n: XNode) -> int:
        return self.ids[id(n)]

    def define(self, n: XNode, *, nhwc: bool = False, swap: bool = False, groups: int = 1,
               force_fp32: bool = False, quant: QuantParams | None | str = "auto") -> int:
        """ExecuTorch's `define_tensor`: the first definition of a value fixes its id and layout.
        `quant` "auto" takes the params of an implicit dq producing `n` or an implicit q after it."""
        if id(n) in self.ids:
            return self.ids[id(n)]
        qp = (from_inputs(self, n) or from_outputs(self, n)) if isinstance(quant, str) else quant
        if qp is not None and id(qp.q_input) in self.ids:
            self.ids[id(n)] = self.ids[id(qp.q_input)]
            return self.ids[id(n)]
        nhwc = nhwc or bool(n.nhwc)
        id_out = len(self.values)
        ext_id, flags = self.external(n, qp)
        if flags == 1:
            self.input_ids.append(id_out)
        elif flags == 2:
            self.output_ids.append(id_out)
        dims = self.g.shape(n) or [1]
        buffer_idx = self.constant(n, qp, nhwc=nhwc, swap=swap, groups=groups, force_fp32=force_fp32)
        if swap:
            dims = [dims[1] * groups, dims[0] // groups, *dims[2:]]
        if nhwc:
            if len(dims) != 4:
                raise XnnpackUnsupportedError(
                    f"'{n.name}' must be 4-D to be stored channels-last, got dims {dims}", node=n.name)
            dims = [dims[i] for i in NCHW_TO_NHWC]
        dtype = n.tensor.dtype
        datatype = (qp.datatype(n.name) if qp is not None
                    else s.XNNDatatype.xnn_datatype_fp32 if force_fp32 else _DATATYPES.get(dtype))
        if datatype is None:
            raise XnnpackUnsupportedError(
                f"'{n.name}' has dtype {dtype}; the native XNNPACK backend handles float32/float16 values and "
                "static int8 quantized ones only", node=n.name)
        tensor = s.XNNTensorValue(
            datatype=datatype, num_dims=len(dims), dims=tuple(dims), constant_buffer_idx=buffer_idx,
            external_id=ext_id, flags=flags, id_out=id_out,
        )
        value: s.XNNTensorValue | s.XNNQuantizedTensorValue = tensor
        if qp is not None:
            if swap:
                qp = swapped_axis(qp, len(dims))
            value = s.XNNQuantizedTensorValue(tensor_value=tensor, quant_params=schema_params(self, qp, qp.axis))
        self.values.append(s.XValue(xvalue_union=value))
        self.ids[id(n)] = id_out
        if qp is not None:
            self.ids[id(qp.q_input)] = id_out
        return id_out

    def external(self, n: XNode, qp: QuantParams | None) -> tuple[int, int]:
        """External id and flags (ExecuTorch's `gen_ids_and_flags`): a quantized value is external
        when the fp32 tensor it quantizes is a graph input, or when its q's only user is the output."""
        q_in = qp is not None and qp.is_input and qp.q_input.const is None
        key: XNode | None = None
        if n.user_input or q_in:
            key = qp.q_input if (q_in and qp is not None and not n.user_input) else n
        elif id(n) in self.externals or (qp is not None and qp.is_output):
            key = n
            if qp is not None and qp.is_output and id(n) not in self.externals:
                key = self.g.users(n)[0]
        if key is None:
            return s.INVALID_ID, 0
        if id(key) not in self.externals:
            raise XnnpackUnsupportedError(f"'{n.name}' should be external but '{key.name}' is neither an input "
                                          "nor an output of the partition", node=n.name)
        return self.externals[id(key)]

    def constant(self, n: XNode, qp: QuantParams | None, *, nhwc: bool, swap: bool, groups: int,
                 force_fp32: bool) -> int:
        """The `constant_data` index of a constant's payload (0 for a non-constant). A payload kept
        as it is stays the IR's Blob; a transformed one is made once and hashed once. A quantized
        value's payload is its q input's (pt2e's folded int8 weight, kept; a float bias, quantized)."""
        const = n.const if qp is None else qp.q_input.const
        if const is None:
            if swap:
                raise XnnpackUnsupportedError(
                    f"'{n.name}': a depthwise or transposed convolution needs constant weights", node=n.name)
            return 0
        quantized = qp is not None and const.dtype == qp.dtype
        keep_dtype = quantized or (const.dtype in (DType.float16, DType.bfloat16) and not force_fp32)
        unchanged = const.array is None and not swap and not (nhwc and _moves(const.shape))
        key: str | None = None
        if unchanged and (const.dtype == DType.float32 or keep_dtype) and (qp is None or quantized):
            assert const.blob is not None
            blob, key = const.blob, const.sha256 or None
        else:
            arr = const.numpy()
            if qp is not None and not quantized:
                arr = quantize(arr, qp, n.name)
            elif not keep_dtype:
                arr = arr.astype(np.float32, copy=False)
            if swap:
                shape = arr.shape
                arr = arr.reshape((groups, shape[0] // groups, *shape[1:]))
                arr = arr.transpose((0, 2, 1, *range(3, arr.ndim)))
                arr = arr.reshape((shape[1] * groups, shape[0] // groups, *shape[2:]))
            if nhwc:
                arr = arr.transpose(NCHW_TO_NHWC)
            arr = np.ascontiguousarray(arr)
            if arr.nbytes == 0:
                raise XnnpackUnsupportedError(f"constant '{n.name}' has no bytes", node=n.name)
            blob = Blob(arr.data.cast("B"))
        self.constants.append((blob, key))
        return len(self.constants)

    def emit(self, n: XNode, node: Any, *, min_max: tuple[float, float] | None = None) -> None:
        bounds = None if min_max is None else s.OutputMinMax(output_min=min_max[0], output_max=min_max[1])
        handle = NO_HANDLE if n.handle is None else n.handle
        self.xnodes.append(s.XNode(xnode_union=node, debug_handle=handle, output_min_max=bounds))

    def io(self, n: XNode, *, nhwc: bool = False) -> None:
        """`define_nodes_tensor_inputs_outputs`: the output first, then each input."""
        self.define(n, nhwc=nhwc)
        for i in n.inputs():
            self.define(i, nhwc=nhwc)

    def graph(self) -> s.XNNGraph:
        """The XNNGraph; hashes the new payloads (in parallel) and fills `named` in entry order."""
        digest_all([blob for blob, key in self.constants if key is None])
        constant_data = [s.ConstantDataOffset()]
        for blob, key in self.constants:
            key = key or blob.digest()
            constant_data.append(s.ConstantDataOffset(offset=UINT64_MAX, size=blob.nbytes, named_key=key))
            self.named.setdefault(key, blob)
        return s.XNNGraph(
            version="0", xnodes=tuple(self.xnodes), xvalues=tuple(self.values), num_externs=self.num_externs,
            input_ids=tuple(self.input_ids), output_ids=tuple(self.output_ids),
            constant_data=tuple(constant_data),
        )


def _moves(shape: tuple[int, ...]) -> bool:
    """Whether channels-last changes a 4-D tensor's bytes (not when C is 1 or H and W are both 1)."""
    return len(shape) == 4 and shape[1] != 1 and shape[2] * shape[3] != 1


# -- visitors ------------------------------------------------------------------------------------

Visitor = Callable[[Serializer, XNode], None]


def _arg(n: XNode, i: int, default: Any = None) -> Any:
    return n.args[i] if len(n.args) > i else default


def _linear(ser: Serializer, n: XNode) -> None:
    x, w = n.args[0], n.args[1]
    b = _arg(n, 2)
    ser.define(x)
    ser.define(w, quant=from_weights(ser, w))
    bias = ser.define(b, quant=_bias(ser, b, x, w)) if b is not None else s.INVALID_ID
    ser.emit(n, s.XNNFullyConnected(input1_id=ser.id(x), filter_id=ser.id(w), bias_id=bias,
                                    output_id=ser.define(n)), min_max=n.min_max)


def _bias(ser: Serializer, b: XNode, x: XNode, w: XNode) -> QuantParams | None:
    return bias_params(b, from_weights(ser, w), from_inputs(ser, x))


TRANSPOSE_WEIGHTS: Final = 1


def _addmm(ser: Serializer, n: XNode) -> None:
    """addmm(bias, input, weight): output, input, weight, bias; XNNPACK transposes the [in, out] weight."""
    b, x, w = n.args[:3]
    out = ser.define(n)
    ser.define(x)
    ser.define(w)
    ser.define(b)
    ser.emit(n, s.XNNFullyConnected(input1_id=ser.id(x), filter_id=ser.id(w), bias_id=ser.id(b), output_id=out,
                                    flags=TRANSPOSE_WEIGHTS))


def _mm(ser: Serializer, n: XNode) -> None:
    ser.io(n)
    x, w = n.args[:2]
    ser.emit(n, s.XNNFullyConnected(input1_id=ser.id(x), filter_id=ser.id(w), bias_id=s.INVALID_ID,
                                    output_id=ser.id(n), flags=TRANSPOSE_WEIGHTS))


def _conv(ser: Serializer, n: XNode) -> None:
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

    def visit(ser: Serializer, n: XNode) -> None:
        a, b = n.args[0], n.args[1]
        if not isinstance(b, XNode):
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


def _unary(cls: type[Any], bounds: Callable[[XNode], tuple[float, float]] | None = None) -> Visitor:
    def visit(ser: Serializer, n: XNode) -> None:
        ser.io(n)
        ser.emit(n, cls(input_id=ser.id(n.args[0]), output_id=ser.id(n)),
                 min_max=None if bounds is None else bounds(n))

    return visit


def _softmax(ser: Serializer, n: XNode) -> None:
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


def _pool(n: XNode, dilation: bool) -> tuple[list[int], list[int], list[int], list[int]]:
    kernel = _pair(_arg(n, 1), [])
    return (kernel, _pair(_arg(n, 2), kernel), _pair(_arg(n, 3), [0, 0]),
            _pair(_arg(n, 4), [1, 1]) if dilation else [1, 1])


def _max_pool(ser: Serializer, n: XNode) -> None:
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


def _ceil_pad(size: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    span = size + 2 * pad - dilation * (kernel - 1) - 1
    out = (span + stride - 1) // stride + 1
    partial = span % stride
    return stride - partial if partial > 0 and not (out - 1) * stride >= size + pad else 0


def _avg_pool(ser: Serializer, n: XNode) -> None:
    ser.io(n, nhwc=True)
    kernel, stride, pad, _ = _pool(n, False)
    ser.emit(n, s.XNNAvgPooling2d(
        padding_top=pad[0], padding_right=pad[1], padding_bottom=pad[0], padding_left=pad[1],
        pooling_height=kernel[0], pooling_width=kernel[1], stride_height=stride[0], stride_width=stride[1],
        input_id=ser.id(n.args[0]), output_id=ser.id(n), flags=KEEP_DIMS))


def _mean(ser: Serializer, n: XNode) -> None:
    ser.io(n, nhwc=True)
    dims = sorted(d % 4 for d in n.args[1])
    if n.args[0].rank != 4 or dims != [2, 3] or not _arg(n, 2, False) or n.kwargs.get("dtype") is not None:
        raise XnnpackUnsupportedError(
            f"'{n.name}': XNNPACK takes mean over dims (2, 3) of a 4-D tensor with keepdim only",
            node=n.name, op=n.target)
    ser.emit(n, s.XNNGlobalAvgPooling2d(input_id=ser.id(n.args[0]), output_id=ser.id(n), flags=KEEP_DIMS))


def _view(ser: Serializer, n: XNode) -> None:
    ser.io(n)
    shape = [d if d != -1 else 0 for d in n.args[1]]
    if not all(isinstance(d, int) for d in shape):
        raise XnnpackUnsupportedError(f"'{n.name}': symbolic reshape sizes are not supported",
                                      node=n.name, op=n.target)
    if n.nhwc:
        shape = [shape[NCHW_TO_NHWC[i]] for i in range(4)]
    ser.emit(n, s.XNNStaticReshape(num_dims=len(shape), new_shape=tuple(shape), input_id=ser.id(n.args[0]),
                                   output_id=ser.id(n)))


def _permute(ser: Serializer, n: XNode) -> None:
    ser.io(n)
    rank = n.args[0].rank
    perm = [d + rank if d < 0 else d for d in n.args[1]]
    if n.nhwc:
        contiguous = [NHWC_TO_NCHW[i] for i in perm]
        perm = [contiguous[i] for i in NCHW_TO_NHWC]
    ser.emit(n, s.XNNStaticTranspose(num_dims=len(perm), perm=tuple(perm), input_id=ser.id(n.args[0]),
                                     output_id=ser.id(n)))


def _to_copy(ser: Serializer, n: XNode) -> None:
    fmt = n.kwargs.get("memory_format")
    to_nhwc = fmt == CHANNELS_LAST
    src = n.args[0]
    ser.define(src, nhwc=not to_nhwc and src.rank == 4)
    out = ser.define(n, nhwc=to_nhwc)
    perm = NCHW_TO_NHWC if to_nhwc else NHWC_TO_NCHW
    ser.emit(n, s.XNNStaticTranspose(num_dims=len(ser.g.shape(n)), perm=perm, input_id=ser.id(src), output_id=out))


_CATS: Final = {2: s.XNNConcatenate2, 3: s.XNNConcatenate3, 4: s.XNNConcatenate4, 5: s.XNNConcatenate5}


def _cat(ser: Serializer, n: XNode) -> None:
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


def _copy(ser: Serializer, n: XNode) -> None:
    ser.define(n)
    ser.define(n.args[0])
    ser.emit(n, s.XNNCopy(input_id=ser.id(n.args[0]), output_id=ser.id(n)))


def _clamp(n: XNode) -> tuple[float, float]:
    low, high = _arg(n, 1), _arg(n, 2)
    return (-math.inf if low is None else float(low), math.inf if high is None else float(high))


def _pad(ser: Serializer, n: XNode) -> None:
    ser.io(n)
    pads = list(n.args[1])
    rank = len(ser.g.shape(n.args[0]) or [1])
    if len(pads) % 2:
        raise XnnpackUnsupportedError(f"'{n.name}': odd number of padding values {pads}", node=n.name, op=n.target)
    pads += [0] * (2 * rank - len(pads))
    pre, post = pads[-2::-2], pads[::-2]
    if n.nhwc:
        pre, post = [pre[i] for i in NCHW_TO_NHWC], [post[i] for i in NCHW_TO_NHWC]
    ser.emit(n, s.XNNStaticConstantPad(pre_paddings=tuple(pre), post_paddings=tuple(post),
                                       padding_value=float(_arg(n, 2, 0.0)), input_id=ser.id(n.args[0]),
                                       output_id=ser.id(n)))


def _slice(ser: Serializer, n: XNode) -> None:
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


def _squeeze(ser: Serializer, n: XNode) -> None:
    """(un)squeeze of the last dim as a reshape; the one symbolic size (if any) becomes 0."""
    ser.io(n)
    shape = [d if isinstance(d, int) else 0 for d in n.tensor.shape]
    if shape.count(0) > 1 and any(not isinstance(d, int) for d in n.tensor.shape):
        raise XnnpackUnsupportedError(f"'{n.name}': more than one symbolic size", node=n.name, op=n.target)
    ser.emit(n, s.XNNStaticReshape(num_dims=len(shape), new_shape=tuple(shape), input_id=ser.id(n.args[0]),
                                   output_id=ser.id(n)))


def _leaky_relu(ser: Serializer, n: XNode) -> None:
    """The slope is absent from the args when it is torch's default, 0.01."""
    ser.io(n)
    slope = float(_arg(n, 1, 0.01))
    ser.emit(n, s.XNNLeakyReLU(negative_slope=slope, input_id=ser.id(n.args[0]), output_id=ser.id(n)))


ALIGN_CORNERS: Final = 0x8
"""XNNPACK's XNN_FLAG_ALIGN_CORNERS."""


def _upsample_bilinear(ser: Serializer, n: XNode) -> None:
    """Channels-last resize to the output's static height and width."""
    ser.define(n, nhwc=True)
    ser.define(n.args[0], nhwc=True)
    height, width = ser.g.shape(n)[-2:]
    ser.emit(n, s.XNNStaticResizeBilinear2D(new_height=height, new_width=width, input_id=ser.id(n.args[0]),
                                            output_id=ser.id(n), flags=ALIGN_CORNERS if _arg(n, 2) else 0))


def _hardtanh(n: XNode) -> tuple[float, float]:
    return (float(_arg(n, 1, -1.0)), float(_arg(n, 2, 1.0)))


VISITORS: Final[dict[str, Visitor]] = {
    "aten::linear.default": _linear,
    "aten::convolution.default": _conv,
    "aten::addmm.default": _addmm,
    "aten::mm.default": _mm,
    "aten::add.Tensor": _binary(s.XNNAdd, fused=True),
    "aten::sub.Tensor": _binary(s.XNNSubtract, fused=True),
    "aten::mul.Tensor": _binary(s.XNNMultiply, fused=True),
    "aten::div.Tensor": _binary(s.XNNDiv, fused=False),
    "aten::minimum.default": _binary(s.XNNMinimum, fused=False),
    "aten::maximum.default": _binary(s.XNNMaximum, fused=False),
    "aten::bmm.default": _binary(s.XNNBatchMatrixMultiply, fused=False),
    "aten::relu.default": _unary(s.XNNClamp, lambda n: (0.0, math.inf)),
    "aten::hardtanh.default": _unary(s.XNNClamp, _hardtanh),
    "aten::sigmoid.default": _unary(s.XNNSigmoid),
    "aten::tanh.default": _unary(s.XNNTanh),
    "aten::gelu.default": _unary(s.XNNGelu),
    "aten::abs.default": _unary(s.XNNAbs),
    "aten::neg.default": _unary(s.XNNNegate),
    "aten::floor.default": _unary(s.XNNFloor),
    "aten::ceil.default": _unary(s.XNNCeiling),
    "aten::sqrt.default": _unary(s.XNNSquareRoot),
    "aten::rsqrt.default": _unary(s.XNNReciprocalSquareRoot),
    "aten::exp.default": _unary(s.XNNExp),
    "aten::log.default": _unary(s.XNNLog),
    "aten::sin.default": _unary(s.XNNSin),
    "aten::cos.default": _unary(s.XNNCos),
    "aten::hardswish.default": _unary(s.XNNHardswish),
    "aten::leaky_relu.default": _leaky_relu,
    "aten::prelu.default": _binary(s.XNNPReLU, fused=False),
    "aten::upsample_bilinear2d.vec": _upsample_bilinear,
    "aten::_softmax.default": _softmax,
    "aten::max_pool2d.default": _max_pool,
    "aten::avg_pool2d.default": _avg_pool,
    "aten::mean.dim": _mean,
    "aten::view_copy.default": _view,
    "aten::permute_copy.default": _permute,
    "aten::_to_copy.default": _to_copy,
    "aten::cat.default": _cat,
    "aten::clamp.default": _unary(s.XNNClamp, _clamp),
    "aten::constant_pad_nd.default": _pad,
    "aten::slice_copy.Tensor": _slice,
    "aten::squeeze_copy.dim": _squeeze,
    "aten::unsqueeze_copy.default": _squeeze,
    "aten::pow.Tensor_Scalar": _unary(s.XNNSquare),
    "aten::clone.default": _copy,
    "dim_order_ops::_clone_dim_order.default": _copy,
    **QDQ_VISITORS,
}
"""Node visitor per edge op (canonical op string); an op without one cannot be delegated."""
