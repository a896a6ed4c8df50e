"""ExecuTorch 1.5.1's XNNPACK preprocess refuses some graphs with an error (asserts in `QuantParams`,
`validate_quant_scales` / `validate_quant_zeropoints`, the node visitors). The native backend refuses
the same graphs, before any bytes are written, with an `XnnpackCheckError` naming the node, the
check (a `CHECKS` key) and the fix. docs/xnnpack-checks.md maps every ExecuTorch check to its native
counterpart and its test."""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from texir.backends.xnnpack.errors import XnnpackCheckError
from texir.backends.xnnpack.graph import WorkNode
from texir.ir import DType

__all__ = ["CHECKS", "check_per_channel_counts", "check_scales_zero_points", "refuse"]

CHECKS: Final[dict[str, str]] = {
    "per_channel_scales": "operators/quant_params.py QuantParams.__init__: a per-channel tensor has one scale per "
                          "channel of its axis",
    "per_channel_zero_points": "operators/quant_params.py QuantParams.__init__: a per-channel tensor has one zero "
                               "point per channel of its axis",
    "finite_normal_scales": "utils/quant_utils.py validate_quant_scales (from op_quant_dequant.py "
                            "OpStaticQDQNode.check_scales_zeropoints): every scale finite and not zero or subnormal",
    "zero_point_range": "utils/quant_utils.py validate_quant_zeropoints: zero points inside the quantized dtype "
                        "(int8 [-128, 127], uint8 [0, 255], int32 0)",
    "quantized_dtype": "utils/quant_utils.py validate_quant_zeropoints: the q/dq dtype is int8, uint8 or int32",
    "bias_quantization": "operators/quant_params.py QuantParams.from_bias: a GEMM's weight and input are both "
                         "quantized or neither; a quantized input is per tensor with a float scale",
    "nhwc_rank": "operators/op_view_copy.py, op_permute.py, op_static_constant_pad.py define_node: a reshape, "
                 "transpose or pad tagged channels-last is 4-D",
    "reshape_dynamic_dims": "operators/op_view_copy.py, op_squeeze.py define_node: a static reshape has at most "
                            "one dynamic (0) size",
    "squeeze_last_dim": "operators/op_squeeze.py OpSqueezeDim / OpUnsqueezeDim define_node: (un)squeeze of the "
                        "last dim only",
    "pool_rank": "operators/op_max_pool2d.py, op_max_dim.py define_node: a max pooling's input is 4-D",
    "clone_dim_order": "operators/op_clone.py define_node: a clone keeps its input's dim order",
    "upsample_static": "_passes/convert_to_upsample_bilinear2d.py create_upsample_bilinear_2d: static output "
                       "height and width",
    "group_wise_4bit": "operators/node_visitor.py _check_per_channel_group_params, get_serialized_dtype: "
                       "group-wise weights are 4-bit",
    "nhwc_compatible": "_passes/channels_last_tagged_reshape_pass.py input_to_nhwc: a value converted to "
                       "channels-last is 4-D and not a contiguous-only constant",
    "constant_one_layout": "_passes/channels_last_tagged_reshape_pass.py input_to_nhwc / input_to_nchw: a constant "
                           "is read channels-last everywhere or contiguous everywhere",
    "channels_last_inputs": "_passes/channels_last_tagged_reshape_pass.py call: a channels-last op's inputs after "
                            "the first are not channels-last graph inputs",
}
"""ExecuTorch's refusing checks that the native backend mirrors with this error type, by id."""

_CALIBRATE: Final = ("run the prepared model on example inputs before convert_pt2e (dynamic quantization needs it "
                     "too: until the prepared model runs, the weight observers have seen no weight)")
_ZP_RANGES: Final[dict[DType, tuple[int, int]]] = {DType.int8: (-128, 127), DType.uint8: (0, 255), DType.int32: (0, 0)}


def refuse(check: str, node: WorkNode, problem: str, fix: str) -> XnnpackCheckError:
    """The error for `node` failing ExecuTorch's `check`: what is wrong, then how to fix it."""
    return XnnpackCheckError(f"'{node.name}' ({node.target}): {problem}; ExecuTorch's XNNPACK backend refuses it "
                             f"too ({CHECKS[check].split(':')[0]}); {fix}", check=check, node=node.name, op=node.target)


def check_per_channel_counts(node: WorkNode, scale: np.ndarray[Any, Any], zero_point: np.ndarray[Any, Any],
                             axis: int, shape: tuple[int, ...]) -> None:
    """One scale and one zero point per channel of the quantized tensor's `axis`, as XNNPACK's
    per-channel values need (the runtime refuses the tensor otherwise)."""
    if not -len(shape) <= axis < len(shape):
        raise refuse("per_channel_scales", node, f"axis {axis} is outside the tensor of shape {list(shape)}",
                     "quantize along one of the tensor's dims")
    channels = int(shape[axis])
    for check, what, values in (("per_channel_scales", "scales", scale),
                                ("per_channel_zero_points", "zero points", zero_point)):
        count = int(np.shape(values)[0]) if np.ndim(values) else 1
        if count != channels:
            fix = _CALIBRATE if count == 1 else f"give one per channel ({channels})"
            raise refuse(check, node, f"{count} per-channel {what} along axis {axis} of a tensor of shape "
                         f"{list(shape)} ({channels} channels)", fix)


def check_scales_zero_points(node: WorkNode, scale: Any, zero_point: Any, dtype: Any) -> None:
    """`validate_quant_scales` and `validate_quant_zeropoints` on a static q/dq node's parameters
    (a float or a constant array each). Scales are judged in their own float type (a Python float as
    float32, as torch makes it a tensor): NaN, infinite, zero and positive subnormal ones are refused."""
    if any(isinstance(p, WorkNode) and p.const is None for p in (scale, zero_point)):
        return  # computed at run time: the visitor refuses it as not static
    if isinstance(scale, WorkNode) and scale.const is not None:
        values = scale.const.numpy()
    else:
        with np.errstate(over="ignore"):  # a float beyond float32's range is infinite there, and refused
            values = np.asarray(scale, dtype=np.float32)
    if not np.issubdtype(values.dtype, np.floating):
        values = values.astype(np.float32)
    finite = np.isfinite(values)
    tiny = (values >= 0) & (np.abs(values) < np.finfo(values.dtype).smallest_normal)
    bad = ~finite | tiny
    if bad.any():
        at = int(np.flatnonzero(bad.reshape(-1))[0])
        value = values.reshape(-1)[at]
        raise refuse("finite_normal_scales", node, f"scale {value} at index {at} is not a finite normal number",
                     "calibrate on inputs that vary (a zero scale comes from a constant activation or weight) "
                     f"or fix the scales; if the model was never run, {_CALIBRATE}")
    if not isinstance(dtype, DType) or dtype not in _ZP_RANGES:
        raise refuse("quantized_dtype", node, f"quantized dtype {dtype}", "quantize to int8 (XNNPACKQuantizer does)")
    zps = np.asarray(zero_point.const.numpy() if isinstance(zero_point, WorkNode) and zero_point.const is not None
                     else zero_point)
    low, high = _ZP_RANGES[dtype]
    outside = (zps < low) | (zps > high)
    if np.any(outside):
        at = int(np.flatnonzero(np.reshape(outside, -1))[0])
        raise refuse("zero_point_range", node, f"zero point {np.reshape(zps, -1)[at]} at index {at} is outside "
                     f"[{low}, {high}] for {dtype}", "fix the zero points (a quantizer derives them in range)")
