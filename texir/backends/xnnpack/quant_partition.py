"""Static int8 (pt2e) patterns for the native XNNPACK partitioner, as ExecuTorch 1.5.1's configs
find them: a GEMM (linear, convolution) with a dequantized static weight, a dequantized activation
and a quantize after it (through an optional relu/hardtanh), and element-wise ops whose inputs are
all dequantized and whose only user (through an optional fused relu) is a quantize. The q/dq nodes
of a matched pattern are *implicit*: the backend folds them into the quantized values and emits no
node for them. The partitioner passes that tag to the backend as a `BackendNodeMeta` note.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from texir.ir import CallFunction, DType, DTypeArg, NoneArg, Program, Ref

__all__ = [
    "DQ_PER_CHANNEL", "DQ_PER_TENSOR", "IMPLICIT_KEY", "Q_PER_CHANNEL", "Q_PER_TENSOR", "QDQ_OPS",
    "QuantPlan", "static_quant",
]

Q_PER_TENSOR: Final = "quantized_decomposed::quantize_per_tensor.default"
DQ_PER_TENSOR: Final = "quantized_decomposed::dequantize_per_tensor.default"
Q_PER_CHANNEL: Final = "quantized_decomposed::quantize_per_channel.default"
DQ_PER_CHANNEL: Final = "quantized_decomposed::dequantize_per_channel.default"
QDQ_OPS: Final = frozenset({Q_PER_TENSOR, DQ_PER_TENSOR, Q_PER_CHANNEL, DQ_PER_CHANNEL})
IMPLICIT_KEY: Final = "IS_IMPLICIT_Q_DQ_TAG"
"""ExecuTorch's node-meta key for an implicit q/dq node (the note's value is "true")."""
_DYNAMIC: Final = frozenset({
    "quantized_decomposed::quantize_per_tensor.tensor", "quantized_decomposed::dequantize_per_tensor.tensor",
    "quantized_decomposed::quantize_per_token.default", "quantized_decomposed::dequantize_per_token.default",
})
_GEMMS: Final = {
    # op: (activation, weight, bias) argument positions
    "aten::linear.default": (0, 1, 2),
    "aten::convolution.default": (0, 1, 2),
}
_GEMM_ACTS: Final = frozenset({"aten::relu.default", "aten::hardtanh.default"})
GENERIC_STATIC: Final[dict[str, frozenset[str]]] = {
    # op: the activations fused into it under quantization (ExecuTorch's `fused_act`)
    "aten::add.Tensor": frozenset({"aten::relu.default"}),
    "aten::mul.Tensor": frozenset(),
    "aten::relu.default": frozenset(),
    "aten::hardtanh.default": frozenset(),
    "aten::max_pool2d.default": frozenset(),
    "aten::mean.dim": frozenset(),
    "aten::view_copy.default": frozenset(),
}
"""Element-wise and shape ops the native backend serializes in their static-int8 form."""
_EXECUTORCH_STATIC: Final = frozenset({
    "aten::sub.Tensor", "aten::cat.default", "aten::clamp.default", "aten::elu.default",
    "aten::permute_copy.default", "aten::slice_copy.Tensor", "aten::unsqueeze_copy.default",
    "dim_order_ops::_to_dim_order_copy.default",
})
"""Ops ExecuTorch's configs also take in static-int8 form that the native backend does not yet."""


@dataclass
class QuantPlan:
    """What the static-int8 analysis found in one program."""

    gemms: set[str] = field(default_factory=set)
    """Quantized GEMMs whose whole pattern is valid (taken with their deps)."""
    deps: dict[str, str] = field(default_factory=dict)
    """Node (call or constant) -> the anchor op whose partition it joins."""
    implicit: set[str] = field(default_factory=set)
    refused: dict[str, str] = field(default_factory=dict)
    """Node -> why the native backend turns down its quantized form."""
    enabled: bool = True
    """False when the partitioner's options leave static int8 out."""


