"""Drop empty tensors from concatenations (exir's PruneEmptyTensorsPass).

A `cat` input with no elements adds nothing to the result; torch's decompositions make such inputs
(`block_diag` pads each block with zero-width `full`s). ExecuTorch's to_edge removes them from the
`cat` and the nodes that made them when nothing else reads them; so does this pass. (A `cat` whose
inputs are all empty is left as it is: ExecuTorch turns it into a `full`, and texir does not yet.)"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence

import msgspec

from texir.edge._rewrite import Entry, Forward, MetaLookup, rewrite_program
from texir.ir.types import Argument, CallFunction, Graph, ListArg, Node, Output, Program, Provenance, Ref, TensorMeta, TupleArg, ValueMeta

__all__ = ["CAT_TARGETS", "prune_empty_cat_inputs"]

CAT_TARGETS = frozenset({"aten::cat.default"})


def _refs(arg: Argument) -> Iterator[str]:
    if isinstance(arg, Ref):
        yield arg.name
    elif isinstance(arg, (ListArg, TupleArg)):
        for item in arg.items:
            yield from _refs(item)


def _empty(meta: ValueMeta | None) -> bool:
    return isinstance(meta, TensorMeta) and any(isinstance(d, int) and d == 0 for d in meta.shape)


class _Prune:
    """Rewrites each cat without its empty inputs; `dropped` collects those inputs' names."""

    def __init__(self) -> None:
        self.meta_of = MetaLookup()
        self.dropped: set[tuple[int, str]] = set()

    def __call__(self, node: Node, meta: ValueMeta | None, prov: Provenance | None, graph: Graph) -> Forward | Sequence[Entry] | None:
        if not isinstance(node, CallFunction) or node.target not in CAT_TARGETS or not node.args:
            return None
        tensors = node.args[0]
        if not isinstance(tensors, ListArg) or not all(isinstance(t, Ref) for t in tensors.items):
            return None
        kept = [t for t in tensors.items if not (isinstance(t, Ref) and _empty(self.meta_of(graph, t.name)))]
        if len(kept) == len(tensors.items) or not kept:
            return None
        self.dropped.update((id(graph), t.name) for t in tensors.items if isinstance(t, Ref) and t not in kept)
        new = msgspec.structs.replace(node, args=(ListArg(items=tuple(kept)), *node.args[1:]))
        return ((new, meta, prov),)


def _uses(graph: Graph) -> Counter[str]:
    used: Counter[str] = Counter()
    for node in graph.nodes:
        if isinstance(node, (CallFunction, Output)):
            for arg in node.args:
                used.update(_refs(arg))
        if isinstance(node, CallFunction):
            for _, arg in node.kwargs:
                used.update(_refs(arg))
    return used


def prune_empty_cat_inputs(program: Program) -> Program:
    """`program` with empty tensors dropped from its `cat`s, and the nodes that made them when
    nothing else reads them (in nested graphs too)."""
    prune = _Prune()
    pruned = rewrite_program(program, prune)
    if pruned is program:
        return program
    names = {name for _, name in prune.dropped}
    uses: dict[int, Counter[str]] = {}

    def dead(node: Node, meta: ValueMeta | None, prov: Provenance | None, graph: Graph) -> Forward | Sequence[Entry] | None:
        if not isinstance(node, CallFunction) or node.name not in names:
            return None
        if id(graph) not in uses:
            uses[id(graph)] = _uses(graph)
        return () if uses[id(graph)][node.name] == 0 else None

    return rewrite_program(pruned, dead)
