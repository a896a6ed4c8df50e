"""The order in which torch's CapabilityBasedPartitioner lists its partitions (hence ExecuTorch's
`tag<id>` numbering and the order partitions are lowered in), replayed on an IR graph.

texir's `maximal_partitions` gives the same partitions ordered by first node; torch lists them by
the id each one keeps through its merges. Ids are handed out walking the graph backwards; at every
node torch tries to merge, in a chain, the partition just created for it (if any) then every
partition by order (its smallest id), and a merge keeps the id of the larger side (the chain's side on
a tie), so the order follows from replaying those merges with torch's cycle test.

The replay is torch's, decision for decision, on bitsets (a Python int, bit i for node i of the
graph) instead of node sets. torch refuses a merge of partitions a and b when some node reachable
from their users outside them (`reach`) is in a or b, or is in a partition whose reachability set
(torch's `partition_map`, which keeps the ids of partitions merged away since) names a or b. With
`into[x]`, the nodes of the live partitions whose set names x, that is one test:
`reach & (members[a] | members[b] | into[a] | into[b])`.

The verdict depends on nothing but those bitsets of a and b (`reach` follows from their members
and their users outside them). A refusal is remembered with a version of each side, bumped when the
side keeps a merge, because nothing else can turn it: the `into` of every other live partition only
grows (a new partition adds its node to those its pmap names; a merged pmap names every live id
either side named). One merge needs no bump: a new single-node partition merged into an older one,
which gains that node and its users (the reaches grow) and loses it from its `into` (the node
precedes every older partition's nodes, so it is in none of their reaches). A node that creates
nothing, reached when the previous chain merged nothing and created nothing, is skipped: torch's
chain would try the same pairs on the same state and merge nothing again.
"""

from __future__ import annotations

from collections.abc import Mapping

from texir.ir import Graph
from texir.ir.analysis import node_inputs

__all__ = ["torch_partition_order"]


def torch_partition_order(graph: Graph, supported: Mapping[str, bool]) -> list[int]:
    """Surviving partition id of every supported node (by position in `graph.nodes`), -1 for the
    others."""
    nodes = graph.nodes
    index = {n.name: i for i, n in enumerate(nodes)}
    users: list[list[int]] = [[] for _ in nodes]
    for i, n in enumerate(nodes):
        for name in dict.fromkeys(node_inputs(n)):
            if name in index:
                users[index[name]].append(i)
    replay = _Replay(users)
    next_id = 0
    settled = False
    for i in range(len(nodes) - 1, -1, -1):
        # A node is never in a partition before its own turn (partitions only grow by merging), so a
        # supported node always starts one, as torch's `node not in assignment` check finds.
        if supported.get(nodes[i].name, False):
            replay.create(next_id, i)
            replay.chain([next_id, *(p for p in replay.by_order() if p != next_id)])
            next_id += 1
            settled = False
        elif not settled and replay.order:
            settled = not replay.chain(replay.by_order())
    return replay.owner


