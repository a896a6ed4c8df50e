"""Quantized (pt2e) patterns for the native XNNPACK partitioner, as ExecuTorch 1.5.1's configs
find them. Static int8: a GEMM (linear, convolution) with a dequantized static weight, a
dequantized activation (a convolution's may come through a zero spatial pad, which joins the pattern)
and a quantize after it (through an optional relu/hardtanh), and element-wise
ops whose inputs are all dequantized and whose only user (through an optional fused relu) is a
quantize. Dynamic int8: a linear with a per-channel dequantized static weight whose activation is
quantized at run time (choose_qparams -> two getitems -> quantize -> dequantize), with no quantize
after it. The q/dq nodes of a matched pattern are *implicit*: the backend folds them into the
quantized values (a dynamic quantize still becomes a Convert). The partitioner passes that tag to
the backend as a `BackendNodeMeta` note.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import msgspec

from texir.backends.xnnpack.ops import (
    AFFINE,
    CHOOSE_QPARAMS,
    CONV,
    DQ_AFFINE,
    DQ_PER_CHANNEL,
    DQ_PER_TENSOR,
    DYNAMIC_DQ,
    DYNAMIC_Q,
    INT8_GEMMS,
    INT8_GENERIC,
    LINEAR,
    PAD,
    PATTERN_CHECKS,
    Q_PER_TENSOR,
)
from texir.ir import CallFunction, DType, DTypeArg, NoneArg, Program, Ref, TensorMeta
from texir.ir.analysis import value_metas
from texir.ir.names import GETITEM

__all__ = ["IMPLICIT_KEY", "QuantPlan", "params_at", "quant_patterns"]

IMPLICIT_KEY: Final = "IS_IMPLICIT_Q_DQ_TAG"
"""ExecuTorch's node-meta key for an implicit q/dq node (the note's value is "true")."""


class QuantPlan(msgspec.Struct):
    """What the int8 analysis found in one program."""

    gemms: set[str] = msgspec.field(default_factory=set)
    """Quantized GEMMs whose whole pattern is valid (taken with their deps)."""
    deps: dict[str, str] = msgspec.field(default_factory=dict)
    """Node (call or constant) -> the anchor op whose partition it joins."""
    implicit: set[str] = msgspec.field(default_factory=set)
    members: dict[str, list[str]] = msgspec.field(default_factory=dict)
    """Anchor op -> every node its config takes with it (`deps` keeps each node's first anchor only)."""
    refused: dict[str, str] = msgspec.field(default_factory=dict)
    """Node -> why the native backend turns down its quantized form."""
    static: bool = True
    """False when the partitioner's options leave static int8 out."""
    dynamic: bool = True
    """False when the partitioner's options leave dynamic int8 out."""


def _ref(node: CallFunction, i: int | None) -> str | None:
    a = node.args[i] if i is not None and len(node.args) > i else None
    return a.name if isinstance(a, Ref) else None


def _qdtype(node: CallFunction) -> DType | None:
    last = node.args[4 if node.target in AFFINE else -1] if len(node.args) > 4 else None
    return last.value if isinstance(last, DTypeArg) else None


def _bounds(node: CallFunction) -> tuple[object, object]:
    """qmin and qmax of a q/dq node."""
    n = len(node.args)
    low, high = (5, 6) if node.target in AFFINE else (n - 3, n - 2)

    def value(i: int) -> object:
        return getattr(node.args[i], "value", None) if 0 <= i < n else None

    return value(low), value(high)


def params_at(target: str) -> tuple[int, int]:
    """Argument positions of a q/dq node's scale and zero point."""
    return (2, 3) if target in AFFINE else (1, 2)


class _Graph:
    """Call nodes by name and their users (each once, in graph order)."""

    def __init__(self, program: Program) -> None:
        self.calls = {n.name: n for n in program.graph.nodes if isinstance(n, CallFunction)}
        self.metas = value_metas(program.graph)
        users: dict[str, list[str]] = {}
        for n in program.graph.nodes:
            for a in dict.fromkeys(_walk(getattr(n, "args", ()))):
                users.setdefault(a, []).append(n.name)
        self.users = users

    def target(self, name: str | None) -> str:
        node = self.calls.get(name) if name is not None else None
        return node.target if node is not None else ""

    def only_user(self, name: str) -> str | None:
        found = self.users.get(name, [])
        return found[0] if len(found) == 1 else None

    def tail(self, name: str, acts: frozenset[str]) -> tuple[list[str], str | None]:
        """The optional fused activation after `name` and the quantize ending the pattern (None:
        there is none)."""
        out = self.only_user(name)
        deps: list[str] = []
        if out is not None and self.target(out) in acts:
            deps.append(out)
            after = self.only_user(out)
            out = after if after is not None else out
        return deps, out if out is not None and self.target(out) == Q_PER_TENSOR else None


def quant_patterns(program: Program, constants: frozenset[str], accepts: Callable[[CallFunction], bool], *,
                   static: bool = True, dynamic: bool = True) -> QuantPlan:
    """The int8 patterns of `program`'s top-level graph (see the module doc), static and dynamic
    ones as enabled. `accepts` is the op's own float check: a pattern counts only around an op its
    config takes (ExecuTorch checks a config's constraints before it collects the q/dq around the op)."""
    g = _Graph(program)
    plan = QuantPlan(static=static, dynamic=dynamic)
    for node in g.calls.values():
        if node.target in INT8_GEMMS:
            _gemm(node, g, constants, plan)
        elif static and node.target in INT8_GENERIC and accepts(node):
            inputs = list(dict.fromkeys(_walk(node.args)))
            if not inputs or any(g.target(i) not in (DQ_PER_TENSOR, DQ_PER_CHANNEL) for i in inputs):
                continue
            fused, q = g.tail(node.name, INT8_GENERIC[node.target])
            if q is None:
                continue
            check = PATTERN_CHECKS.get(node.target)
            why = check(g.calls[inputs[0]], g.calls[q]) if check is not None else None
            if why is not None:
                plan.refused[node.name] = why
                continue
            plan.members[node.name] = [*inputs, *fused, q]
            for dep in (*inputs, *fused, q):
                plan.deps.setdefault(dep, node.name)
            plan.implicit.update((*inputs, q))
    return plan


def _gemm(node: CallFunction, g: _Graph, constants: frozenset[str], plan: QuantPlan) -> None:
    spec = INT8_GEMMS[node.target]
    act_i, w_i, b_i = spec.activation, spec.weight, spec.bias
    w_name = _ref(node, w_i)
    w_node = g.calls.get(w_name) if w_name is not None else None
    if w_node is None or w_node.target not in (DQ_PER_TENSOR, DQ_PER_CHANNEL, DQ_AFFINE):
        return  # a float GEMM (or a weight the float checks turn down)
    act = g.calls.get(_ref(node, act_i) or "")
    pad = act if plan.static and act is not None and _foldable_pad(node, act, g) else None
    if pad is not None:
        act = g.calls.get(_ref(pad, 0) or "")  # ExecuTorch's conv config looks through the pad
    if act is not None and act.target in DYNAMIC_DQ:
        _dynamic_gemm(node, w_node, act, g, constants, plan)
        return
    if not plan.static:
        return  # the float check turns it down (its weight is not a constant)
    if w_node.target == DQ_AFFINE:
        plan.refused[node.name] = "torchao's affine weights with static activations are not supported by XNNPACK"
        return
    why = _gemm_refusal(node, w_node, act, constants)
    fused: list[str] = []
    q: str | None = None
    if why is None:
        fused, q = g.tail(node.name, spec.config_acts)
        if q is None:
            why = "a static-int8 GEMM must be followed by a quantize (through at most one relu/hardtanh)"
    if why is not None or act is None or q is None:
        plan.refused[node.name] = why or "incomplete static-int8 pattern"
        return
    deps = [w_node.name, *_walk(w_node.args), act.name, *fused, q, *([pad.name] if pad is not None else [])]
    bias = _ref(node, b_i)
    if bias is not None:
        deps.append(bias)
    plan.gemms.add(node.name)
    plan.members[node.name] = deps
    for dep in deps:
        plan.deps.setdefault(dep, node.name)
    plan.implicit.update((w_node.name, act.name, q))


def _dynamic_gemm(node: CallFunction, w_node: CallFunction, act: CallFunction, g: _Graph,
                  constants: frozenset[str], plan: QuantPlan) -> None:
    """A GEMM whose activation is quantized at run time: the dequantized weight and its constants,
    the activation's dq, q, the two getitems and the choose_qparams join it; nothing after it."""
    why, chain = _dynamic_refusal(node, w_node, act, g, constants)
    if not plan.dynamic:
        why = "dynamic_int8 is not in config_precisions"
    if why is not None:
        plan.refused[node.name] = why
        return
    deps = [w_node.name, *_walk(w_node.args), *chain]
    bias = _ref(node, 2)
    if bias is not None:
        deps.append(bias)
    plan.gemms.add(node.name)
    plan.members[node.name] = deps
    for dep in deps:
        plan.deps.setdefault(dep, node.name)
    plan.implicit.update((w_node.name, *chain[:2]))


def _dynamic_refusal(node: CallFunction, w_node: CallFunction, act: CallFunction, g: _Graph,
                     constants: frozenset[str]) -> tuple[str | None, list[str]]:
    """Why the native backend turns a dynamically quantized GEMM down (None: it takes it) and the
    activation's chain: dq, q, getitem, getitem, choose_qparams."""
    if node.target != LINEAR:
        return ("dynamically quantized convolutions are not yet supported by the native XNNPACK backend "
                "(--partitioner executorch:xnnpack takes 2-D ones)"), []
    if _ref(w_node, 0) not in constants:
        return "the quantized weight is not a parameter, buffer or constant", []
    if w_node.target == DQ_PER_TENSOR:
        return "XNNPACK does not support per-tensor quantized weights with dynamically quantized activations", []
    if not all(_ref(w_node, i) in constants for i in params_at(w_node.target)):
        return "per-channel scales and zero points are not constants", []
    if w_node.target == DQ_AFFINE:
        why = _group_refusal(w_node, g)
        if why is not None:
            return why, []
    elif _qdtype(w_node) != DType.int8 or _bounds(w_node) == (-8, 7):
        return "only int8 per-channel weights are supported by the native XNNPACK backend (4-bit: group-wise)", []
    q = g.calls.get(_ref(act, 0) or "")
    if q is None or q.target not in DYNAMIC_Q:
        return "the dynamically dequantized activation does not come from a quantize", []
    getitems = [g.calls.get(_ref(q, i) or "") for i in params_at(q.target)]
    if not all(x is not None and x.target == GETITEM for x in getitems):
        return "the activation's scale and zero point are not a choose_qparams's outputs", []
    first, second = (x.name for x in getitems if x is not None)
    choose = g.calls.get(_ref(g.calls[first], 0) or "")
    if choose is None or choose.target not in CHOOSE_QPARAMS:
        return "the activation's scale and zero point are not a choose_qparams's outputs", []
    if _qdtype(q) != DType.int8:
        return "dynamically quantized activations must be int8", []
    b = node.args[2] if len(node.args) > 2 else None
    if b is not None and not isinstance(b, NoneArg) and _ref(node, 2) not in constants:
        return "bias is not static", []
    return None, [act.name, q.name, first, second, choose.name]


def _group_refusal(w_node: CallFunction, g: _Graph) -> str | None:
    """torchao's weight dequantize as XNNPACK takes it: 4-bit int8 values in blocks of one row by a
    multiple of 32 columns, or int8 values in blocks of a whole row (per channel). ExecuTorch's
    partitioner takes others, then fails to lower them."""
    block = w_node.args[1]
    sizes = [getattr(x, "value", None) for x in getattr(block, "items", ())]
    weight = g.metas.get(_ref(w_node, 0) or "")
    columns = weight.shape[-1] if isinstance(weight, TensorMeta) and len(weight.shape) == 2 else None
    if _qdtype(w_node) != DType.int8 or len(sizes) != 2 or sizes[0] != 1 or not isinstance(sizes[1], int):
        return f"only int8 weights in blocks of [1, columns] are supported by XNNPACK, got blocks of {sizes}"
    if _bounds(w_node) != (-8, 7):
        if sizes[1] != columns:
            return "8-bit weights are supported by XNNPACK per channel only (blocks of a whole row), not in groups"
    elif sizes[1] % 32:
        return f"4-bit group-wise weights need groups of a multiple of 32 columns, got {sizes[1]}"
    return None


def _foldable_pad(conv: CallFunction, pad: CallFunction, g: _Graph) -> bool:
    """A zero padding of the spatial dims of a dequantized value, read by `conv` alone: ExecuTorch's
    convolution config takes it into a quantized convolution's pattern (its backend quantizes the pad
    with its input's params)."""
    if conv.target != CONV or pad.target != PAD or g.only_user(pad.name) != conv.name:
        return False
    if getattr(conv.args[6], "value", False):
        return False  # transposed
    weight = g.metas.get(_ref(conv, 1) or "")
    spatial = len(weight.shape) - 2 if isinstance(weight, TensorMeta) else 0
    amounts = [getattr(a, "value", None) for a in getattr(pad.args[1], "items", ())]
    value = getattr(pad.args[2], "value", None) if len(pad.args) > 2 else 0.0
    if value != 0.0 or spatial not in (1, 2) or not all(isinstance(a, int) and a >= 0 for a in amounts):
        return False
    if any(amounts[2 * spatial:]):
        return False  # pads a channel or batch dim
    return g.target(_ref(pad, 0)) in (DQ_PER_TENSOR, DQ_PER_CHANNEL, *DYNAMIC_DQ, DQ_AFFINE)


def _gemm_refusal(node: CallFunction, w_node: CallFunction, act: CallFunction | None,
                  constants: frozenset[str]) -> str | None:
    weight = _ref(w_node, 0)
    if weight is None or weight not in constants:
        return "the quantized weight is not a parameter, buffer or constant"
    if w_node.target == DQ_PER_CHANNEL and not all(_ref(w_node, i) in constants for i in (1, 2)):
        return "per-channel scales and zero points are not constants"
    qmin, qmax = (getattr(w_node.args[i], "value", None) for i in (-3, -2))
    if _qdtype(w_node) != DType.int8 or (qmin, qmax) == (-8, 7):
        return "only int8 weights are supported by the native XNNPACK backend (no 4-bit)"
    if act is None or act.target != DQ_PER_TENSOR:
        if act is not None and act.target == PAD:
            return ("a padding before a quantized convolution must pad the spatial dims of a dequantized value with "
                    "zeros, non-negative amounts, and feed only the convolution (XNNPACK then quantizes it)")
        return "the activation is not dequantized per tensor"
    if _qdtype(act) != DType.int8:
        return "activations must be int8"
    b = node.args[2] if len(node.args) > 2 else None
    if b is not None and not isinstance(b, NoneArg) and _ref(node, 2) not in constants:
        return "bias is not static"
    if node.target == CONV:
        transposed = getattr(node.args[6], "value", False)
        if transposed:
            return "quantized transposed convolution is not yet supported by the native XNNPACK backend"
        stride = node.args[3]
        if len(getattr(stride, "items", ())) != 2:
            return "only 2-D quantized convolutions are supported by the native XNNPACK backend"
    return None


def _walk(args: object) -> list[str]:
    out: list[str] = []
    items = args if isinstance(args, (tuple, list)) else (args,)
    for a in items:
        if isinstance(a, Ref):
            out.append(a.name)
        elif hasattr(a, "items") and isinstance(getattr(a, "items"), tuple):
            out.extend(_walk(getattr(a, "items")))
    return out