def _ref(node: CallFunction, i: int) -> str | None:
    a = node.args[i] if len(node.args) > i else None
    return a.name if isinstance(a, Ref) else None


def _qdtype(node: CallFunction) -> DType | None:
    last = node.args[-1] if node.args else None
    return last.value if isinstance(last, DTypeArg) else None


class _Graph:
    """Call nodes by name and their users (each once, in graph order)."""

    def __init__(self, program: Program) -> None:
        self.calls = {n.name: n for n in program.graph.nodes if isinstance(n, CallFunction)}
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


def static_quant(program: Program, constants: frozenset[str], accepts: Callable[[CallFunction], bool]) -> QuantPlan:
    """The static-int8 patterns of `program`'s top-level graph (see the module doc). `accepts` is
    the op's own float check: a pattern counts only around an op its config takes (ExecuTorch
    checks a config's constraints before it collects the q/dq around the op)."""
    g = _Graph(program)
    plan = QuantPlan()
    for node in g.calls.values():
        if node.target in _GEMMS:
            _gemm(node, g, constants, plan)
        elif (node.target in GENERIC_STATIC or node.target in _EXECUTORCH_STATIC) and accepts(node):
            inputs = list(dict.fromkeys(_walk(node.args)))
            if not inputs or any(g.target(i) not in (DQ_PER_TENSOR, DQ_PER_CHANNEL) for i in inputs):
                continue
            fused, q = g.tail(node.name, GENERIC_STATIC.get(node.target, frozenset({"aten::relu.default"})))
            if q is None:
                continue
            if node.target not in GENERIC_STATIC:
                plan.refused[node.name] = (
                    f"static-int8 {node.target} is not yet supported by the native XNNPACK backend "
                    "(ExecuTorch's partitioner takes it: --partitioner executorch:xnnpack)"
                )
                continue
            for dep in (*inputs, *fused, q):
                plan.deps.setdefault(dep, node.name)
            plan.implicit.update((*inputs, q))
    return plan


def _gemm(node: CallFunction, g: _Graph, constants: frozenset[str], plan: QuantPlan) -> None:
    act_i, w_i, b_i = _GEMMS[node.target]
    w_name = _ref(node, w_i)
    w_node = g.calls.get(w_name) if w_name is not None else None
    if w_node is None or w_node.target not in (DQ_PER_TENSOR, DQ_PER_CHANNEL):
        return  # a float GEMM (or a weight the float checks turn down)
    act = g.calls.get(_ref(node, act_i) or "")
    if act is not None and act.target in _DYNAMIC:
        plan.refused[node.name] = "dynamically quantized GEMMs are not yet supported by the native XNNPACK backend"
        return
    why = _gemm_refusal(node, w_node, act, constants)
    fused: list[str] = []
    q: str | None = None
    if why is None:
        fused, q = g.tail(node.name, _GEMM_ACTS)
        if q is None:
            why = "a static-int8 GEMM must be followed by a quantize (through at most one relu/hardtanh)"
    if why is not None or act is None or q is None:
        plan.refused[node.name] = why or "incomplete static-int8 pattern"
        return
    deps = [w_node.name, *_walk(w_node.args), act.name, *fused, q]
    bias = _ref(node, b_i)
    if bias is not None:
        deps.append(bias)
    plan.gemms.add(node.name)
    for dep in deps:
        plan.deps.setdefault(dep, node.name)
    plan.implicit.update((w_node.name, act.name, q))


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
        if act is not None and act.target == "aten::constant_pad_nd.default":
            return "a padding folded into a quantized convolution is not yet supported by the native XNNPACK backend"
        return "the activation is not dequantized per tensor"
    if _qdtype(act) != DType.int8:
        return "activations must be int8"
    b = node.args[2] if len(node.args) > 2 else None
    if b is not None and not isinstance(b, NoneArg) and _ref(node, 2) not in constants:
        return "bias is not static"
    if node.target == "aten::convolution.default":
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
