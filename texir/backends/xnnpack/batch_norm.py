"""Batch norms in a partition, as ExecuTorch 1.5.1's XNNPACK preprocess treats them:
FuseBatchNormPass folds a no-training batch norm into the single-user convolution or linear before
it, and DecomposeBatchNorm turns any other one it can into a 1x1 depthwise convolution (NC inputs
between an unsqueeze and a squeeze). The new weights are computed with the arithmetic of torch's
`fuse_conv_bn_weights` / `fuse_linear_bn_weights` (in the weights' dtype) and of DecomposeBatchNorm
(float64, then the running mean's dtype)."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from texir.backends.xnnpack.graph import Const, XGraph, WorkNode
from texir.backends.xnnpack.ops import BN, CONV, LINEAR, SQUEEZE, UNSQUEEZE
from texir.ir import DType, TensorMeta
from texir.ir.names import GETITEM

__all__ = ["decompose_batch_norm", "fuse_batch_norm"]


_KINDS: dict[Any, DType] = {np.float32: DType.float32, np.float16: DType.float16}


def _array(node: Any) -> np.ndarray[Any, Any] | None:
    return node.const.numpy() if isinstance(node, WorkNode) and node.const is not None else None


def _constant(name: str, array: np.ndarray[Any, Any], dtype: DType, like: TensorMeta) -> WorkNode:
    shape = tuple(int(d) for d in array.shape)
    node = WorkNode(name, "placeholder", meta=msgspec.structs.replace(like, shape=shape, strides=_strides(shape)))
    node.const = Const(dtype, shape, array=np.ascontiguousarray(array))
    return node


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _getitems_only(g: XGraph, bn: WorkNode) -> list[WorkNode] | None:
    users = g.users(bn)
    return users if all(u.target == GETITEM and u.args[1] == 0 for u in users) else None


def fuse_batch_norm(g: XGraph) -> None:
    """FuseBatchNormPass: a batch norm after a convolution (1-D or 2-D) or linear it is the only user
    of, with static weights, is folded into new `<weight>_fused_bn` constants (float32 or float16)."""
    for src in [n for n in g.nodes if n.target in (CONV, LINEAR)]:
        users = g.users(src)
        if len(users) != 1 or users[0].target != BN:
            continue
        bn = users[0]
        getitems = _getitems_only(g, bn)
        w, bw = _array(src.args[1]), _array(bn.args[1])
        if getitems is None or w is None or bw is None or w.dtype.type not in _KINDS:
            continue
        if src.target == CONV and src.args[0].rank not in (3, 4):
            continue
        bias_arg = src.args[2] if len(src.args) > 2 else None
        rm, rv, bb = _array(bn.args[3]), _array(bn.args[4]), _array(bn.args[2])
        b = _array(bias_arg)
        if rm is None or rv is None or bb is None or (bias_arg is not None and b is None):
            continue
        b = b if b is not None else np.zeros_like(rm)
        # torch rounds each op's float result to the dtype (numpy's float16 ops do too); rsqrt once.
        var = (rv.astype(np.float32) + np.float32(bn.args[-1])).astype(rv.dtype)
        rsqrt = (np.float32(1.0) / np.sqrt(var.astype(np.float32))).astype(rv.dtype)
        if src.target == CONV:
            shape = [1, -1] if src.args[6] else [-1, 1]
            fused_w = w * (bw * rsqrt).reshape(shape + [1] * (w.ndim - 2))
            fused_b = (b - rm) * rsqrt * bw + bb
        else:
            scale = bw * rsqrt
            fused_w = w * scale[:, None]
            fused_b = (b - rm) * scale + bb
        kind, dtype = _KINDS[w.dtype.type], w.dtype
        # (copy=False: the products are new arrays already, of the weights' dtype where torch's are)
        weight = _constant(src.args[1].name + "_fused_bn", fused_w.astype(dtype, copy=False), kind, src.args[1].meta)
        bias = _constant(src.args[1].name + "_bias_fused_bn", fused_b.astype(dtype, copy=False), kind, bn.args[1].meta)
        g.nodes.insert(g.nodes.index(src.args[1]), weight)
        g.nodes.insert(g.nodes.index(weight) + 1, bias)
        g.set_args(src, [src.args[0], weight, bias, *src.args[3:]])
        src.meta = getitems[0].meta if getitems else src.meta
        for u in getitems:
            g.replace_all_uses(u, src)
    g.erase_dead()
    used = {id(i) for n in g.nodes for i in n.inputs()}
    g.nodes = [n for n in g.nodes if n.user_input or n.is_call or n.target == "output" or id(n) in used]
    g.erase_dead()




def decompose_batch_norm(g: XGraph) -> None:
    """DecomposeBatchNorm: each remaining batch norm of an NC, NCL or NCHW float tensor whose running
    stats are constants (and weight and bias, when given) becomes a depthwise convolution with a
    1x1 kernel; an NC input is unsqueezed to NC1 for it and squeezed back. The new nodes carry no
    debug handle."""
    for bn in [n for n in g.nodes if n.target == BN]:
        x = bn.args[0]
        getitems = _getitems_only(g, bn)
        rank = x.rank
        if getitems is None or rank not in (2, 3, 4) or not isinstance(x.tensor.shape[1], int):
            continue
        gamma, beta, rm, rv = (_array(a) for a in bn.args[1:5])
        if rm is None or rv is None or any(a is not None and v is None for a, v in zip(bn.args[1:3], (gamma, beta))):
            continue
        dtype = rm.dtype
        denom = np.sqrt(rv.astype(np.float64) + np.float64(np.float32(bn.args[-1])))
        g64 = gamma.astype(np.float64) if gamma is not None else np.ones(1)
        b64 = beta.astype(np.float64) if beta is not None else np.zeros(1)
        weight64, bias64 = g64 / denom, -rm.astype(np.float64) * g64 / denom + b64
        channels, spatial = int(x.tensor.shape[1]), max(rank - 2, 1)
        kind = _KINDS[dtype.type]
        like = bn.args[3].meta
        weight = _constant(f"{bn.name}_decomposed_bn_weight",
                           _cast(weight64, dtype).reshape([channels, 1] + [1] * spatial), kind, like)
        bias = _constant(f"{bn.name}_decomposed_bn_bias", _cast(bias64, dtype), kind, like)
        at = g.nodes.index(bn.args[3])
        g.nodes[at:at] = [weight, bias]
        source, out_meta = x, getitems[0].meta if getitems else bn.meta
        if rank == 2:
            shape = (*x.tensor.shape, 1)
            meta3 = msgspec.structs.replace(x.tensor, shape=shape, strides=_strides(tuple(int(d) for d in shape)))
            source = WorkNode(f"{bn.name}_unsqueeze", UNSQUEEZE, [x, 2], {}, meta3)
        conv = WorkNode(f"{bn.name}_conv", CONV, [source, weight, bias, [1] * spatial, [0] * spatial, [1] * spatial,
                                              False, [0] * spatial, channels], {},
                     source.meta if rank == 2 else out_meta)
        new = [conv] if rank != 2 else [source, conv, WorkNode(f"{bn.name}_squeeze", SQUEEZE, [conv, 2],
                                                            {}, out_meta)]
        at = g.nodes.index(bn)
        g.nodes[at + 1:at + 1] = new
        g._users = None
        for u in getitems:
            g.replace_all_uses(u, new[-1])
        g.nodes = [n for n in g.nodes if n is not bn and n not in getitems]
        g._users = None
    g.erase_dead()


def _cast(values: np.ndarray[Any, Any], dtype: Any) -> np.ndarray[Any, Any]:
    """float64 to `dtype` as torch's `.to` rounds (to float16 through float32)."""
    return values.astype(np.float32).astype(dtype)
