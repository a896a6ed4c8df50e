"""View ops become their `*_copy` variants (exir's ReplaceViewOpsWithViewCopyOps in to_edge)."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from texir.edge._rewrite import Entry, Forward, program_ops, rewrite_program
from texir.edge.strides import contiguous_strides, refresh_strides
from texir.ir.names import GETITEM
from texir.ir.op_facts import OpTable
from texir.ir.types import CallFunction, Graph, Node, Program, Provenance, Ref, TensorMeta, TupleMeta, ValueMeta

__all__ = ["replace_view_ops"]


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
