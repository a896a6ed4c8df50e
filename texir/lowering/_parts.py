"""The working state of `texir.lowering.delegate` while it lowers a plan: one `Part` per partition,
one `GraphWork` per graph, and placing them in the order ExecuTorch's to_backend leaves
(`order_like_executorch`, `entries_in_final_order`; the replay itself is `texir.lowering.fx_order`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import msgspec

from texir.ir import (
    BackendNodeMeta,
    BufferInput,
    ConstantTensorInput,
    Graph,
    Node,
    Output,
    ParameterInput,
    Program,
    Provenance,
    Ref,
    ValueMeta,
)
from texir.ir.names import rename_node
from texir.lowering.errors import PartitionerError
from texir.lowering.fx_order import FusedPart, Item, executorch_node_order
from texir.lowering.plan import CheckedGraph, DelegationSpec

__all__ = [
    "Consumable", "Entry", "GraphWork", "Numbering", "Part", "debug_handle_of", "entries_in_final_order",
    "lowering_order", "order_like_executorch",
]

Consumable = ParameterInput | BufferInput | ConstantTensorInput
Entry = tuple[Node, ValueMeta | None, Provenance | None]
"""A node with its value metadata and provenance (see `Graph.entries`)."""


NodeOrder = Literal["program", "executorch"]
"""Where the lowered parent's nodes and each sub-program's nodes go. "program": the program's own
order, each delegate call at its partition's place. "executorch": the order ExecuTorch's
to_backend leaves (it re-sorts the graph after fusing each partition; see `texir.lowering.fx_order`),
so XNNPACK blobs and debug maps come out byte-equal to ExecuTorch's; one graph sort per partition."""


def check_node_order(order: object) -> None:
    """A typed error unless `order` is a `NodeOrder`."""
    if order not in ("program", "executorch"):
        raise PartitionerError(f"order={order!r} is not a node order; use 'program' or 'executorch'")


def check_numbering(numbering: object) -> None:
    """A typed error unless `numbering` is a `Numbering`."""
    if numbering not in ("per_tag", "fused"):
        raise PartitionerError(f"numbering={numbering!r} is not a numbering; use 'per_tag' or 'fused'")


Numbering = Literal["per_tag", "fused"]
"""In which order partitions get their lowered module, delegate call name and debug handle (the
getitems are always named in the plan's tag order, as ExecuTorch fuses in it). "per_tag": the
plan's tag order, as ExecuTorch's ``to_backend(exported_program, partitioner)`` fuses and lowers one
tag at a time. "fused": the order of ExecuTorch's multi-method ``to_backend`` (behind
``EdgeProgramManager.to_backend`` and ``to_edge_transform_and_lower``), which fuses every tag first
and then lowers backend by backend (first appearance in the tag order), each backend's partitions
in the order of their calls in the top graph, then those of nested graphs."""


class Part(msgspec.Struct):
    """One partition of one graph while it is being lowered."""

    tag: str
    spec: DelegationSpec
    members: list[Node] = msgspec.field(default_factory=list)
    names: set[str] = msgspec.field(default_factory=set)
    user_inputs: list[str] = msgspec.field(default_factory=list)
    user_outputs: list[str] = msgspec.field(default_factory=list)
    consumed_mutations: list[tuple[str, int]] = msgspec.field(default_factory=list)
    """(value name, parent output position) of buffer mutations that move into the delegate."""
    sub_program: Program | None = None
    module_name: str = ""
    call_name: str = ""
    getitem_names: list[str] = msgspec.field(default_factory=list)
    debug_handle: int = 0
    last_index: int = 0


def debug_handle_of(prov: Provenance | None) -> int:
    return prov.debug_handle if prov is not None and prov.debug_handle is not None else 0


