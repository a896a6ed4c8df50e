"""What torch's functionalization retrace does to an exported program, replayed without the retrace
(for `texir.adapters.local_decompose`): the order, names and metadata it gives weights; a no-grad
region (`wrap_with_set_grad_enabled`) inlined; a buffer written in place (a static KV cache's
`index_copy_`, `copy_`, `add_`) turned into a functional op whose result is the buffer's new value
and a `BUFFER_MUTATION` output, the views of that value made where they are read."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

import torch
from torch._ops import HigherOrderOperator, OpOverload
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, InputSpec, OutputKind, OutputSpec, TensorArgument

from texir.adapters.decompositions import functional_overload
from texir.adapters.fx_signature import signature_inputs
from texir.adapters.op_args import leaves

__all__ = ["BufferWrites", "LazyView", "NeedsRetrace", "in_place_twin", "inline_region", "invisible_twin", "retrace_inputs", "weight_meta"]

_INPUT_ORDER = {InputKind.PARAMETER: 0, InputKind.CONSTANT_TENSOR: 1, InputKind.BUFFER: 2, InputKind.USER_INPUT: 3}
"""The inputs this handles, in the order the retrace lifts them."""

_PREFIX = {InputKind.PARAMETER: "p_", InputKind.BUFFER: "b_"}
"""How the retrace's placeholder naming pass prefixes a weight's name (torch's `placeholder_prefixes`)."""


class NeedsRetrace(Exception):
    """This program (or node) needs torch's retrace; the message says why."""


def _module_order(targets: Iterable[str]) -> dict[str, int]:
    """Where `named_parameters()` / `named_buffers()` of the module the retrace unlifts list each
    target: the unlifted graph reads each weight with a `get_attr` where its placeholder was, and
    FX copies them in that order, each making the submodules on its path; a module lists its own
    attributes before its submodules' (in the order they were made)."""
    tree: dict[str, Any] = {}
    for target in targets:
        *path, leaf = target.split(".")
        node = tree
        for part in path:
            node = node.setdefault(part, {})
        node.setdefault(leaf, target)
    order: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        order.extend(v for v in node.values() if isinstance(v, str))
        for v in node.values():
            if isinstance(v, dict):
                walk(v)

    walk(tree)
    return {t: i for i, t in enumerate(order)}


def _retrace_name(spec: InputSpec) -> str:
    """The name the retrace's placeholder naming pass gives a parameter or buffer (from its target);
    other inputs keep theirs."""
    prefix = _PREFIX.get(spec.kind)
    if prefix is None or spec.target is None:
        return str(spec.arg.name)
    name = spec.target
    for strip in ("L__self___", "self_"):
        if name.startswith(strip):
            name = name[len(strip):]
            break
    return prefix + re.sub(r"[^a-zA-Z0-9]", "_", name).lower()


def retrace_inputs(ep: ExportedProgram) -> list[tuple[InputSpec, torch.fx.Node, str]]:
    """The inputs of `ep` in the order torch's retrace lifts them (parameters, constants, buffers,
    user inputs; weights in the order its unlifted module lists them, `_module_order`), each with
    its placeholder and the name the retrace gives it.
    Inputs of other kinds, or names the naming pass would number, need the retrace."""
    pairs = signature_inputs(ep)
    if any(spec.kind not in _INPUT_ORDER for spec, _ in pairs):
        raise NeedsRetrace("inputs other than tensors (tokens, custom objects)")
    where = _module_order(str(s.target) for s, _ in pairs if s.kind is not InputKind.USER_INPUT)
    ranked = sorted(
        pairs, key=lambda pair: (_INPUT_ORDER[pair[0].kind], where.get(str(pair[0].target), 0) if pair[0].kind in _PREFIX else 0)
    )
    named = [(spec, node, _retrace_name(spec)) for spec, node in ranked]
    names = [name for _, _, name in named]
    if len(set(names)) != len(names):
        raise NeedsRetrace("two weights whose names the retrace would number")
    return named


def in_place_twin(op: OpOverload) -> OpOverload | None:
    """The functional twin of an in-place op that writes only its first argument (`index_copy_`,
    `copy_`, `add_`), whose result is that argument: what functionalization puts in its place."""
    args = op._schema.arguments
    written = [a for a in args if a.alias_info is not None and a.alias_info.is_write]
    if not args or written != [args[0]]:
        return None
    return functional_overload(op)


def invisible_twin(node: torch.fx.Node) -> OpOverload | None:
    """The functional twin of an in-place node whose mutation nothing can see (it writes an
    intermediate value that only it reads, not a view of another): what functionalization gives.
    None otherwise."""
    target = node.target
    written = node.args[0] if node.args else None
    if not isinstance(target, OpOverload) or not isinstance(written, torch.fx.Node):
        return None
    if written.op != "call_function" or len(written.users) != 1:
        return None
    schema = getattr(written.target, "_schema", None)
    if schema is None:
        return None
    if schema.is_mutable:  # a chain of in-place ops (relu_ on add_): each must be invisible
        if invisible_twin(written) is None:
            return None
    elif any(r.alias_info is not None for r in schema.returns):
        return None
    return functional_overload(target)


_READER_META = tuple(k for k in torch.fx.proxy._COPY_META_FIELDS if k not in ("custom", "nn_module_stack"))
"""What the retrace copies onto a weight from the nodes reading it (torch's `_collect_param_buffer_metadata`)."""


def weight_meta(node: torch.fx.Node) -> dict[str, Any]:
    """The metadata the retrace gives weight `node`'s placeholder: its own, updated with what its
    readers say of themselves (the last one first), but for its module stack and stack trace."""
    meta = dict(node.meta)
    for user in node.users:
        if user.op == "call_function" and not isinstance(user.target, HigherOrderOperator):
            meta.update((k, user.meta[k]) for k in _READER_META if k in user.meta)
    meta.pop("nn_module_stack", None)
    meta.pop("stack_trace", None)
    return meta


def inline_region(
    node: torch.fx.Node, env: dict[torch.fx.Node, Any], run: Callable[[torch.fx.Node, dict[torch.fx.Node, Any]], Any]
) -> Any:
    """A `wrap_with_set_grad_enabled(False, graph, *args)` region's nodes, in its place (the
    recorder runs without grad anyway), as the retrace leaves them, each given by `run(node, env)`;
    its results as a tuple."""
    enabled, sub, *args = node.args
    graph = env.get(sub) if isinstance(sub, torch.fx.Node) else None
    if enabled is not False or not isinstance(graph, torch.fx.GraphModule):
        raise NeedsRetrace(f"{node.name!r}: a grad-enabled region, or one that is not a graph")
    inner: dict[torch.fx.Node, Any] = {}
    placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(args) or not all(isinstance(a, torch.fx.Node) for a in args):
        raise NeedsRetrace(f"{node.name!r}: a region called with other than its inputs")
    inner.update((p, env[cast(torch.fx.Node, a)]) for p, a in zip(placeholders, args))
    for sub_node in graph.graph.nodes:
        if sub_node.op == "call_function":
            inner[sub_node] = run(sub_node, inner)
        elif sub_node.op == "output":
            results = sub_node.args[0]
            if not isinstance(results, (tuple, list)) or not all(isinstance(r, torch.fx.Node) for r in results):
                raise NeedsRetrace(f"{node.name!r}: a region returning other than a tuple of values")
            return tuple(inner[r] for r in results)
        elif sub_node.op != "placeholder":
            raise NeedsRetrace(f"{node.name!r}: a region holding {sub_node.op} nodes")
    raise NeedsRetrace(f"{node.name!r}: a region without an output")  # pragma: no cover - FX graphs end so


class LazyView:
    """A view of a buffer's new value, not a node yet: functionalization makes it where something
    reads it, as that reader's node."""

    def __init__(self, value: torch.Tensor, func: OpOverload, args: Any, kwargs: Any) -> None:
        self.value = value
        self.func = func
        self.args = args
        self.kwargs = kwargs


class BufferWrites:
    """The value each buffer holds as the program runs: its placeholder until an in-place op writes
    it, then that op's functional twin's node. A node holding a value some write has replaced is
    stale: reading it would need functionalization's view replay, which is the retrace's."""

    def __init__(self, buffers: Sequence[tuple[torch.fx.Node, str]]) -> None:
        self.targets = [target for _, target in buffers]
        self.current: dict[str, torch.fx.Node] = {target: node for node, target in buffers}
        self.holder: dict[torch.fx.Node, str] = {node: target for node, target in buffers}
        self.stale: set[Any] = set()  # nodes and lazy views
        self.views: dict[Any, str] = {}  # a view of a buffer's value (node or lazy view) -> the buffer

    def viewed(
        self, func: OpOverload, args: Any, nodes: dict[int, torch.fx.Node], lazy: dict[int, LazyView]
    ) -> tuple[str, bool] | None:
        """The buffer whose value the view op `func` views in `args` (values, with the nodes and lazy
        views standing for them, by id), and whether that is a value some in-place op wrote; None
        when `func` is no view or views no buffer."""
        if not any(r.alias_info is not None for r in func._schema.returns):
            return None
        for leaf in leaves(tuple(args), {}):
            if not isinstance(leaf, torch.Tensor):
                continue
            pending = lazy.get(id(leaf))
            if pending is not None:
                return self.views[pending], True
            node = nodes.get(id(leaf))
            if node in self.holder:
                return self.holder[node], node.op != "placeholder"
            if node in self.views:
                return self.views[node], False
        return None

    def note_view(self, target: str, view: Any) -> None:
        self.views[view] = target

    def views_of_written(self) -> bool:
        """Whether the program viewed some buffer's new value (a view made where it is read)."""
        return any(isinstance(v, LazyView) for v in self.views)

    def buffer_of(self, node: Any) -> str | None:
        """The buffer whose value `node` holds now, if any."""
        return self.holder.get(node) if isinstance(node, torch.fx.Node) else None

    def check_read(self, node: Any) -> None:
        if node in self.stale:
            raise NeedsRetrace(f"reads {getattr(node, 'name', 'a view')!r}, a buffer's value (or a view of it) from before an in-place write")

    def write(self, target: str, old: torch.fx.Node, new: torch.fx.Node) -> None:
        """`new` is buffer `target`'s value from here on."""
        old_val, new_val = old.meta.get("val"), new.meta.get("val")
        if not isinstance(old_val, torch.Tensor) or not isinstance(new_val, torch.Tensor) or (
            old_val.dtype != new_val.dtype or old_val.shape != new_val.shape
        ):
            raise NeedsRetrace(f"an in-place write of buffer {target!r} whose functional form changes its dtype or shape")
        del self.holder[old]
        self.stale.add(old)
        # every view of the old value is out of date (functionalization would regenerate it)
        self.stale.update(v for v, t in self.views.items() if t == target)
        self.holder[new] = target
        self.current[target] = new

    def mutations(self) -> list[tuple[OutputSpec, torch.fx.Node]]:
        """A `BUFFER_MUTATION` output for each buffer written, in input order, as the retrace
        returns them (before the user outputs)."""
        found = []
        for target in self.targets:
            node = self.current[target]
            if node.op != "placeholder":
                spec = OutputSpec(kind=OutputKind.BUFFER_MUTATION, arg=TensorArgument(name=node.name), target=target)
                found.append((spec, node))
        return found
