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
graph, and partitions are listed by id. Which nodes share a partition is texir's maximal partitions
(`OpSupportPartitioner`); given those and the groups, the ids need one backward pass and no replay
of the merges.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from texir.ir import CallFunction, Graph

__all__ = ["executorch_partition_ids"]

_GETITEM = "_operator::getitem"


def executorch_partition_ids(graph: Graph, tags: Mapping[str, str],
                             groups: Sequence[Collection[str]] = ()) -> dict[str, int]:
    """The id `GroupBasedPartitioner` gives each partition of `tags` (node name -> tag, over the nodes
    of `graph`), with `groups` (node names) its node groups.

    A tagged call node outside every group counts as a group of its own, as the partitioner treats
    a supported node no group holds, except a getitem: ExecuTorch's partitioner puts that in its
    producer's partition afterwards, without an id of its own. A tag none of whose nodes opens an
    id (only getitems and placeholders) is numbered after all the others, by its last node."""
    group_of: dict[str, int] = {}
    for g, members in enumerate(groups):
        for name in members:
            group_of.setdefault(name, g)
    numbered: dict[int, int] = {}
    ids: dict[str, int] = {}
    next_id = 0
    nodes = graph.nodes
    for node in reversed(nodes):
        group = group_of.get(node.name)
        tag = tags.get(node.name)
        if group is not None:
            if group not in numbered:
                numbered[group] = next_id
                next_id += 1
            pid = numbered[group]
        elif tag is not None and isinstance(node, CallFunction) and node.target != _GETITEM:
            pid = next_id
            next_id += 1
        else:
            continue
        if tag is not None:
            ids[tag] = min(ids.get(tag, pid), pid)  # a group met earlier may reach back into the tag
    for node in reversed(nodes):
        tag = tags.get(node.name)
        if tag is not None and tag not in ids:
            ids[tag] = next_id
            next_id += 1
    return ids