class GraphWork(msgspec.Struct):
    """The partitions of one graph while they are lowered (the graph's facts come checked)."""

    checked: CheckedGraph
    graph: Graph
    parts: list[Part]
    entry_of: dict[str, Entry]
    """Each node's entry (node, meta, prov), by name."""
    backend_meta: dict[str, list[BackendNodeMeta]]
    """The plan's notes for the backend on this graph's nodes, by node name."""
    final: tuple[Item, ...] | None = None
    """With order="executorch": the lowered graph's order (`executorch_node_order`)."""

    @property
    def path(self) -> tuple[str, ...]:
        return self.checked.path


def order_like_executorch(work: GraphWork, consumable: Mapping[str, Consumable]) -> None:
    """Reorder each partition's members and fix the lowered graph's order as ExecuTorch would."""
    out = work.graph.nodes[-1]
    if not isinstance(out, Output):  # pragma: no cover - verify() rules this out at the pass boundary
        raise PartitionerError(f"internal error: graph {'/'.join(work.path) or '<top>'} does not end in its output")
    fused = []
    for part in work.parts:
        state = [consumable[n.name] for n in part.members if n.name in consumable]
        positions = [
            p for s in state if isinstance(s, BufferInput) for p in work.checked.mutation_positions.get(s.target, ())
        ]
        consumed = frozenset(
            a.name for p in positions if isinstance(a := out.args[p], Ref) and a.name in part.names
        )
        fused.append(FusedPart(tag=part.tag, members=frozenset(part.names), consumed_results=consumed,
                               consumes_state=bool(state)))
    result = executorch_node_order(work.graph, fused)
    by_name = {n.name: n for n in work.graph.nodes}
    for part in work.parts:
        part.members = [by_name[n] for n in result.member_order[part.tag]]
    work.final = result.final


def entries_in_final_order(
    work: GraphWork,
    calls: Mapping[str, list[Entry]],
    renames: Mapping[str, str],
    dropped: set[str],
    out_name: str,
) -> list[Entry]:
    """The lowered graph's entries (all but the output) in `work.final`'s order. `calls` holds,
    per tag, the partition's get_attr, delegate call and one getitem per user output."""
    if work.final is None:  # pragma: no cover - only called after order_like_executorch
        raise PartitionerError("internal error: no ExecuTorch order was computed; please report")
    parts = {p.tag: p for p in work.parts}
    entries: list[Entry] = []
    for kind, key, value in work.final:
        if kind == "node":
            if key != out_name and key not in dropped:
                node, meta, prov = work.entry_of[key]
                entries.append((rename_node(node, renames, rename_self=False), meta, prov))
            continue
        emitted = calls[key]
        if kind == "attr":
            # ExecuTorch's final graph holds each lowered module's get_attr right before its call
            # (it places no instruction, so only the graph shows where it is)
            continue
        if kind == "call":
            entries.extend(emitted[:2])
        elif value in parts[key].user_outputs:
            entries.append(emitted[2 + parts[key].user_outputs.index(value)])
        else:  # pragma: no cover - only consumed mutations lose their getitem, in both orders
            raise PartitionerError(f"internal error: no result '{value}' of partition '{key}'; please report")
    return entries


def lowering_order(works: list[GraphWork], numbering: Numbering) -> list[tuple[int, int]]:
    """(work index, part index) of every partition in the order ExecuTorch lowers them."""
    if numbering == "per_tag":
        return [(w, i) for w, work in enumerate(works) for i in range(len(work.parts))]
    by_backend: dict[str, list[tuple[int, int]]] = {}
    for w, work in enumerate(works):
        if work.final is not None:
            call_at = {key: k for k, (kind, key, _) in enumerate(work.final) if kind == "call"}
            position = [call_at[p.tag] for p in work.parts]
        else:  # each call at its partition's place
            position = [p.last_index for p in work.parts]
        # Backends are grouped in the order their first tag appears (tag order, top graph first).
        for i in range(len(work.parts)):
            by_backend.setdefault(work.parts[i].spec.backend_id, [])
        for i in sorted(range(len(work.parts)), key=lambda k: position[k]):
            by_backend[work.parts[i].spec.backend_id].append((w, i))
    return [item for items in by_backend.values() for item in items]
