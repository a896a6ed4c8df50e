"""The q/dq visitors: an implicit q/dq node only shares its input's value id; a dynamic quantize
is a Convert to qdint8, a dynamic dequantize shares its input's id."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

import msgspec

from texir.backends.xnnpack import schema as s
from texir.backends.xnnpack.checks import check_scales_zero_points
from texir.backends.xnnpack.errors import XnnpackUnsupportedError
from texir.backends.xnnpack.graph import WorkNode
from texir.backends.xnnpack.ops import AFFINE, CHOOSE_QPARAMS, DQ_AFFINE, DQ_PER_TENSOR, Q_PER_TENSOR, VisitorName
from texir.backends.xnnpack.quant import from_q_dq, is_dynamic
from texir.backends.xnnpack.serialize import Serializer

__all__ = ["QDQ_VISITORS"]


def _implicit(ser: Serializer, n: WorkNode) -> bool:
    """Check a q/dq node's parameters (implicit or not, as ExecuTorch's visitor); an implicit one
    only shares its input's value id, and this says so."""
    check_scales_zero_points(n, n.args[1], n.args[2], n.args[-1])
    if not n.implicit:
        return False
    src = n.args[0]
    if id(src) in ser.ids:
        ser.ids[id(n)] = ser.ids[id(src)]
    return True


def _dequantize(ser: Serializer, n: WorkNode) -> None:
    src = n.args[0]
    if _implicit(ser, n):
        return
    if n.target != DQ_PER_TENSOR:
        raise XnnpackUnsupportedError(f"'{n.name}': a per-channel dequantize must feed a GEMM's weight",
                                      node=n.name, op=n.target)
    qp = msgspec.structs.replace(from_q_dq(ser, n), is_output=False)
    out = ser.define(n, quant=None)
    ser.define(src, quant=qp)
    ser.emit(n, s.XNNConvert(input_id=ser.id(src), output_id=out))


def _quantize(ser: Serializer, n: WorkNode) -> None:
    src = n.args[0]
    if _implicit(ser, n):
        return
    if n.target != Q_PER_TENSOR:
        raise XnnpackUnsupportedError(f"'{n.name}': per-channel quantize of an activation", node=n.name,
                                      op=n.target)
    qp = msgspec.structs.replace(from_q_dq(ser, n), q_input=n, is_input=False)
    ser.define(src, quant=None)
    out = ser.define(n, quant=qp)
    ser.emit(n, s.XNNConvert(input_id=ser.id(src), output_id=out))


def _not_dynamic(n: WorkNode) -> XnnpackUnsupportedError:
    return XnnpackUnsupportedError(
        f"'{n.name}': {n.target} with a scale and zero point that are not a choose_qparams's outputs is not "
        "supported by the native XNNPACK backend (dynamic quantization only); leave it out of the partition",
        node=n.name, op=n.target)


def _check_per_token(ser: Serializer, n: WorkNode) -> None:
    """torchao's affine q/dq of an activation must be per token: blocks of one row."""
    if n.target not in AFFINE:
        return
    block, shape = n.args[1], n.args[0].tensor.shape
    if not isinstance(block, list) or len(block) != len(shape) or any(b != 1 for b in block[:-1]) or (
            block[-1] != shape[-1]):
        raise XnnpackUnsupportedError(
            f"'{n.name}': a dynamically quantized activation must be quantized per token (block_size [1, ..., 1, "
            f"{shape[-1]}]), got {block}", node=n.name, op=n.target)


def _dynamic_quantize(ser: Serializer, n: WorkNode) -> None:
    """A Convert from the float input to a qdint8 value, whatever the tag."""
    if not is_dynamic(n):
        raise _not_dynamic(n)
    _check_per_token(ser, n)
    src = n.args[0]
    ser.define(src, quant=None)
    qp = msgspec.structs.replace(from_q_dq(ser, n), q_input=n, is_input=False)
    out = ser.define(n, quant=qp)
    ser.emit(n, s.XNNConvert(input_id=ser.id(src), output_id=out))


def _dynamic_dequantize(ser: Serializer, n: WorkNode) -> None:
    """Always implicit: the value is its quantize's qdint8 one (torchao's affine dequantize of a
    static group-wise weight: nothing, its GEMM stores the weight)."""
    src = n.args[0]
    if n.target == DQ_AFFINE and not is_dynamic(n) and isinstance(src, WorkNode) and src.const is not None:
        return
    if not is_dynamic(n):
        raise _not_dynamic(n)
    _check_per_token(ser, n)
    if id(src) in ser.ids:
        ser.ids[id(n)] = ser.ids[id(src)]


def _choose_qparams(ser: Serializer, n: WorkNode) -> None:
    """Run time params of a dynamic quantize: nothing to serialize (XNNPACK computes them)."""


def _getitem(ser: Serializer, n: WorkNode) -> None:
    src = n.args[0]
    if not isinstance(src, WorkNode) or src.target not in CHOOSE_QPARAMS:
        raise XnnpackUnsupportedError(
            f"'{n.name}': a getitem of {getattr(src, 'target', src)!r} cannot be serialized by the native XNNPACK "
            "backend (only a choose_qparams's outputs, which it skips)", node=n.name, op=n.target)


QDQ_VISITORS: Final[Mapping[VisitorName, Callable[[Serializer, WorkNode], None]]] = {
    "quantize": _quantize,
    "dequantize": _dequantize,
    "dynamic_quantize": _dynamic_quantize,
    "dynamic_dequantize": _dynamic_dequantize,
    "choose_qparams": _choose_qparams,
    "getitem": _getitem,
}
"""The q/dq visitors by the name an `ops.OPS` entry gives."""
