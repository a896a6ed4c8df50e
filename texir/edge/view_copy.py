"""View ops become their `*_copy` variants (exir's ReplaceViewOpsWithViewCopyOps in to_edge); in
to_executorch, chains of them are normalized and the reshapes become memory views."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from texir.edge._dead import dead_producers
from texir.edge._rewrite import Entry, Forward, program_ops, rewrite_program
from texir.edge.strides import contiguous_strides, refresh_strides
from texir.ir.names import GETITEM, MEMORY_VIEW
from texir.ir.op_facts import OpTable
from texir.ir.types import CallFunction, Graph, Node, Output, Program, Provenance, Ref, TensorMeta, TupleMeta, ValueMeta

__all__ = ["VIEW_COPY", "normalize_view_copy_bases", "replace_view_copies_with_views", "replace_view_ops"]

VIEW_COPY = "aten::view_copy.default"


def _copy_meta(meta: ValueMeta | None) -> ValueMeta | None:
    # A copy variant writes fresh contiguous tensors, whatever the view's strides were.
    if isinstance(meta, TupleMeta):
        items = tuple(_copy_meta(m) for m in meta.items)
        if all(a is b for a, b in zip(items, meta.items)):
            return meta
        return msgspec.structs.replace(meta, items=items)
    if not isinstance(meta, TensorMeta):
        return meta
    strides = contiguous_strides(meta.shape)
    if strides == meta.strides and meta.storage_offset == 0:
        return meta
    return msgspec.structs.replace(meta, strides=strides, storage_offset=0)


def _is_view_with_copy(target: str, ops: OpTable) -> bool:
    facts = ops.op_facts(target) if "::" in target and not target.startswith("higher_order::") else None
    return facts is not None and facts.is_view and facts.view_copy is not None


def _views_in(graph: Graph, ops: OpTable) -> frozenset[str]:
    return frozenset(n.name for n in graph.nodes if isinstance(n, CallFunction) and _is_view_with_copy(n.target, ops))


def _rule(
    node: Node, meta: ValueMeta | None, prov: Provenance | None, views: frozenset[str], ops: OpTable
) -> Forward | Sequence[Entry] | None:
    if not isinstance(node, CallFunction):
        return None
    if node.target == GETITEM:
        # An item of a multi-output view (split, unbind) is an item of its copy variant now.
        source = node.args[0] if node.args else None
        if isinstance(source, Ref) and source.name in views:
            new_meta = _copy_meta(meta)
            return None if new_meta is meta else ((node, new_meta, prov),)
        return None
    if not _is_view_with_copy(node.target, ops):
        return None  # a view with no copy variant is left for the emitter to refuse, naming the node
    facts = ops.op_facts(node.target)
    assert facts is not None and facts.view_copy is not None  # _is_view_with_copy checked both
    return ((msgspec.structs.replace(node, target=facts.view_copy), _copy_meta(meta), prov),)


def replace_view_ops(program: Program) -> Program:
    """`program` with every view op (view, permute, select, ...) turned into its copy variant, whose
    result is contiguous."""
    ops = program_ops(program)
    views: dict[int, frozenset[str]] = {}
    relaid: set[str] = set()

    def rule(node: Node, meta: ValueMeta | None, prov: Provenance | None, graph: Graph) -> Forward | Sequence[Entry] | None:
        found = views.get(id(graph))
        if found is None:
            found = views[id(graph)] = _views_in(graph, ops)
        result = _rule(node, meta, prov, found, ops)
        if result is not None and not isinstance(result, Forward) and any(m != meta for _, m, _ in result):
            relaid.add(node.name)
        return result

    rewritten = rewrite_program(program, rule)
    if not relaid:
        return rewritten
    # Ops reading a value whose layout changed get the strides ExecuTorch's retrace gives them (an
    # add of two permuted views is permuted; of their copies, not), where texir.edge.strides can tell.
    return refresh_strides(rewritten, relaid)


def normalize_view_copy_bases(program: Program) -> Program:
    """Each `view_copy` of a `view_copy` reads the first value upstream that is not one, and the views
    nobody reads any more are dropped (exir's NormalizeViewCopyBasePass + dead-code elimination in
    to_executorch: a chain of reshapes becomes one reshape, and no value is written for the rest)."""
    return rewrite_program(program, _ViewChains())


class _ViewChains:
    """The rule; per graph (in nested graphs too) it works out once which base each view_copy reads
    now and which views are left unread."""

    def __init__(self) -> None:
        self._plans: dict[int, tuple[Graph, dict[str, Ref], set[str]]] = {}

    def _plan(self, graph: Graph) -> tuple[dict[str, Ref], set[str]]:
        entry = self._plans.get(id(graph))
        if entry is None or entry[0] is not graph:
            roots: dict[str, Ref] = {}  # view_copy -> the value it reads after normalization
            rebased: dict[str, Ref] = {}
            nodes: dict[str, Node] = {}
            seeds: list[str] = []
            for node in graph.nodes:
                if isinstance(node, CallFunction) and node.target == VIEW_COPY and node.args:
                    base = node.args[0]
                    if isinstance(base, Ref):
                        if base.name in roots:
                            seeds.append(base.name)
                            base = rebased[node.name] = roots[base.name]
                            node = msgspec.structs.replace(node, args=(base, *node.args[1:]))
                        roots[node.name] = base
                nodes[node.name] = node
            dead = dead_producers(nodes, seeds) & roots.keys() if seeds else set()
            entry = self._plans[id(graph)] = (graph, rebased, dead)
        return entry[1], entry[2]

    def __call__(
        self, node: Node, meta: ValueMeta | None, prov: Provenance | None, graph: Graph
    ) -> Forward | Sequence[Entry] | None:
        if not isinstance(node, CallFunction) or node.target != VIEW_COPY:
            return None
        rebased, dead = self._plan(graph)
        if node.name in dead:
            return ()
        base = rebased.get(node.name)
        return None if base is None else ((msgspec.structs.replace(node, args=(base, *node.args[1:])), meta, prov),)


def replace_view_copies_with_views(program: Program) -> Program:
    """Each `view_copy` of a value that its graph's output does not read directly becomes a
    `texir::memory_view` (exir's ReplaceViewCopyWithViewPass, after `normalize_view_copy_bases`; in
    nested graphs too). Whether the view can share its base's memory depends on the memory plan,
    so the emitter decides that and copies where it cannot (`texir.emit`)."""
    return rewrite_program(program, _Views())


class _Views:
    """The rule; per graph it reads once which values the output node returns."""

    def __init__(self) -> None:
        self._returned: dict[int, tuple[Graph, frozenset[str]]] = {}

    def _outputs(self, graph: Graph) -> frozenset[str]:
        entry = self._returned.get(id(graph))
        if entry is None or entry[0] is not graph:
            last = graph.nodes[-1] if graph.nodes else None
            names = frozenset(a.name for a in last.args if isinstance(a, Ref)) if isinstance(last, Output) else frozenset()
            entry = self._returned[id(graph)] = (graph, names)
        return entry[1]

    def __call__(
        self, node: Node, meta: ValueMeta | None, prov: Provenance | None, graph: Graph
    ) -> Forward | Sequence[Entry] | None:
        if not isinstance(node, CallFunction) or node.target != VIEW_COPY:
            return None
        if not node.args or not isinstance(node.args[0], Ref) or node.name in self._outputs(graph):
            return None
        return ((msgspec.structs.replace(node, target=MEMORY_VIEW), meta, prov),)
