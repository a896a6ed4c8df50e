"""The node order ExecuTorch's `to_backend` leaves behind, computed without torch.

ExecuTorch fuses one partition at a time into the live torch.fx graph and, after each, re-sorts
the whole graph with torch.fx's `legalize_graph`: a first-in-first-out topological sort that
visits a node's users in the order they were attached to it (python operators on symbols jump
the queue). That order is the history of graph edits, so nodes that do not depend on each other
end up in another order than the program had, and the partitions fused later list their nodes in
that order too. XNNPACK numbers values in node order and the emitter numbers instructions in node
order, so blobs and debug maps follow.

`executorch_node_order` replays those edits on names only: the fusion (a call after the last
partition result that escapes, one getitem per escaping result, users re-attached as torch.fx
re-attaches them), erasure, the re-sort, and the delegate call that replaces the fused call. It
returns the order of each partition's members when ExecuTorch fuses it, and the final order of
the graph, so `to_backend(..., order="executorch")` can build the same sub-programs and the same
parent graph. Cost: one re-sort of the graph per partition, as in ExecuTorch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

import msgspec

from texir.ir import Graph, Placeholder
from texir.ir.analysis import node_inputs

__all__ = ["FusedPart", "FusionOrder", "Item", "executorch_node_order"]

_JUMP_THE_QUEUE = frozenset({
    *(f"_operator::{op}" for op in ("add", "mul", "sub", "floordiv", "truediv", "mod", "le", "lt", "ge", "gt", "eq", "ne")),
    "aten::sym_constrain_range.default", "aten::sym_constrain_range_for_size.default", "aten::_assert_async.msg",
    "aten::scalar_tensor.default", "aten::_assert_scalar.default",
})
"""Targets legalize_graph puts at the front of its queue (torch's `PRIORITIZED_OPS`: symbolic
arithmetic and comparisons, and the ATen ops below; ExecuTorch's to_edge leaves those as ATen ops
(`texir.edge.names.NON_EDGE_OPS`), so they keep their priority in its edge graphs)."""

Item = tuple[str, str, str]
"""A node of the final order: ("node", name, "") for a node of the program, ("attr", tag, "") and
("call", tag, "") for a partition's lowered-module attribute and delegate call, ("getitem", tag,
value) for the result of the call that replaces `value`."""


class FusedPart(msgspec.Struct, frozen=True):
    """One partition to fuse: its tag, its members (any order), and which of its escaping values
    disappear with it (consumed buffer mutations: their getitem is erased)."""

    tag: str
    members: frozenset[str]
    consumed_results: frozenset[str] = frozenset()
    consumes_state: bool = False
    """The partition takes parameters, buffers or constants along (the parent program is adjusted)."""


class FusionOrder(msgspec.Struct, frozen=True):
    member_order: dict[str, tuple[str, ...]]
    """Per tag, the partition's members in the order ExecuTorch lists them when fusing it."""
    final: tuple[Item, ...]
    """The graph's order after the last partition."""


class _Fx:
    """Names with torch.fx's bookkeeping: ordered users, deduplicated inputs, a node list."""

    def __init__(self, order: list[str], inputs: dict[str, list[str]], prioritized: set[str]) -> None:
        self.order = order
        # torch.fx keeps a node's inputs (and so its users) once each: cat([x, x]) counts x once
        self.inputs = {n: _dedup(i) for n, i in inputs.items()}
        self.prioritized = prioritized
        self.users: dict[str, dict[str, None]] = {n: {} for n in order}
        for n in order:
            for i in self.inputs[n]:
                self.users[i][n] = None

    def add(self, name: str, inputs: list[str], at: int) -> None:
        self.order.insert(at, name)
        self.inputs[name] = _dedup(inputs)
        self.users[name] = {}
        for i in self.inputs[name]:
            self.users[i][name] = None

    def set_inputs(self, node: str, new: list[str]) -> None:
        # torch.fx detaches a node from all its inputs and attaches it again, so it moves to the
        # end of every input's user list, not only the replaced one's.
        for i in self.inputs[node]:
            self.users[i].pop(node, None)
        self.inputs[node] = _dedup(new)
        for i in self.inputs[node]:
            self.users[i][node] = None

    def replace_all_uses(self, old: str, new: str) -> None:
        for u in list(self.users[old]):
            self.set_inputs(u, [new if i == old else i for i in self.inputs[u]])

    def erase(self, node: str) -> None:
        self.set_inputs(node, [])
        self.order.remove(node)
        del self.users[node], self.inputs[node]

    def legalize(self) -> None:
        indeg = {n: len(self.inputs[n]) for n in self.order}
        queue = deque(n for n in self.order if indeg[n] == 0)
        new: list[str] = []
        while queue:
            cur = queue.popleft()
            new.append(cur)
            for u in self.users[cur]:
                indeg[u] -= 1
                if indeg[u] == 0:
                    if u in self.prioritized:
                        queue.appendleft(u)
                    else:
                        queue.append(u)
        if len(new) != len(self.order):  # pragma: no cover - validated plans are acyclic
            raise AssertionError("internal error: a cycle while ordering like ExecuTorch; please report")
        self.order = new
        self.users = {n: {} for n in new}
        for n in new:
            for i in self.inputs[n]:
                self.users[i][n] = None


