"""What computed only values nobody reads any more, after a pass removed their readers (the dead
code exir's passes eliminate after such a change)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from texir.ir.analysis import iter_refs, node_inputs
from texir.ir.types import CallFunction, Node

__all__ = ["dead_producers"]


def dead_producers(nodes: Mapping[str, Node], seeds: Iterable[str]) -> set[str]:
    """Names of the call nodes among `nodes` (the graph as it will be, by name) that nothing reads,
    starting from the values named in `seeds` (those a removed reader read) and going upstream."""
    uses: Counter[str] = Counter()
    for node in nodes.values():
        for name in node_inputs(node):
            uses[name] += 1
    dead: set[str] = set()
    work = list(seeds)
    while work:
        name = work.pop()
        producer = nodes.get(name)
        if name in dead or uses[name] or not isinstance(producer, CallFunction):
            continue
        dead.add(name)
        for arg in (*producer.args, *(v for _, v in producer.kwargs)):
            for ref in iter_refs(arg):
                uses[ref] -= 1
                work.append(ref)
    return dead
