"""What a lowering did, as data: per delegate (backend, nodes, blob size, named data, cache hit,
seconds), in the order the lowered program calls them; per node left undelegated, why
(`UndelegatedReason`); and the seconds of each phase of the call (`PHASES`).

`texir.lower` returns a `Lowered` (the lowered program, the edge program and the `LowerReport`);
`texir lower` prints the report (`--json` emits it). `delegate.apply_plan` returns an `AppliedPlan`
per partitioner, whose `DelegateReport`s the report puts in call order.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Final, Literal

import msgspec

from texir.ir import CallFunction, GetAttr, Program, Ref
from texir.ir.names import CALL_DELEGATE, GETITEM
from texir.ir.analysis import node_key, walk_keyed_graphs

__all__ = [
    "AppliedPlan",
    "DelegateReport",
    "LowerReport",
    "Lowered",
    "PHASES",
    "Phase",
    "PhaseClock",
    "Retrace",
    "TurnedDown",
    "UndelegatedNode",
    "UndelegatedReason",
    "build_report",
]


class DelegateReport(msgspec.Struct, frozen=True, kw_only=True):
    """One delegate of a lowered program: what one partition became."""

    module: str
    """Its name in `Program.lowered_modules` (lowered_module_N)."""
    backend: str
    partitioner: str = ""
    """The partitioner whose plan made it (`describe_partitioner`); '' from `apply_plan` alone,
    which is given a plan, not a partitioner."""
    tag: str
    graph: str
    """'' for the top-level graph, else the nested graph's path ('true_graph_0')."""
    nodes: tuple[str, ...]
    """The delegated nodes, by name in the program that partitioner was shown."""
    targets: tuple[str, ...]
    """The operator of each of `nodes`, in the same order ('' for a node that calls none)."""
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    consumed: tuple[str, ...]
    """Targets of the parameters, buffers and constants the delegate owns."""
    blob_bytes: int = 0
    """The size of the backend's processed blob."""
    named_data: int = 0
    """How many named-data entries (e.g. XNNPACK's weights) the backend returned, and their bytes."""
    named_data_bytes: int = 0
    cache_hit: bool = False
    """The result came from the preprocess cache (or an identical partition lowered just before)."""
    seconds: float = 0.0
    """What the backend's preprocess (or the cache lookup) took."""


class AppliedPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What `apply_plan` returns for one plan: the lowered program and its delegates in lowering
    order (`build_report` puts them in call order, in a `LowerReport`)."""

    program: Program
    delegates: tuple[DelegateReport, ...]
    preprocess_cached: float = 0.0
    """Seconds spent looking up (and decoding) the backends' results the preprocess cache had."""
    preprocess_compiled: float = 0.0
    """Seconds of the rest of the backends' preprocess (wall time: with jobs > 1, partitions compile in
    parallel; the misses' cache lookups and the cache writes included)."""


UndelegatedReason = Literal["no_partitioner", "turned_down"]
"""Why a node was left out of every delegate:

- "turned_down": a partitioner that supports the node's op left this node out: its node filter or its
  op check refused it (a dtype, a shape, a weight that is not static), or no partition could hold it.
  A partitioner says it supports an op with an optional `supports_op(node) -> bool` method.
  `detail`: the reasons of those partitioners (their `explain(node)`, e.g. ExecuTorch's
  `WhyNoPartition` log or the native XNNPACK check's message), else that they support the op but
  left the node out.
- "no_partitioner": no partitioner supports the op, or none says it does (a partitioner without
  `supports_op` cannot tell, and counts as not supporting it). `detail`: each partitioner's reason
  (its `explain(node)` where it has one), or that none was given.

Which partitioners tell: `OpSupportPartitioner` (its op set, and the nodes its node filter refused),
texir's native XNNPACK partitioner (the ops it has a check for), and ExecuTorch partitioners through
the bridge (a `ConfigerationBasedPartitioner` such as XNNPACK's: the ops it has a config for; any
other: the nodes it logged a `WhyNoPartition` reason for)."""


class UndelegatedNode(msgspec.Struct, frozen=True, kw_only=True):
    """An operator node the lowered program runs outside every delegate (on the runtime's kernels)."""

    node: str
    """Its key: 'name', or 'subgraph/name' in a nested graph."""
    target: str
    reason: UndelegatedReason
    detail: str


