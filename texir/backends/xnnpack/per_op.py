"""ExecuTorch 1.5.1's XnnpackPartitioner(per_op_mode=True) on the IR: each call node a config takes
(in graph order) brings the nodes its config partitions with it (`node_and_deps`): a GEMM its static
weight and bias and a single-user relu/hardtanh after it, a batch norm its parameters and getitems,
a quantized op its q/dq nodes. Matches that share a node are merged (a constant already matched is
not shared, so it stays with its first match), as ExecuTorch's disjoint-set union does, and each
group becomes one partition, numbered in the order of its first member; no other merging."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from texir.backends.xnnpack.ops import GEMMS, PARAMS
from texir.backends.xnnpack.quant_partition import QuantPlan
from texir.ir import CallFunction, NoneArg, Program, Ref
from texir.ir.names import GETITEM

__all__ = ["per_op_groups"]


def _ref(node: CallFunction, i: int | None) -> str | None:
    a = node.args[i] if i is not None and len(node.args) > i else None
    return a.name if isinstance(a, Ref) and not isinstance(a, NoneArg) else None


def per_op_groups(program: Program, constants: Collection[str], quant: QuantPlan,
                  taken: Callable[[CallFunction], bool]) -> list[list[str]]:
    """The node groups (node names) per_op_mode partitions, in ExecuTorch's partition order.
    `taken(node)` is whether the config of `node`'s op takes it."""
    calls = [n for n in program.graph.nodes if isinstance(n, CallFunction)]
    users: dict[str, list[CallFunction]] = {}
    for n in calls:
        for a in dict.fromkeys(a.name for a in _refs(n)):
            users.setdefault(a, []).append(n)
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        if parent[x] != x:
            parent[x] = find(parent[x])
        return parent[x]

    for n in calls:
        if n.target == GETITEM or not taken(n):
            continue
        match = [n.name, *_deps(n, quant, users)]
        match = [m for i, m in enumerate(match) if m not in match[:i]]
        part = [m for m in match if not (m in constants and m in parent)]
        if not part:
            continue
        find(part[0])
        for m in part[1:]:
            root = find(m)  # the union's right side first, as ExecuTorch's DSJ evaluates it
            parent[find(part[0])] = root
    groups: dict[str, list[str]] = {}
    for name in list(parent):
        groups.setdefault(find(name), []).append(name)
    return list(groups.values())


def _deps(n: CallFunction, quant: QuantPlan, users: Mapping[str, list[CallFunction]]) -> list[str]:
    if n.name in quant.members:
        return list(quant.members[n.name])
    gemm = GEMMS.get(n.target)
    if gemm is not None:
        deps = [d for d in (_ref(n, gemm.bias), _ref(n, gemm.weight)) if d is not None]
        after = users.get(n.name, [])
        if len(after) == 1 and after[0].target in gemm.config_acts:
            deps.append(after[0].name)
        return deps
    if n.target in PARAMS:
        deps = [d for d in (_ref(n, i) for i in PARAMS[n.target]) if d is not None]
        return deps + [u.name for u in users.get(n.name, []) if u.target == GETITEM]
    return []


def _refs(node: CallFunction) -> list[Ref]:
    found: list[Ref] = []

    def walk(a: object) -> None:
        if isinstance(a, Ref):
            found.append(a)
        elif hasattr(a, "items") and isinstance(getattr(a, "items"), tuple):
            for x in getattr(a, "items"):
                walk(x)

    for a in node.args:
        walk(a)
    return found
