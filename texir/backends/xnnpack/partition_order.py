"""The ids ExecuTorch 1.5.1's XnnpackPartitioner gives its partitions: their `tag<id>` names and
the order they are lowered in, hence the order of the delegates in the `.pte`.

XnnpackPartitioner does not number partitions as torch's `CapabilityBasedPartitioner` does. Its
`ConfigerationBasedPartitioner` groups the config matches (a node with the nodes its config takes
along: a GEMM's weights, a quantized op's q/dq chain; matches sharing a node are one group) and hands
them to ExecuTorch's `GroupBasedPartitioner`, which overrides `propose_partitions`:

1. walking the graph backwards, it opens a partition with a new id (0, 1, ...) for each group at the
   first of its nodes it meets, i.e. the group's last node in graph order;
2. it then tries every pair of partitions in id order and merges the higher id into the lower
   whenever no cycle results, whatever their sizes (torch's partitioner keeps the larger side's id).

So each partition ends with the smallest id among its groups, that of the group ending last in the
graph, and partitions are listed by id. texir finds which nodes share a partition on its own
(`OpSupportPartitioner`'s maximal partitions, the merges' outcome); given those and the groups, the
ids take one backward pass and no replay of the merges.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from texir.ir import Graph

__all__ = ["executorch_partition_ids"]


def executorch_partition_ids(graph: Graph, tags: Mapping[str, str],
                             groups: Sequence[Collection[str]] = ()) -> dict[str, int]:
    """The id `GroupBasedPartitioner` gives each partition of `tags` (node name -> tag, over the nodes
    of `graph`), with `groups` (node names) its node groups. A tagged node outside every group is a
    group of its own, as the partitioner treats a supported node no group holds."""
    group_of: dict[str, int] = {}
    for g, members in enumerate(groups):
        for name in members:
            group_of.setdefault(name, g)
    numbered: dict[int, int] = {}  # group -> id
    ids: dict[str, int] = {}
    next_id = 0
    for node in reversed(graph.nodes):
        group = group_of.get(node.name)
        tag = tags.get(node.name)
        if group in numbered:
            pid = numbered[group]
        elif group is not None or tag is not None:
            pid, next_id = next_id, next_id + 1
            if group is not None:
                numbered[group] = pid
        else:
            continue
        if tag is not None:
            ids[tag] = min(ids.get(tag, pid), pid)  # a group met earlier may reach back into the tag
    return ids