class TurnedDown(msgspec.Struct, frozen=True, kw_only=True):
    """A node of an op kept from decomposition that the partitioner's node filter turned down: it was
    decomposed after all (ExecuTorch's check_op_support), its pieces partitioned like any other node."""

    node: str
    target: str
    partitioner: str


class Retrace(msgspec.Struct, frozen=True, kw_only=True):
    """A step of `texir.lower` that torch's whole-program retrace (`run_decompositions`) did,
    because texir's node-by-node rewrite (`texir.adapters.local_decompose`) could not show its
    program equal to the retrace's."""

    step: Literal["functionalize", "decompose", "decompose_turned_down"]
    """Making the input functional (ExecuTorch's `run_decompositions({})`), decomposing it to core
    ATen, or decomposing the kept nodes a partitioner turned down (always the retrace)."""
    reason: str
    """Why the rewrite stepped aside, naming the node where it is one."""


PHASES: Final = (
    "import", "decompose", "to_edge", "partition", "preprocess_cached", "preprocess_compiled", "apply", "total",
)
"""The phases of one `lower` call, in order (`LowerReport.phases`):

- "import": the input made functional (ExecuTorch's `run_decompositions({})`, the partitioners'
  `transform_for_pre_decomposition`) and converted to IR (FX -> IR);
- "decompose": the partitioners asked what to keep (`ops_to_not_decompose`, `nodes_to_decompose`) and
  the program decomposed to core ATen (or its decomposition reused from the cache);
- "to_edge": texir's to_edge rewrites (`texir.edge.to_partitionable`);
- "partition": each partitioner's plan (an ExecuTorch partitioner's includes presenting it the edge
  ExportedProgram);
- "preprocess_cached" / "preprocess_compiled": the backends' preprocess, the results the cache had
  vs the rest (see `AppliedPlan`);
- "apply": building the lowered program around the delegates (validation, sub-programs, fusing);
- "total": the whole call, from input to report. The others sum to at most it (the rest is
  bookkeeping between phases). A phase that did not run reads 0 (`lower_decomposed` neither imports
  nor decomposes). Wall-clock seconds (`time.perf_counter`): they vary from run to run, and are no
  part of the lowered program."""


class Phase(msgspec.Struct, frozen=True, kw_only=True):
    """Seconds one phase of a `lower` call took (`PHASES` names them)."""

    name: str
    seconds: float = 0.0


class PhaseClock:
    """Adds up the seconds of each phase of one `lower` call (one clock per call: no shared state)."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self._seconds = dict.fromkeys(PHASES[:-1], 0.0)

    def add(self, name: str, seconds: float) -> None:
        self._seconds[name] += max(seconds, 0.0)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Counts the time inside the block to `name`."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def phases(self) -> tuple[Phase, ...]:
        """Every phase so far, in `PHASES` order, then the total since the clock started."""
        total = time.perf_counter() - self.started
        return (*(Phase(name=n, seconds=s) for n, s in self._seconds.items()), Phase(name="total", seconds=total))


class LowerReport(msgspec.Struct, frozen=True, kw_only=True):
    """What `texir.lower` did to one method."""

    method: str
    partitioners: tuple[str, ...]
    not_decomposed: tuple[str, ...]
    """The ops kept whole for the partitioners (their `ops_to_not_decompose`)."""
    turned_down: tuple[TurnedDown, ...]
    delegates: tuple[DelegateReport, ...]
    """In the order the lowered program calls them (graph order; nested graphs after the top)."""
    undelegated: tuple[UndelegatedNode, ...]
    """Every operator node left outside the delegates, in graph order."""
    phases: tuple[Phase, ...] = ()
    """Seconds per phase of the `lower` call, in `PHASES` order, the last the total (empty for a
    report built without `lower`)."""
    retraced: tuple[Retrace, ...] = ()
    """The steps torch's whole-program retrace did, in order, each with why (empty: none; a
    decomposition reused from the cache runs none)."""


class Lowered(msgspec.Struct, frozen=True, kw_only=True):
    """The result of `texir.lower` (and `lower_decomposed`) for one method."""

    program: Program
    """The lowered program, ready for `texir.emit.emit`."""
    edge: Program
    """The edge program before any partitioner (what an ETRecord records, and what the first
    partitioner is shown)."""
    report: LowerReport


def _call_order(program: Program) -> dict[str, int]:
    """Each lowered module's position among the delegate calls of `program` (walk order)."""
    order: dict[str, int] = {}
    for _, graph in walk_keyed_graphs(program.graph):
        attrs = {n.name: n.target for n in graph.nodes if isinstance(n, GetAttr)}
        for node in graph.nodes:
            if isinstance(node, CallFunction) and node.target == CALL_DELEGATE and node.args:
                first = node.args[0]
                if isinstance(first, Ref) and first.name in attrs:
                    order.setdefault(attrs[first.name], len(order))
    return order