def _dedup(names: list[str]) -> list[str]:
    return list(dict.fromkeys(names))


def executorch_node_order(graph: Graph, parts: Sequence[FusedPart]) -> FusionOrder:
    """Replay ExecuTorch's fusion of `parts` (in order) on `graph`; see the module docstring."""
    fx = _Fx(
        [n.name for n in graph.nodes],
        {n.name: list(node_inputs(n)) for n in graph.nodes},
        {n.name for n in graph.nodes if getattr(n, "target", None) in _JUMP_THE_QUEUE},
    )
    placeholders = {n.name for n in graph.nodes if isinstance(n, Placeholder)}
    item_of: dict[str, Item] = {n.name: ("node", n.name, "") for n in graph.nodes}
    member_order: dict[str, tuple[str, ...]] = {}
    for k, part in enumerate(parts):
        members = [n for n in fx.order if n in part.members]
        member_order[part.tag] = tuple(members)
        body = [n for n in members if n not in placeholders or all(u in part.members for u in fx.users[n])]
        inside = set(body)
        inputs = _dedup([i for n in body for i in fx.inputs[n] if i not in inside and i not in part.members])
        results = [n for n in body if any(u not in inside for u in fx.users[n])]
        call, attr = f"\0call{k}", f"\0attr{k}"
        item_of[call], item_of[attr] = ("call", part.tag, ""), ("attr", part.tag, "")
        last = max(fx.order.index(r) for r in results) if results else fx.order.index(body[-1])
        fx.add(call, inputs, last + 1)
        getitem_of: dict[str, str] = {}
        if len(results) == 1:
            # a single result: uses go to the call, then to one getitem that replaces the call
            (r,) = results
            fx.replace_all_uses(r, call)
            g = getitem_of[r] = f"\0get{k}:{r}"
            fx.add(g, [call], fx.order.index(call) + 1)
            fx.replace_all_uses(call, g)
            fx.set_inputs(g, [call])
        else:
            for j, r in enumerate(results):
                g = getitem_of[r] = f"\0get{k}:{r}"
                fx.add(g, [call], fx.order.index(call) + 1 + j)
                fx.replace_all_uses(r, g)
        for r, g in getitem_of.items():
            item_of[g] = ("getitem", part.tag, r)
        for n in reversed(body):
            fx.erase(n)
        fx.legalize()
        # the delegate call (and its lowered module) replaces the fused call
        at = fx.order.index(call)
        fx.add(attr, [], at)
        delegate = f"\0delegate{k}"
        item_of[delegate] = item_of[call]
        fx.add(delegate, [attr, *inputs], at + 1)
        fx.replace_all_uses(call, delegate)
        fx.erase(call)
        if part.consumes_state or part.consumed_results:
            _adjust_parent(fx, graph, delegate, [getitem_of[r] for r in results], part.consumed_results, getitem_of)
    return FusionOrder(member_order=member_order, final=tuple(item_of[n] for n in fx.order))


def _adjust_parent(
    fx: _Fx,
    graph: Graph,
    delegate: str,
    getitems: list[str],
    consumed: frozenset[str],
    getitem_of: Mapping[str, str],
) -> None:
    """ExecuTorch's adjustment of the parent after a partition took state along: the output node
    gets new arguments, consumed mutations' getitems go, later getitems get new indices."""
    out = graph.nodes[-1].name
    dropped = {getitem_of[r] for r in consumed}
    fx.set_inputs(out, [i for i in fx.inputs[out] if i not in dropped])
    deleted = []
    for g in list(fx.users[delegate]):
        if g in dropped:
            deleted.append(getitems.index(g))
            fx.erase(g)
    for g in list(fx.users[delegate]):
        if any(getitems.index(g) > d for d in deleted):
            fx.set_inputs(g, [delegate])
