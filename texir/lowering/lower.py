"""Lowering a decomposed texir `Program`, without torch: texir's to_edge rewrites (`texir.edge`),
then each partitioner's plan lowered in turn, with a report of what was done.

`lower_decomposed` takes a program already in core ATen: IR text (`texir.ir.parse_program`), a
program built with `texir.ir.builder`, or one `from_exported_program(ep, decompose=True)` gave.
`texir.lower` (`texir.orchestrate`, above the adapters) decomposes a torch `ExportedProgram`, or a
`Program` still holding composite ops, as ExecuTorch's to_edge does, and finishes here."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from typing import Literal, TypeVar, Union, overload

from texir.edge import to_partitionable
from texir.ir import CallFunction, Program
from texir.lowering.api import call_partitioner, describe_partitioner
from texir.lowering.delegate import NodeOrder, PreprocessOptions, apply_plan, check_node_order
from texir.lowering.errors import KeptOpNotDelegatedError, PartitionerArgumentError, PartitionerError
from texir.lowering.plan import Partitioner
from texir.ir.analysis import node_key, walk_keyed_graphs
from texir.lowering.preprocess import PreprocessCache, check_workers, default_cache
from texir.lowering.report import DelegateReport, Lowered, PhaseClock, TurnedDown, build_report

__all__ = [
    "CacheChoice", "EdgeTransform", "lower_decomposed", "lower_edge", "one_sequence", "partitioner_tuple", "per_method", "preprocess_options"
]

_KEPT_WHOLE_ANYWAY = ("quantized_decomposed::", "torchao::")
"""Quantize/dequantize primitives stay whole in any case: leaving them undelegated is fine."""

CacheChoice = Union[PreprocessCache, Literal["default"], None]
EdgeTransform = Callable[[str, Program], Program]
"""(method name, program in the to_edge form) -> the program the partitioners are shown."""

S = TypeVar("S")


def preprocess_options(
    cache: CacheChoice, jobs: int, order: NodeOrder, executor: Executor | None = None
) -> PreprocessOptions:
    """The backends' cache and workers, after checking `order`, `jobs` and `executor`."""
    check_node_order(order)
    check_workers(jobs, executor)
    return PreprocessOptions(cache=default_cache() if cache == "default" else cache, jobs=jobs, executor=executor)


def per_method(
    program: Mapping[str, S],
    partitioners: Sequence[Partitioner] | Mapping[str, Sequence[Partitioner]],
    one: Callable[[str, S, tuple[Partitioner, ...]], Lowered],
) -> dict[str, Lowered]:
    """`one(method, program, its partitioners)` for each method (partitioners: the same sequence for
    every method, or a mapping method name -> sequence)."""
    if isinstance(partitioners, Mapping):
        unknown = sorted(set(partitioners) - set(program))
        if unknown:
            raise PartitionerError(f"partitioners given for methods {unknown} that are not among {sorted(program)}")
        return {name: one(name, p, partitioner_tuple(partitioners.get(name, ()))) for name, p in program.items()}
    return {name: one(name, p, partitioner_tuple(partitioners)) for name, p in program.items()}


def partitioner_tuple(partitioners: Sequence[Partitioner]) -> tuple[Partitioner, ...]:
    """`partitioners` as a tuple; one partitioner given where a sequence goes is a
    `PartitionerArgumentError` saying to write `[partitioner]`."""
    if callable(partitioners) or not isinstance(partitioners, Iterable) or isinstance(partitioners, str):
        raise PartitionerArgumentError(
            f"lower() takes a list of partitioners, not {_a_value(partitioners)}; write lower(program, [partitioner])"
        )
    return tuple(partitioners)


def _a_value(value: object) -> str:
    return f"one partitioner ({type(value).__name__})" if callable(value) else f"a {type(value).__name__}"


def one_sequence(partitioners: Sequence[Partitioner] | Mapping[str, Sequence[Partitioner]]) -> tuple[Partitioner, ...]:
    if isinstance(partitioners, Mapping):
        raise PartitionerError("a mapping of partitioners needs a mapping of methods; pass a sequence for one program")
    return partitioner_tuple(partitioners)


@overload
def lower_decomposed(
    program: Program,
    partitioners: Sequence[Partitioner],
    *,
    cache: CacheChoice = "default",
    jobs: int = 1,
    executor: Executor | None = None,
    order: NodeOrder = "executorch",
    skip_dim_order: bool = False,
) -> Lowered: ...


@overload
def lower_decomposed(
    program: Mapping[str, Program],
    partitioners: Sequence[Partitioner] | Mapping[str, Sequence[Partitioner]],
    *,
    cache: CacheChoice = "default",
    jobs: int = 1,
    executor: Executor | None = None,
    order: NodeOrder = "executorch",
    skip_dim_order: bool = False,
) -> dict[str, Lowered]: ...