def _asked(partitioner: object, method: str, node: CallFunction) -> object:
    """`partitioner.method(node)`, or None when it has no such method or it fails (a partitioner's
    explanation is advice: its failure is no lowering error)."""
    ask = getattr(partitioner, method, None)
    if not callable(ask):
        return None
    try:
        return ask(node)
    except Exception:  # advice only, see above
        return None


def _reason(node: CallFunction, partitioners: Sequence[tuple[str, object]]) -> tuple[UndelegatedReason, str]:
    """Why no partitioner took `node` (`UndelegatedReason`), and the partitioners' own words."""
    explained = [(name, p, _asked(p, "explain", node)) for name, p in partitioners]
    refusing = [(name, text) for name, p, text in explained if _asked(p, "supports_op", node) is True]
    if refusing:
        return "turned_down", "; ".join(
            str(text) if text else f"{name} supports {node.target} but left the node out" for name, text in refusing
        )
    reasons = []
    for name, _, text in explained:
        if len(explained) == 1:
            reasons.append(str(text) if text else f"not tagged by the partitioner {name}")
        else:
            reasons.append(f"{name}: {text}" if text else f"{name} did not tag it")
    return "no_partitioner", "; ".join(reasons) or "no partitioner was given"


def undelegated_nodes(program: Program, partitioners: Sequence[tuple[str, object]]) -> tuple[UndelegatedNode, ...]:
    """The operator nodes of `program` outside every delegate (delegate calls and their getitems
    aside), each with why (`partitioners`: (name, partitioner) in order)."""
    found = []
    for path, graph in walk_keyed_graphs(program.graph):
        calls = {n.name for n in graph.nodes if isinstance(n, CallFunction) and n.target == CALL_DELEGATE}
        for node in graph.nodes:
            if not isinstance(node, CallFunction) or node.name in calls:
                continue
            first = node.args[0] if node.args else None
            if node.target == GETITEM and isinstance(first, Ref) and first.name in calls:
                continue
            reason, detail = _reason(node, partitioners)
            found.append(UndelegatedNode(node=node_key(path, node.name), target=node.target, reason=reason, detail=detail))
    return tuple(found)


def build_report(
    method: str,
    program: Program,
    passes: Sequence[tuple[str, object, Sequence[DelegateReport]]],
    *,
    not_decomposed: Sequence[str] = (),
    turned_down: Sequence[TurnedDown] = (),
    phases: Sequence[Phase] = (),
) -> LowerReport:
    """The report of `program`, lowered by `passes` ((partitioner name, the partitioner, the
    delegates its plan made), in order). The partitioners' optional `explain(node)` and
    `supports_op(node)` say why a node stayed undelegated (`UndelegatedReason`)."""
    order = _call_order(program)
    delegates = [
        msgspec.structs.replace(d, partitioner=name) for name, _, made in passes for d in made
    ]
    delegates.sort(key=lambda d: order.get(d.module, len(order)))
    return LowerReport(
        method=method,
        partitioners=tuple(name for name, _, _ in passes),
        not_decomposed=tuple(not_decomposed),
        turned_down=tuple(turned_down),
        delegates=tuple(delegates),
        undelegated=undelegated_nodes(program, [(name, partitioner) for name, partitioner, _ in passes]),
        phases=tuple(phases),
    )


def delegated_by(report: LowerReport) -> Mapping[str, DelegateReport]:
    """Node key -> the delegate holding it."""
    return {
        (f"{d.graph}/{n}" if d.graph else n): d for d in report.delegates for n in d.nodes
    }
