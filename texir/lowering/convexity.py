"""Convexity of a plan's partitions: contracted to one node each, they must leave the graph acyclic.
A cycle is reported as a concrete node path, naming the partitions on it."""

from __future__ import annotations

from texir.ir import Graph
from texir.ir.analysis import node_inputs
from texir.lowering.errors import NonConvexPartitionError

__all__ = ["check_acyclic"]


def _cycle_path(preds: dict[str, list[tuple[str, str, str]]], remaining: set[str], order: list[str]) -> list[str]:
    """A concrete node path around one cycle of the quotient graph among `remaining` groups."""
    start = next(g for g in order if g in remaining)
    # Walk backwards along predecessor edges inside the remaining set until a group repeats.
    seen: dict[str, int] = {}
    walk: list[tuple[str, str, str]] = []  # (pred group, pred node, node)
    group = start
    while group not in seen:
        seen[group] = len(walk)
        edge = next(e for e in preds[group] if e[0] in remaining)
        walk.append(edge)
        group = edge[0]
    cycle = list(reversed(walk[seen[group]:]))  # edges in forward order
    nodes: list[str] = []
    for _, src, dst in cycle:
        if not nodes or nodes[-1] != src:
            if nodes:
                nodes.append("...")
            nodes.append(src)
        nodes.append(dst)
    return nodes


def check_acyclic(
    graph: Graph, group_of: dict[str, str], tag_of: dict[str, str], where: str
) -> tuple[dict[str, tuple[str, ...]], dict[str, int]]:
    """Every partition contracted to one node must leave the graph acyclic (Kahn's algorithm).
    Returns the contracted graph: each group's successors and in-degree."""
    succs: dict[str, list[str]] = {}
    preds: dict[str, list[tuple[str, str, str]]] = {}
    indegree: dict[str, int] = {}
    order: list[str] = []
    seen_edges: set[tuple[str, str]] = set()
    for node in graph.nodes:
        g = group_of[node.name]
        if g not in indegree:
            indegree[g] = 0
            succs[g] = []
            preds[g] = []
            order.append(g)
        for name in node_inputs(node):
            src = group_of.get(name)
            if src is None or src == g:
                continue
            preds[g].append((src, name, node.name))
            if (src, g) not in seen_edges:
                seen_edges.add((src, g))
                succs[src].append(g)
                indegree[g] += 1
    contracted = ({g: tuple(v) for g, v in succs.items()}, dict(indegree))
    ready = [g for g in order if indegree[g] == 0]
    done = 0
    while ready:
        g = ready.pop()
        done += 1
        for s in succs[g]:
            indegree[s] -= 1
            if indegree[s] == 0:
                ready.append(s)
    if done == len(order):
        return contracted
    remaining = {g for g in order if indegree[g] > 0}
    path = _cycle_path(preds, remaining, order)
    involved = sorted({tag_of[n] for n in path if n in tag_of})
    text = " -> ".join(path)
    if len(involved) == 1:
        raise NonConvexPartitionError(
            f"partition '{involved[0]}' is not convex{where}: the path {text} leaves it and comes back; "
            "tag the nodes in between with the same tag or split the partition"
        )
    raise NonConvexPartitionError(
        f"partitions {involved} depend on each other{where} along {text}; "
        "merge them or move the nodes between them out of one partition"
    )