def lower_decomposed(
    program: Program | Mapping[str, Program],
    partitioners: Sequence[Partitioner] | Mapping[str, Sequence[Partitioner]],
    *,
    cache: CacheChoice = "default",
    jobs: int = 1,
    executor: Executor | None = None,
    order: NodeOrder = "executorch",
    skip_dim_order: bool = False,
) -> Lowered | dict[str, Lowered]:
    """Lower a texir Program already in core ATen (or a mapping method name -> one) with
    `partitioners`, in order, importing no torch: the to_edge rewrites, then each partitioner's plan.
    Returns a `texir.lowering.report.Lowered` (per method for a mapping): the lowered program, the
    edge program partitioned and the report.

    Nothing is decomposed here, so the partitioners' decomposition hooks
    (`ops_to_not_decompose`, `transform_for_pre_decomposition`, `nodes_to_decompose`) are not
    asked; `texir.lower` asks them. `cache`, `jobs`, `executor`, `order` and `skip_dim_order` are as there."""
    options = preprocess_options(cache, jobs, order, executor)

    def one(method: str, source: Program, parts: tuple[Partitioner, ...]) -> Lowered:
        clock = PhaseClock()
        if not isinstance(source, Program):
            raise PartitionerError(
                f"method {method!r}: lower_decomposed takes a texir.ir.Program, not {type(source).__name__}; "
                "lower a torch.export.ExportedProgram with texir.lower"
            )
        return lower_edge(method, source, parts, options, order, clock=clock, skip_dim_order=skip_dim_order)

    if isinstance(program, Mapping):
        return per_method(program, partitioners, one)
    return one("forward", program, one_sequence(partitioners))


def lower_edge(
    method: str,
    program: Program,
    partitioners: tuple[Partitioner, ...],
    options: PreprocessOptions,
    order: NodeOrder,
    keep: Mapping[str, str] | None = None,
    turned_down: tuple[TurnedDown, ...] = (),
    clock: PhaseClock | None = None,
    transform: EdgeTransform | None = None,
    *,
    skip_dim_order: bool = False,
) -> Lowered:
    """The decomposed `program` through the to_edge rewrites and each partitioner in turn. `keep`:
    the ops kept from decomposition, each with the partitioner that asked (a kept op left
    undelegated is a `KeptOpNotDelegatedError`); `turned_down`: the kept nodes decomposed after all;
    `clock`: the call's phase clock (the report's `phases`), started by the caller; `transform`:
    run on the to_edge form before the first partitioner (ExecuTorch's `transform_passes`);
    `skip_dim_order`: the to_edge rewrites without ExecuTorch's dim-order ops, as its
    `EdgeCompileConfig(_skip_dim_order=True)` (`texir.edge.pipeline.to_edge_stage`)."""
    keep = keep or {}
    clock = clock or PhaseClock()
    with clock.phase("to_edge"):
        program = to_partitionable(program, skip_dim_order=skip_dim_order)
        if transform is not None:
            program = transform(method, program)
    edge = program
    passes: list[tuple[str, object, tuple[DelegateReport, ...]]] = []
    for partitioner in partitioners:
        with clock.phase("partition"):
            plan = call_partitioner(partitioner, program)
        start = time.perf_counter()
        done = apply_plan(program, plan, preprocess=options, order=order, numbering="fused")
        clock.add("preprocess_cached", done.preprocess_cached)
        clock.add("preprocess_compiled", done.preprocess_compiled)
        clock.add("apply", time.perf_counter() - start - done.preprocess_cached - done.preprocess_compiled)
        program = done.program
        passes.append((describe_partitioner(partitioner), partitioner, done.delegates))
    _check_kept_ops_delegated(method, program, keep)
    report = build_report(
        method, program, passes,
        not_decomposed=sorted(keep), turned_down=turned_down, phases=clock.phases(),
    )
    return Lowered(program=program, edge=edge, report=report)


def _check_kept_ops_delegated(method: str, program: Program, keep: Mapping[str, str]) -> None:
    if not keep:
        return
    for path, graph in walk_keyed_graphs(program.graph):
        for node in graph.nodes:
            if isinstance(node, CallFunction) and node.target in keep and not node.target.startswith(_KEPT_WHOLE_ANYWAY):
                raise KeptOpNotDelegatedError(
                    f"method {method!r}, node {node_key(path, node.name)!r}: {node.target} was kept from "
                    f"decomposition for {keep[node.target]} (ops_to_not_decompose) but not delegated; "
                    "the runtime may have no kernel for it: make the partitioner take the node, or stop "
                    "listing the op in ops_to_not_decompose"
                )
