"""The order in which torch's CapabilityBasedPartitioner lists its partitions (hence ExecuTorch's
`tag<id>` numbering and the order partitions are lowered in), replayed on an IR graph.

texir's `maximal_partitions` gives the same partitions ordered by first node; torch lists them by
the id each one keeps through its merges. Ids are handed out walking the graph backwards, and a
merge keeps the id of the larger side (the first candidate on a tie), so the order follows from
replaying those merges with torch's cycle test.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from texir.ir import Graph
from texir.ir.analysis import node_inputs

__all__ = ["torch_partition_order"]


def torch_partition_order(graph: Graph, supported: Mapping[str, bool]) -> list[int]:
    """Surviving partition id of every supported node (by position in `graph.nodes`)."""
    nodes = graph.nodes
    index = {n.name: i for i, n in enumerate(nodes)}
    users: list[list[int]] = [[] for _ in nodes]
    for i, n in enumerate(nodes):
        for name in dict.fromkeys(node_inputs(n)):
            if name in index:
                users[index[name]].append(i)
    down: list[frozenset[int]] = [frozenset()] * len(nodes)
    for i in range(len(nodes) - 1, -1, -1):
        acc: set[int] = set()
        for u in users[i]:
            acc.add(u)
            acc |= down[u]
        down[i] = frozenset(acc)

    assignment: dict[int, int] = {}
    members: dict[int, set[int]] = {}
    order: dict[int, int] = {}
    pusers: dict[int, set[int]] = {}
    pmap: dict[int, set[int]] = {}

    def downstream(user_nodes: set[int] | list[int], sources: Sequence[int]) -> set[int]:
        found: set[int] = set()
        for u in user_nodes:
            for p in (u, *down[u]):
                target = assignment.get(p)
                if target is None:
                    continue
                found.add(target)
                found |= pmap[target]
        return found - set(sources)

    def merge(self_id: int, other_id: int) -> int:
        mine, theirs = members[self_id], members[other_id]
        all_users = (pusers[self_id] | pusers[other_id]) - mine - theirs
        for u in all_users:
            seen: set[int] = set()
            for p in (u, *down[u]):
                if p in mine or p in theirs:
                    return self_id
                pid = assignment.get(p)
                if pid is not None and pid not in seen:
                    if self_id in pmap[pid] or other_id in pmap[pid]:
                        return self_id
                    seen.add(pid)
        keep, gone = (self_id, other_id) if len(mine) >= len(theirs) else (other_id, self_id)
        members[keep] |= members.pop(gone)
        for n in members[keep]:
            assignment[n] = keep
        order[keep] = min(order[keep], order.pop(gone))
        pmap[keep] = pmap[keep] | pmap.pop(gone)
        pusers[keep] = all_users
        del pusers[gone]
        pmap[keep] |= downstream(all_users, (keep, gone))
        pmap[keep] -= {keep, gone}
        return keep

    next_id = 0
    for i in range(len(nodes) - 1, -1, -1):
        if supported.get(nodes[i].name, False) and i not in assignment:
            pid = next_id
            next_id += 1
            order[pid] = pid
            assignment[i] = pid
            members[pid] = {i}
            pusers[pid] = set(users[i])
            pmap[pid] = downstream(users[i], (pid,))
        candidates = [pid for pid, _ in sorted(order.items(), key=lambda kv: kv[1])]
        if len(candidates) > 1:
            self_id = candidates[0]
            for other in candidates[1:]:
                self_id = merge(self_id, other)
    return [assignment.get(i, -1) for i in range(len(nodes))]
