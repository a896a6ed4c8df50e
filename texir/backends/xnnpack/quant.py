"""int8 in the serializer: the quantization parameters of a value as ExecuTorch 1.5.1's
`QuantParams` derives them from the q/dq nodes around it, and the int32 bias XNNPACK needs (the
q/dq visitors are in `qdq.py`)."""

from __future__ import annotations

import hashlib
from typing import Any, Final, Protocol

import msgspec
import numpy as np

from texir.backends.xnnpack import schema as s
from texir.backends.xnnpack.checks import check_per_channel_counts, refuse
from texir.backends.xnnpack.errors import XnnpackUnsupportedError
from texir.backends.xnnpack.graph import XGraph, WorkNode
from texir.backends.xnnpack.int4 import bf16_bytes
from texir.backends.xnnpack.ops import (
    AFFINE,
    CHOOSE_QPARAMS,
    DQ_PER_CHANNEL,
    DQ_PER_TENSOR,
    DYNAMIC_DQ,
    DYNAMIC_Q,
    Q_PER_CHANNEL,
    Q_PER_TENSOR,
)
from texir.backends.xnnpack.quant_partition import params_at
from texir.ir import DType
from texir.ir.names import GETITEM
from texir.ir.blob import Blob

__all__ = ["QuantParams", "Serializer", "bias_params", "from_inputs", "from_outputs", "from_weights"]

QUANTS: Final = (Q_PER_TENSOR, Q_PER_CHANNEL, *sorted(DYNAMIC_Q))
DEQUANTS: Final = (DQ_PER_TENSOR, DQ_PER_CHANNEL, *sorted(DYNAMIC_DQ))
_INT32_RANGE: Final = (-(2**31), 2**31 - 1)


class Serializer(Protocol):
    """What the parameters read of `serialize.Serializer`: a protocol, so this module does not
    import the serializer that imports it."""

    g: XGraph

    def add_constant(self, blob: Blob, sha256: str | None, prefix: str = "") -> int: ...


class QuantParams(msgspec.Struct, frozen=True):
    """How one value is quantized."""

    q_input: WorkNode
    """The node whose value this is the quantized form of (for a weight: its constant)."""
    scale: float | np.ndarray[Any, Any]
    zero_point: int | np.ndarray[Any, Any]
    dtype: DType
    qmin: int
    qmax: int
    per_channel: bool = False
    axis: int = 0
    is_input: bool = False
    is_output: bool = False
    is_dynamic: bool = False
    """Quantized at run time (XNNPACK's qdint8, per token): no scale or zero point is stored."""
    num_nonbatch_dims: int = 1
    group_size: int = 0
    """Columns per scale of a group-wise weight (0: not group-wise)."""

    @property
    def is_qc4w(self) -> bool:
        return self.per_channel and not self.is_dynamic and (self.qmin, self.qmax) == (-8, 7) and self.dtype == DType.int8

    @property
    def per_channel_group(self) -> bool:
        """Group-wise (ExecuTorch: a 4-bit weight even when one group spans the row)."""
        if self.group_size <= 0:
            return False
        columns = int(np.shape(self.scale)[1]) * self.group_size
        return self.group_size <= columns if self.is_qc4w else self.group_size < columns

    def datatype(self, name: str) -> s.XNNDatatype:
        if self.is_dynamic:
            return s.XNNDatatype.xnn_datatype_qdint8
        if self.per_channel_group and self.is_qc4w:
            return s.XNNDatatype.xnn_datatype_qbint4
        if self.per_channel and not self.per_channel_group:
            if self.dtype == DType.int32:
                return s.XNNDatatype.xnn_datatype_qcint32
            if self.dtype == DType.int8 and (self.qmin, self.qmax) != (-8, 7):
                return s.XNNDatatype.xnn_datatype_qcint8
        elif self.dtype == DType.int32:
            return s.XNNDatatype.xnn_datatype_qint32
        elif self.dtype == DType.int8:
            return s.XNNDatatype.xnn_datatype_qint8
        raise XnnpackUnsupportedError(
            f"'{name}': {'per-channel' if self.per_channel else 'per-tensor'} {self.dtype} quantization in "
            f"[{self.qmin}, {self.qmax}] is not supported by the native XNNPACK backend (int8 static only); "
            "lower it with --partitioner executorch:xnnpack", node=name)


def _scalar(v: Any, name: str) -> Any:
    if isinstance(v, WorkNode):
        raise XnnpackUnsupportedError(f"'{name}': quantization parameters computed at run time (dynamic "
                                      "quantization) are not supported by the native XNNPACK backend", node=name)
    return v


def is_dynamic(node: WorkNode) -> bool:
    """A q/dq whose scale and zero point are getitems of a choose_qparams (ExecuTorch's `is_dynamic_qdq`)."""
    if node.target not in QUANTS and node.target not in DEQUANTS or len(node.args) < 4:
        return False
    params = [node.args[i] for i in params_at(node.target)]
    return all(isinstance(p, WorkNode) and p.target == GETITEM and isinstance(p.args[0], WorkNode)
               and p.args[0].target in CHOOSE_QPARAMS for p in params)


