"""View ops become their `*_copy` variants (exir's ReplaceViewOpsWithViewCopyOps in to_edge)."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from texir.adapters.op_schemas import op_facts
from texir.edge._rewrite import Entry, Forward, rewrite_program
from texir.ir.types import CallFunction, Graph, Node, Program, Provenance, ValueMeta

__all__ = ["replace_view_ops"]


def _rule(node: Node, meta: ValueMeta | None, prov: Provenance | None, graph: Graph) -> Forward | Sequence[Entry] | None:
    if not isinstance(node, CallFunction) or "::" not in node.target or node.target.startswith("higher_order::"):
        return None
    facts = op_facts(node.target)
    if facts is None or not facts.is_view or facts.view_copy is None:
        return None  # a view with no copy variant is left for the emitter to refuse, naming the node
    return ((msgspec.structs.replace(node, target=facts.view_copy), meta, prov),)


def replace_view_ops(program: Program) -> Program:
    """`program` with every view op (view, permute, select, ...) turned into its copy variant."""
    return rewrite_program(program, _rule)
