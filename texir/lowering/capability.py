"""Maximal partitions of supported nodes: the partitions torch's ``CapabilityBasedPartitioner``
proposes (ExecuTorch's capability partitioners use it), found in one linear pass.

torch's partitioner walks the graph backwards and greedily merges every new supported node with
any existing partition it can join without closing a cycle, retrying merges after each node. Its
partitions are always totally ordered by dependence (two partitions it could still merge, it
would have merged), so a new node either joins exactly one of them, the most downstream one it
can, or starts a new one in front. That choice depends only on a number per node, its *key*:

- a supported node's key is the least of 0, its supported users' keys, and one less than the
  key reached through each unsupported user;
- an unsupported node reaches the least key of its users (or none).

Supported nodes with equal keys form one partition. A key drops only across an unsupported node,
so a path leaving a partition through one can never return to it: every partition is convex and
the partitions depend on each other without cycles. `tests/test_partition_semantics.py` checks
the result against torch's on random graphs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from texir.ir import CallFunction, Graph, Ref
from texir.ir.analysis import node_inputs
from texir.ir.names import GETITEM

__all__ = ["maximal_partitions"]

_NONE = 1 << 62  # "reaches no partition": above every key (keys are <= 0)


def maximal_partitions(
    graph: Graph, supported: Mapping[str, bool], groups: Sequence[Sequence[str]] = ()
) -> list[list[str]]:
    """The partitions of `graph`'s supported nodes, as lists of node names in graph order,
    ordered by their first node.

    `supported` says which nodes a backend takes (missing means no). A getitem of a supported
    multi-output node goes with that node. Each of `groups` (node names) lands in one partition
    or, when one of its nodes is unsupported or keeping it together would close a cycle, in none.
    """
    names = [node.name for node in graph.nodes]
    index = {name: i for i, name in enumerate(names)}
    ok = [bool(supported.get(name, False)) for name in names]
    wanted: list[list[int]] = []
    for group in groups:
        members = [index[n] for n in dict.fromkeys(group) if n in index]
        if members and all(ok[m] for m in members):
            wanted.append(members)
        else:
            for m in members:
                ok[m] = False
    while True:
        unit = _units(graph, index, ok, wanted)
        order = _unit_order(graph, index, unit)
        if order is not None:
            return _partitions_by_key(graph, index, unit, ok, order)
        # Keeping some group together closes a cycle: give up the last one (its nodes stay out).
        for m in wanted.pop():
            ok[m] = False


def _units(graph: Graph, index: Mapping[str, int], ok: list[bool], groups: list[list[int]]) -> list[int]:
    """Each node's unit (what must land together): its own, its multi-output producer's for a
    getitem, its group's. Updates `ok` for getitems (supported with their producer only)."""
    parent = list(range(len(ok)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, node in enumerate(graph.nodes):
        if isinstance(node, CallFunction) and node.target == GETITEM and node.args:
            first = node.args[0]
            src = index.get(first.name) if isinstance(first, Ref) else None
            ok[i] = src is not None and ok[src]
            if ok[i] and src is not None:
                parent[find(i)] = find(src)
    for members in groups:
        head = find(members[0])
        for m in members[1:]:
            root = find(m)
            if root != head:
                parent[root] = head
    return [find(i) for i in range(len(ok))]


def _unit_order(graph: Graph, index: Mapping[str, int], unit: list[int]) -> list[int] | None:
    """Units in a topological order of the contracted graph (Kahn), or None on a cycle."""
    succs: dict[int, list[int]] = {}
    seen_edges: set[tuple[int, int]] = set()
    indegree: dict[int, int] = {}
    for i, node in enumerate(graph.nodes):
        u = unit[i]
        indegree.setdefault(u, 0)
        for name in node_inputs(node):
            j = index.get(name)
            if j is None or unit[j] == u or (unit[j], u) in seen_edges:
                continue
            seen_edges.add((unit[j], u))
            succs.setdefault(unit[j], []).append(u)
            indegree[u] += 1
    ready = [u for u, d in indegree.items() if d == 0]
    order: list[int] = []
    while ready:
        u = ready.pop()
        order.append(u)
        for s in succs.get(u, ()):
            indegree[s] -= 1
            if indegree[s] == 0:
                ready.append(s)
    return order if len(order) == len(indegree) else None


def _partitions_by_key(
    graph: Graph, index: Mapping[str, int], unit: list[int], ok: list[bool], order: list[int]
) -> list[list[str]]:
    users: dict[int, set[int]] = {}
    for i, node in enumerate(graph.nodes):
        for name in node_inputs(node):
            j = index.get(name)
            if j is not None and unit[j] != unit[i]:
                users.setdefault(unit[j], set()).add(unit[i])
    unit_ok = {unit[i]: ok[i] for i in range(len(unit))}
    key: dict[int, int] = {}
    for u in reversed(order):
        if unit_ok[u]:
            k = 0
            for s in users.get(u, ()):
                k = min(k, key[s] if unit_ok[s] else key[s] - 1)
            key[u] = k
        else:
            key[u] = min((key[s] for s in users.get(u, ())), default=_NONE)
    partitions: dict[int, list[str]] = {}
    for i, node in enumerate(graph.nodes):
        if ok[i]:
            partitions.setdefault(key[unit[i]], []).append(node.name)
    return list(partitions.values())