def _feeds_conv(ser: Serializer, node: WorkNode) -> bool:
    """Whether a convolution comes before any linear among the users downstream of `node` (a
    depth-first walk, as ExecuTorch's `_feeds_into_conv`)."""
    stack = [node]
    while stack:
        current = stack.pop()
        if "linear" in current.target:
            return False
        if "convolution" in current.target:
            return True
        stack.extend(ser.g.users(current))
    return False


def from_q_dq(ser: Serializer, node: WorkNode) -> QuantParams:
    """ExecuTorch's `QuantParams.from_q_dq_node` for per-tensor, per-channel and dynamic q/dq."""
    args = node.args
    if is_dynamic(node):
        q_input = args[0]
        return QuantParams(
            q_input=q_input, scale=0.0, zero_point=0, dtype=DType.float32, qmin=0, qmax=0,
            is_input=q_input.target == "placeholder", is_dynamic=True,
            num_nonbatch_dims=3 if _feeds_conv(ser, node) else 1,
        )
    if node.target in AFFINE:
        return _group_wise(node)
    q_input = node.inputs()[0]
    per_channel = node.target in (Q_PER_CHANNEL, DQ_PER_CHANNEL)
    scale: Any
    zero_point: Any
    if per_channel:
        if not all(isinstance(a, WorkNode) and a.const is not None for a in args[1:3]):
            raise XnnpackUnsupportedError(f"'{node.name}': per-channel scales and zero points must be constants",
                                          node=node.name, op=node.target)
        scale, zero_point, axis = args[1].const.numpy(), args[2].const.numpy(), int(args[3])
        shape = q_input.const.shape if q_input.const is not None else tuple(ser.g.shape(q_input))
        check_per_channel_counts(node, scale, zero_point, axis, shape)
    else:
        scale, zero_point, axis = float(_scalar(args[1], node.name)), int(_scalar(args[2], node.name)), 0
    dtype = args[-1]
    if not isinstance(dtype, DType):
        raise XnnpackUnsupportedError(f"'{node.name}': no quantized dtype argument", node=node.name, op=node.target)
    return QuantParams(
        q_input=q_input, scale=scale, zero_point=zero_point, dtype=dtype, qmin=int(args[-3]), qmax=int(args[-2]),
        per_channel=per_channel, axis=axis, is_input=q_input.target == "placeholder",
        is_output=any(u.target == "output" for u in ser.g.users(node)),
    )


def _group_wise(node: WorkNode) -> QuantParams:
    """torchao's affine dequantize of a static weight: per-channel groups of block_size[-1] columns."""
    args = node.args
    block, scale, zero_point = args[1], args[2], args[3]
    ok = (isinstance(args[0], WorkNode) and args[0].const is not None and isinstance(block, list) and len(block) == 2
          and block[0] == 1 and all(isinstance(a, WorkNode) and a.const is not None for a in (scale, zero_point))
          and args[4] == DType.int8)
    if not ok:
        raise XnnpackUnsupportedError(
            f"'{node.name}': {node.target} is supported by the native XNNPACK backend on a constant int8 weight "
            "grouped by [1, group size] with constant scales and zero points only", node=node.name, op=node.target)
    scales, zero_points = scale.const.numpy(), zero_point.const.numpy()
    if scales.ndim == 1:
        scales, zero_points = scales.reshape(-1, 1), zero_points.reshape(-1, 1)
    check_per_channel_counts(node, scales, zero_points, 0, args[0].const.shape)  # one row of scales per channel
    return QuantParams(
        q_input=args[0], scale=scales, zero_point=zero_points, dtype=DType.int8, qmin=int(args[5]),
        qmax=int(args[6]), per_channel=True, axis=0, is_input=False, group_size=int(block[1]),
    )


def from_inputs(ser: Serializer, n: WorkNode) -> QuantParams | None:
    """An implicit dq feeding an op: the params of its q (when that quantizes a constant) or its own."""
    if n.target not in DEQUANTS or not n.implicit:
        return None
    src = n.args[0]
    if isinstance(src, WorkNode) and src.target in QUANTS and src.args[0].const is not None:
        return from_q_dq(ser, src)
    return from_q_dq(ser, n)


def from_outputs(ser: Serializer, n: WorkNode) -> QuantParams | None:
    """A value whose only user is an implicit q has that q's params."""
    users = ser.g.users(n)
    if len(users) == 1 and users[0].target in QUANTS and users[0].implicit:
        return from_q_dq(ser, users[0])
    return None