class _Replay:
    """torch's partitioning state. Node bitsets index the graph's nodes, id bitsets partition ids."""

    def __init__(self, users: list[list[int]]) -> None:
        below = [0] * len(users)  # node i and every node downstream of it
        for i in range(len(users) - 1, -1, -1):
            acc = 1 << i
            for u in users[i]:
                acc |= below[u]
            below[i] = acc
        self.users = users
        self.below = below
        self.owner = [-1] * len(users)  # node -> id of its partition
        self.assigned = 0  # the nodes in some partition
        self.alive = 0  # the ids of the partitions not merged away
        self.members: dict[int, int] = {}
        self.listing: dict[int, list[int]] = {}  # members as indices: size, relabelling on merge
        self.outside: dict[int, int] = {}  # torch's partition_users: users of members, not members
        self.reach: dict[int, int] = {}  # `outside` and everything downstream of it
        self.pmap: dict[int, int] = {}  # torch's partition_map as an id bitset (stale ids included)
        self.into: dict[int, int] = {}  # id -> nodes of the live partitions whose pmap names it
        self.order: dict[int, int] = {}  # torch's partitions_order: the smallest id merged in
        self.version: dict[int, int] = {}
        self.refused: dict[tuple[int, int], tuple[int, int]] = {}  # pair -> versions when refused
        self.fresh = -1  # the partition created at this node, while it holds that node alone

    def by_order(self) -> list[int]:
        return sorted(self.order, key=self.order.__getitem__)

    def create(self, pid: int, node: int) -> None:
        bit = 1 << node
        self.owner[node] = pid
        self.assigned |= bit
        self.members[pid] = bit
        self.listing[pid] = [node]
        outside = 0
        for u in self.users[node]:
            outside |= 1 << u
        self.outside[pid] = outside
        reach = self.below[node] & ~bit
        self.reach[pid] = reach
        pmap = self._downstream(reach) & ~(1 << pid)
        self.pmap[pid] = pmap
        for x in _ids(pmap & self.alive):
            self.into[x] |= bit  # grows: no refusal turns (module docstring)
        self.alive |= 1 << pid
        self.into[pid] = 0
        self.order[pid] = pid
        self.version[pid] = 0
        self.fresh = pid

    def chain(self, candidates: list[int]) -> bool:
        """torch's merge loop over `candidates` (first one first); whether anything merged."""
        merged = False
        current, rest = candidates[0], candidates[1:]
        if current == self.fresh:
            # Skip the partitions the new one's pmap names and its node does not feed: `_try` would
            # refuse them (see there) without a merge in between.
            named, feeds = self.pmap[current], self.outside[current]
            skip = 0
            while skip < len(rest) and named >> rest[skip] & 1 and not feeds & self.members[rest[skip]]:
                skip += 1
            rest = rest[skip:]
        for other in rest:
            kept = self._try(current, other)
            if kept is not None:
                current, merged = kept, True
        self.fresh = -1
        return merged

    def _closure(self, starts: int) -> int:
        """`starts` and every node downstream of them."""
        reach = 0
        while starts:
            low = starts & -starts
            reach |= self.below[low.bit_length() - 1]
            starts &= ~reach
        return reach

    def _downstream(self, reach: int) -> int:
        """torch's downstream_partitions: the partitions holding nodes of `reach`, with their pmaps."""
        found = 0
        pmap = self.pmap
        for pid, members in self.members.items():
            if members & reach:
                found |= (1 << pid) | pmap[pid]
        return found

    def _try(self, a: int, b: int) -> int | None:
        """torch's maybe_merge_partition(a, b): the id kept, None if refused."""
        ma, mb = self.members[a], self.members[b]
        oa, ob = self.outside[a], self.outside[b]
        if a == self.fresh and not oa & mb:
            # The new node's partition, in the state it was created in, and b does not use the node
            # (nothing does yet). Its pmap names exactly the b whose members or `into` its reach
            # meets; its members and `into` are the node alone, outside the reaches.
            if self.pmap[a] >> b & 1 or self.reach[b] & (mb | self.into[b]):
                return None
            users, reach = oa | ob, self.reach[a] | self.reach[b]
        else:
            key = (a, b) if a < b else (b, a)
            versions = (self.version[key[0]], self.version[key[1]])
            if self.refused.get(key) == versions:
                return None
            if oa & mb or ob & ma:  # a uses b or b uses a: those users drop out, walk again
                users = (oa | ob) & ~(ma | mb)
                reach = self._closure(users)
            else:
                users, reach = oa | ob, self.reach[a] | self.reach[b]
            if reach & (ma | mb | self.into[a] | self.into[b]):
                self.refused[key] = versions
                return None
        keep, gone = (a, b) if len(self.listing[a]) >= len(self.listing[b]) else (b, a)
        self._merge(keep, gone, users, reach)
        return keep

    def _merge(self, keep: int, gone: int, users: int, reach: int) -> None:
        gone_members = self.members.pop(gone)
        merged = self.members[keep] | gone_members
        self.members[keep] = merged
        for node in self.listing[gone]:
            self.owner[node] = keep
        self.listing[keep] += self.listing.pop(gone)
        self.order[keep] = min(self.order[keep], self.order.pop(gone))
        self.alive &= ~(1 << gone)
        old_keep, old_gone = self.pmap[keep], self.pmap.pop(gone)
        pmap = (old_keep | old_gone | self._downstream(reach)) & ~((1 << keep) | (1 << gone))
        self.pmap[keep] = pmap
        self.outside[keep] = users
        del self.outside[gone]
        self.reach[keep] = reach
        del self.reach[gone]
        del self.into[gone], self.version[gone]
        # The pmap kept names every live id either side named: the live partitions it names gain the
        # merged nodes they lacked, and only `keep` loses nodes (those of `gone`, which named it).
        for x in _ids(pmap & self.alive & ~(old_keep & old_gone)):
            self.into[x] |= merged
        self.into[keep] &= ~gone_members
        if gone != self.fresh:
            self.version[keep] += 1
        self.fresh = -1


def _ids(bits: int) -> list[int]:
    """The positions of the set bits of `bits`."""
    out = []
    while bits:
        low = bits & -bits
        out.append(low.bit_length() - 1)
        bits ^= low
    return out
