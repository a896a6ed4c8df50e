"""`lower`: texir's `to_edge_transform_and_lower`. Decompose while keeping what the partitioners
ask to keep, bring the program to the edge form, partition and lower with each partitioner."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal, Union, overload

import msgspec

from texir.errors import TexirError
from texir.ir import CallFunction, Program
from texir.lowering.api import _describe, call_partitioner
from texir.lowering.delegate import NodeOrder, PreprocessOptions, check_node_order, lower_plan_explained
from texir.lowering.errors import KeptOpNotDelegatedError, PartitionerError
from texir.lowering.plan import Partitioner, node_key, walk_keyed_graphs
from texir.lowering.decompose_memo import decomposition_key, rebind_state, template_of
from texir.lowering.preprocess import PreprocessCache, default_cache
from texir.lowering.report import Lowered, PartitionSummary, TurnedDown, build_report, explainer_of

if TYPE_CHECKING:
    from torch.export import ExportedProgram

__all__ = ["lower", "lower_with_edge"]

_KEPT_WHOLE_ANYWAY = ("quantized_decomposed::", "torchao::")
"""Quantize/dequantize primitives stay whole in any case: leaving them undelegated is fine."""

Source = Union[Program, "ExportedProgram"]


CacheChoice = Union[PreprocessCache, Literal["default"], None]


@overload
def lower(
    program: Source,
    partitioners: Sequence[Partitioner],
    *,
    cache: CacheChoice = "default",
    jobs: int = 1,
    order: NodeOrder = "executorch",
    allow_non_core: bool = False,
) -> Program: ...


@overload
def lower(
    program: Mapping[str, Source],
    partitioners: Sequence[Partitioner] | Mapping[str, Sequence[Partitioner]],
    *,
    cache: CacheChoice = "default",
    jobs: int = 1,
    order: NodeOrder = "executorch",
    allow_non_core: bool = False,
) -> dict[str, Program]: ...


def lower(
    program: Source | Mapping[str, Source],
    partitioners: Sequence[Partitioner] | Mapping[str, Sequence[Partitioner]],
    *,
    cache: CacheChoice = "default",
    jobs: int = 1,
    order: NodeOrder = "executorch",
    allow_non_core: bool = False,
) -> Program | dict[str, Program]:
    """Lower an ExportedProgram or Program (or a mapping method name -> one) with `partitioners`
    (a sequence for every method, or a mapping method name -> sequence), in order.

    For each method: decompose as ExecuTorch's edge lowering does, keeping the ops the
    partitioners name in `ops_to_not_decompose`; apply the to_edge rewrites (`texir.edge`); then
    partition and lower with each partitioner in turn. A kept op left undelegated is a
    `KeptOpNotDelegatedError` naming the node. The result is ready for `texir.emit.emit`.

    Backends' results come from `cache` when it has them ("default": `default_cache()`, in memory
    and under `$TEXIR_CACHE_DIR`; None: no cache); the partitions left to compile run in up to
    `jobs` worker processes, with the same results as `jobs=1`. The cache also keeps the last few
    decompositions: re-lowering a program whose weights alone changed skips torch's decomposition
    retrace (`texir.lowering.decompose_memo`).

    `order` (default "executorch") places nodes as ExecuTorch's to_backend does, so that
    delegate blobs and debug maps are byte-equal to ExecuTorch's; "program" keeps the program's
    order (each delegate call at its partition's place), one graph sort per partition cheaper.
    An op outside core ATen left after decomposition and not kept by a partitioner is a
    `NonCoreOperatorError` naming the node, as ExecuTorch's `to_edge` refuses it;
    `allow_non_core=True` emits it anyway (`texir.adapters.core_aten`: the risk that it fails or
    aborts at run time). Pure: the input is not modified."""
    check_node_order(order)
    options = PreprocessOptions(cache=default_cache() if cache == "default" else cache, jobs=jobs)
    if isinstance(program, Mapping):
        return {
            name: done.program
            for name, done in _lower_methods(program, partitioners, options, order, allow_non_core).items()
        }
    if isinstance(partitioners, Mapping):
        raise PartitionerError("a mapping of partitioners needs a mapping of methods; pass a sequence for one program")
    return _lower_one("forward", program, tuple(partitioners), options, order, allow_non_core).program


@overload
def lower_with_edge(
    program: Source,
    partitioners: Sequence[Partitioner],
    *,
    cache: CacheChoice = "default",
    jobs: int = 1,
    order: NodeOrder = "executorch",
    allow_non_core: bool = False,
) -> Lowered: ...


@overload
def lower_with_edge(
    program: Mapping[str, Source],
    partitioners: Sequence[Partitioner] | Mapping[str, Sequence[Partitioner]],
    *,
    cache: CacheChoice = "default",
    jobs: int = 1,
    order: NodeOrder = "executorch",
    allow_non_core: bool = False,
) -> dict[str, Lowered]: ...


def lower_with_edge(
    program: Source | Mapping[str, Source],
    partitioners: Sequence[Partitioner] | Mapping[str, Sequence[Partitioner]],
    *,
    cache: CacheChoice = "default",
    jobs: int = 1,
    order: NodeOrder = "executorch",
    allow_non_core: bool = False,
) -> Lowered | dict[str, Lowered]:
    """`lower`, with what it did (per method for a mapping): a `texir.lowering.report.Lowered`
    holding the lowered `program`, the `edge` program it partitioned (decomposed, with the to_edge
    rewrites, before any delegation: what ExecuTorch records in an ETRecord as the edge dialect
    program, so that profiling tools can name the nodes inside delegates;
    `texir.executorch.write_etrecord` takes it), the program each partitioner was shown,
    and the `report`: each delegate (backend, nodes, blob size, named data, cache hit, seconds) in
    call order and each node left undelegated with the partitioners' reasons."""
    check_node_order(order)
    options = PreprocessOptions(cache=default_cache() if cache == "default" else cache, jobs=jobs)
    if isinstance(program, Mapping):
        return _lower_methods(program, partitioners, options, order, allow_non_core)
    if isinstance(partitioners, Mapping):
        raise PartitionerError("a mapping of partitioners needs a mapping of methods; pass a sequence for one program")
    return _lower_one("forward", program, tuple(partitioners), options, order, allow_non_core)


def _lower_methods(
    program: Mapping[str, Source],
    partitioners: Sequence[Partitioner] | Mapping[str, Sequence[Partitioner]],
    options: PreprocessOptions,
    order: NodeOrder,
    allow_non_core: bool,
) -> dict[str, Lowered]:
    if isinstance(partitioners, Mapping):
        unknown = sorted(set(partitioners) - set(program))
        if unknown:
            raise PartitionerError(f"partitioners given for methods {unknown} that are not among {sorted(program)}")
        return {name: _lower_one(name, p, tuple(partitioners.get(name, ())), options, order, allow_non_core) for name, p in program.items()}
    return {name: _lower_one(name, p, tuple(partitioners), options, order, allow_non_core) for name, p in program.items()}


def _lower_one(
    method: str,
    source: Source,
    partitioners: tuple[Partitioner, ...],
    options: PreprocessOptions,
    order: NodeOrder,
    allow_non_core: bool,
) -> Lowered:
    # Imported here: the adapters pull in torch, and `texir --help` stays torch-free.
    from texir.adapters.tensors import digest_memo

    # The program is converted twice (for ops_to_not_decompose, then decomposed), over the same
    # weights: each weight is hashed once.
    with digest_memo():
        return _lower_one_memo(method, source, partitioners, options, order, allow_non_core)


def _lower_one_memo(
    method: str,
    source: Source,
    partitioners: tuple[Partitioner, ...],
    options: PreprocessOptions,
    order: NodeOrder,
    allow_non_core: bool,
) -> Lowered:
    from torch.export import ExportedProgram

    from texir.adapters.decompositions import functionalize, has_subclass_state
    from texir.adapters.fx_export import to_exported_program
    from texir.adapters.fx_import import from_exported_program
    from texir.edge import to_partitionable

    if isinstance(source, Program):
        aten: Program | None = source
        ep = None
    elif isinstance(source, ExportedProgram):
        aten, ep = None, source
    else:
        raise PartitionerError(
            f"method {method!r}: lower takes a torch.export.ExportedProgram or a texir.ir.Program, "
            f"not {type(source).__name__}"
        )
    if ep is not None and has_subclass_state(ep):
        ep = functionalize(ep)  # torchao's quantized weights unwrapped, as ExecuTorch's first retrace does
    aten, ep = _transformed_before_decomposition(method, aten, ep, partitioners)
    if ep is not None:
        ep = _functional(ep)  # ExecuTorch's to_edge_transform_and_lower always starts so
    keep: dict[str, str] = {}
    shown: Program | None = None
    for partitioner in partitioners:
        if getattr(partitioner, "ops_to_not_decompose", None) is None:
            continue
        if shown is None:
            # Partitioners are asked about the program as ExecuTorch's run_decompositions({}) leaves
            # it: functional, the composite ops torch will not preserve (batch_norm) decomposed.
            if ep is None:
                assert aten is not None  # one of the two is set above
                ep = _functional(to_exported_program(aten))
            shown = from_exported_program(ep)
            if shown.dialect == "TRAINING":  # what run_decompositions gives back says "ATEN"
                shown = msgspec.structs.replace(shown, dialect="ATEN")
        try:
            names = tuple(partitioner.ops_to_not_decompose(shown))  # type: ignore[attr-defined]  # checked above
        except TexirError:
            raise
        except Exception as exc:  # a partitioner's failure of any kind becomes one typed error
            raise PartitionerError(
                f"method {method!r}: {partitioner!r}.ops_to_not_decompose raised {type(exc).__name__}: {exc}"
            ) from exc
        for name in names:
            keep.setdefault(name, repr(partitioner))
    # the key of a reused decomposition is the functional program, not the one shown above
    program = _decomposed(ep, aten if ep is None else None, sorted(keep), options.cache, allow_non_core)
    program, turned_down = _decompose_turned_down(method, program, partitioners, keep)
    program = to_partitionable(program)
    edge = program
    seen: list[Program] = []
    passes: list[tuple[str, object, tuple[PartitionSummary, ...]]] = []
    for partitioner in partitioners:
        seen.append(program)
        done = lower_plan_explained(program, call_partitioner(partitioner, program), preprocess=options, order=order)
        program = done.program
        passes.append((_describe(partitioner), partitioner, done.partitions))
    _check_kept_ops_delegated(method, program, keep)
    report = build_report(
        method, program, [(name, explainer_of(p), parts) for name, p, parts in passes],
        not_decomposed=sorted(keep), turned_down=turned_down,
    )
    return Lowered(program=program, edge=edge, seen=tuple(seen), report=report)


def _transformed_before_decomposition(
    method: str, aten: Program | None, ep: ExportedProgram | None, partitioners: tuple[Partitioner, ...]
) -> tuple[Program | None, ExportedProgram | None]:
    """The program after each partitioner's optional `transform_for_pre_decomposition(program)`
    (ExecuTorch's hook of that name, run before any decomposition), as (Program, None) when one
    changed it, else as given."""
    from texir.adapters.fx_import import from_exported_program

    for partitioner in partitioners:
        hook = getattr(partitioner, "transform_for_pre_decomposition", None)
        if hook is None:
            continue
        current = aten if aten is not None else from_exported_program(ep) if ep is not None else None
        if current is None:  # pragma: no cover - _lower_one_memo sets one of the two
            raise PartitionerError("internal error: nothing to transform; please report")
        try:
            changed = hook(current)
        except TexirError:
            raise
        except Exception as exc:  # a partitioner's failure of any kind becomes one typed error
            raise PartitionerError(
                f"method {method!r}: {partitioner!r}.transform_for_pre_decomposition raised {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(changed, Program):
            raise PartitionerError(
                f"method {method!r}: {partitioner!r}.transform_for_pre_decomposition returned "
                f"{type(changed).__name__}, not a texir Program"
            )
        if changed is not current:
            aten, ep = changed, None
    return aten, ep


def _decomposed(
    ep: ExportedProgram | None, aten: Program | None, keep: list[str], cache: PreprocessCache | None,
    allow_non_core: bool = False,
) -> Program:
    """The program decomposed keeping `keep`; with a cache, the decomposition of a program of the
    same structure (weights aside) is reused (`texir.lowering.decompose_memo`)."""
    from texir.adapters.fx_export import to_exported_program
    from texir.adapters.fx_import import from_exported_program

    if cache is not None and ep is not None:
        aten = from_exported_program(ep)  # cheap next to the retrace; weights hashed once (digest_memo)
    key = None
    if cache is not None and aten is not None:
        key = decomposition_key(aten, keep)
        template = cache.decomposition(key)
        if template is not None:
            return rebind_state(template, aten)
    if ep is None:
        if aten is None:  # pragma: no cover - _lower_one_memo sets one of the two
            raise PartitionerError("internal error: nothing to decompose; please report")
        ep = _functional(to_exported_program(aten))
    program = from_exported_program(ep, decompose=True, keep=keep, allow_non_core=allow_non_core)
    if cache is not None and key is not None and aten is not None and not allow_non_core:
        # (only programs that passed the core-ATen check are reused, so a reuse needs no check)
        template = template_of(program, aten)
        if template is not None:
            cache.store_decomposition(key, template)
    return program


def _functional(ep: ExportedProgram) -> ExportedProgram:
    """`ep` as ExecuTorch's to_edge_transform_and_lower first makes it (`run_decompositions({})`):
    functional, tensor-subclass weights unwrapped, the composites torch does not preserve
    (contiguous, reshape) run through their kernels. The decomposition proper starts from it, as
    ExecuTorch's does: decomposing the exported program at once gives other nodes (a `contiguous`
    after an op that the decomposition makes contiguous leaves no clone), other names and other
    debug handles. Without the retrace where `texir.adapters.local_decompose` can."""
    from texir.adapters.local_decompose import functional_program

    return functional_program(ep)


def _decompose_turned_down(
    method: str, program: Program, partitioners: tuple[Partitioner, ...], keep: Mapping[str, str]
) -> tuple[Program, tuple[TurnedDown, ...]]:
    """`program` with the nodes of kept ops that a partitioner turns down (its optional
    `nodes_to_decompose(program)`, node keys) decomposed after all, as ExecuTorch does with the
    nodes its partitioners' node filters reject. One more decomposition retrace, only when there
    are such nodes."""
    if not keep:
        return program, ()
    from texir.adapters.decompositions import decompose_nodes
    from texir.adapters.fx_export import to_exported_program
    from texir.adapters.fx_import import from_exported_program

    known: set[str] = set()
    kept: dict[str, str] = {}
    for path, graph in walk_keyed_graphs(program.graph):
        for node in graph.nodes:
            key = node_key(path, node.name)
            known.add(key)
            if isinstance(node, CallFunction) and node.target in keep:
                kept[key] = node.target
    if not kept:
        return program, ()
    turned_down: dict[str, str] = {}
    for partitioner in partitioners:
        ask = getattr(partitioner, "nodes_to_decompose", None)
        if ask is None:
            continue
        try:
            names = tuple(ask(program))
        except TexirError:
            raise
        except Exception as exc:  # a partitioner's failure of any kind becomes one typed error
            raise PartitionerError(
                f"method {method!r}: {partitioner!r}.nodes_to_decompose raised {type(exc).__name__}: {exc}"
            ) from exc
        unknown = sorted(str(n) for n in names if n not in known)
        if unknown:
            raise PartitionerError(
                f"method {method!r}: {partitioner!r}.nodes_to_decompose named {unknown[:3]}, which are not nodes "
                "of the program it was shown; name nodes by key ('name', or 'subgraph/name' in nested graphs)"
            )
        for n in names:
            if n in kept:
                turned_down.setdefault(n, _describe(partitioner))
    if not turned_down:
        return program, ()
    notes = tuple(TurnedDown(node=n, target=kept[n], partitioner=p) for n, p in sorted(turned_down.items()))
    decomposed = decompose_nodes(to_exported_program(program), sorted(turned_down), sorted(keep))
    return from_exported_program(decomposed), notes


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