def from_weights(ser: Serializer, n: WorkNode) -> QuantParams | None:
    if n.target not in DEQUANTS:
        return None
    src = n.args[0] if isinstance(n.args[0], WorkNode) and n.args[0].target in QUANTS else n
    if src.args[0].const is None:
        raise XnnpackUnsupportedError(f"'{n.name}': a quantized weight must be a constant", node=n.name, op=n.target)
    return from_q_dq(ser, src)


def bias_params(bias: WorkNode, weight: QuantParams | None, act: QuantParams | None) -> QuantParams | None:
    """The int32 quantization of a GEMM's bias: scale = weight scale x input scale, zero point 0."""
    if weight is None or act is None:
        if (weight is None) != (act is None):
            raise refuse("bias_quantization", bias, "the weight and the input of the GEMM it biases must both be "
                         "quantized, or neither", "quantize both (XNNPACKQuantizer does) or neither")
        return None
    if act.is_dynamic:
        return None  # XNNPACK takes a float bias with dynamically quantized inputs
    if act.per_channel or not isinstance(act.scale, float):
        raise refuse("bias_quantization", bias, "the input of the GEMM it biases is quantized per channel",
                     "quantize GEMM inputs per tensor")
    if weight.per_channel:
        scale: Any = (np.asarray(weight.scale, dtype=np.float32) * np.float32(act.scale)).astype(np.float32)
        zero_point: Any = np.zeros(np.shape(weight.zero_point), dtype=np.int64)
    else:
        scale, zero_point = float(weight.scale) * act.scale, 0
    return QuantParams(q_input=bias, scale=scale, zero_point=zero_point, dtype=DType.int32,
                       qmin=_INT32_RANGE[0], qmax=_INT32_RANGE[1], per_channel=weight.per_channel)


def quantize(arr: np.ndarray[Any, Any], qp: QuantParams, name: str) -> np.ndarray[Any, Any]:
    """quantized_decomposed's quantize_per_tensor/per_channel in float32, as torch computes it."""
    if qp.dtype != DType.int32 or arr.dtype != np.float32:
        raise XnnpackUnsupportedError(
            f"'{name}': a {arr.dtype} constant quantized to {qp.dtype} must come already quantized (pt2e folds "
            "its weights); the native XNNPACK backend quantizes float32 biases to int32 only", node=name)
    if qp.per_channel:
        shape = [1] * arr.ndim
        shape[qp.axis] = -1
        inv = (np.float32(1.0) / np.asarray(qp.scale, dtype=np.float32)).reshape(shape)
        zp = np.asarray(qp.zero_point).reshape(shape)
        rounded = np.round(arr * inv) + zp.astype(np.float32)
    else:
        inv_scale = np.float32(1.0 / float(qp.scale))
        rounded = np.round(arr * inv_scale) + np.float32(int(qp.zero_point))
    low, high = np.float32(qp.qmin), np.float32(qp.qmax)
    out: np.ndarray[Any, Any] = np.clip(rounded.astype(np.float32), low, high).astype(np.int32)
    return out


def schema_params(ser: Serializer, qp: QuantParams, axis: int) -> s.XNNQuantParams:
    """The blob's params; per-channel scales become their own named data entry (`scale_<sha256>`),
    appended right after the value's data entry."""
    if qp.is_dynamic:
        return s.PerTokenDynamicQuant(num_nonbatch_dims=qp.num_nonbatch_dims)
    if qp.per_channel_group:
        index = _scale_constant(ser, bf16_bytes(np.asarray(qp.scale), qp.q_input.name))
        return s.PerChannelGroupQuant(scale=(), channel_dim=axis, group_size=qp.group_size,
                                      scale_buffer_idx=index, num_scales=int(np.size(qp.scale)))
    if not qp.per_channel:
        return s.PerTensorQuant(scale=float(qp.scale), zero_point=int(qp.zero_point))
    scale = np.asarray(qp.scale)
    if scale.dtype != np.float32:
        raise XnnpackUnsupportedError(f"'{qp.q_input.name}': per-channel scales must be float32, got {scale.dtype}",
                                      node=qp.q_input.name)
    index = _scale_constant(ser, np.ascontiguousarray(scale).tobytes())
    return s.PerChannelQuant(scale=(), channel_dim=axis, scale_buffer_idx=index, num_scales=int(scale.size))


def _scale_constant(ser: Serializer, data: bytes) -> int:
    """Per-channel scales as their own named data: keyed `scale_<sha256>` as ExecuTorch keys them;
    the entry's sha256 is the payload's digest, as for every named-data entry."""
    digest = hashlib.sha256(data).hexdigest()
    return ser.add_constant(Blob(data, digest=digest), digest, "scale_")


def swapped_axis(qp: QuantParams, rank: int) -> QuantParams:
    """The channel axis of a depthwise filter after its in/out swap."""
    if not qp.per_channel:
        return qp
    return msgspec.structs.replace(qp, axis=rank - 1 if qp.axis == 0 else 0 if qp.axis == 1 else qp.axis)
