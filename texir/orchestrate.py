"""`lower`: texir's `to_edge_transform_and_lower`, from a torch `ExportedProgram` (or a texir
`Program` still to decompose). Decompose while keeping what the partitioners ask to keep, then hand
the program to `texir.lowering.lower.lower_edge` (the to_edge rewrites, each partitioner in turn).

The orchestration layer: above the adapters (torch <-> IR, decomposition) and the ExecuTorch bridge.
A texir Program already in core ATen lowers without torch through `texir.lowering.lower_decomposed`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any, Union, overload

import msgspec
from torch.export import ExportedProgram

from texir.adapters.conversion_memo import conversion_memo, exported_program_of, forget_exported, remember_exported
from texir.adapters.decompositions import decompose_nodes, functionalize, has_subclass_state
from texir.adapters.fx_export import to_exported_program
from texir.adapters.fx_import import from_exported_program, state_memo
from texir.adapters.ir_decompose import decompose_functional_ir
from texir.adapters.local_decompose import functional_program
from texir.adapters.tensors import digest_memo
from texir.backends import xnnpack
from texir.backends.xnnpack.partitioner import XnnpackNativePartitioner
from texir.errors import TexirError
from texir.ir import CallFunction, Program
from texir.lowering.api import describe_partitioner
from texir.lowering.backend import registered_backends, registered_implicitly
from texir.lowering.decompose_memo import decomposition_key, rebind_state, template_of
from texir.lowering.delegate import NodeOrder, PreprocessOptions
from texir.lowering.errors import PartitionerError
from texir.lowering.lower import CacheChoice, EdgeTransform, lower_edge, one_sequence, per_method, preprocess_options
from texir.lowering.plan import Partitioner
from texir.ir.analysis import node_key, walk_keyed_graphs
from texir.lowering.preprocess import PreprocessCache
from texir.lowering.report import Lowered, PhaseClock, Retrace, TurnedDown

__all__ = ["CacheChoice", "Lowered", "Source", "lower"]

Source = Union[Program, ExportedProgram]


@overload
def lower(
    program: Source,
    partitioners: Sequence[Partitioner],
    *,
    cache: CacheChoice = "default",
    jobs: int = 1,
    executor: Executor | None = None,
    order: NodeOrder = "executorch",
    allow_non_core: bool = False,
    transform: EdgeTransform | None = None,
    skip_dim_order: bool = False,
) -> Lowered: ...


@overload
def lower(
    program: Mapping[str, Source],
    partitioners: Sequence[Partitioner] | Mapping[str, Sequence[Partitioner]],
    *,
    cache: CacheChoice = "default",
    jobs: int = 1,
    executor: Executor | None = None,
    order: NodeOrder = "executorch",
    allow_non_core: bool = False,
    transform: EdgeTransform | None = None,
    skip_dim_order: bool = False,
) -> dict[str, Lowered]: ...


def lower(
    program: Source | Mapping[str, Source],
    partitioners: Sequence[Partitioner] | Mapping[str, Sequence[Partitioner]],
    *,
    cache: CacheChoice = "default",
    jobs: int = 1,
    executor: Executor | None = None,
    order: NodeOrder = "executorch",
    allow_non_core: bool = False,
    transform: EdgeTransform | None = None,
    skip_dim_order: bool = False,
) -> Lowered | dict[str, Lowered]:
    """Lower an ExportedProgram or Program (or a mapping method name -> one) with `partitioners`
    (a sequence for every method, or a mapping method name -> sequence), in order. Returns a
    `texir.lowering.report.Lowered` (per method for a mapping): the lowered `program`, ready for
    `texir.emit.emit`; the `edge` program it partitioned (decomposed, with the to_edge rewrites,
    before any delegation: what ExecuTorch records in an ETRecord, `texir.executorch.write_etrecord`
    takes it, and what the first partitioner is shown); and the `report`: each delegate
    (backend, nodes, blob size, named data, cache hit, seconds) in call order and each node left
    undelegated with the partitioners' reasons.

    For each method: decompose as ExecuTorch's edge lowering does, keeping the ops the
    partitioners name in `ops_to_not_decompose`; apply the to_edge rewrites (`texir.edge`); then
    partition and lower with each partitioner in turn. A kept op left undelegated is a
    `KeptOpNotDelegatedError` naming the node. The input is converted to IR once, and to an
    ExportedProgram once per program a partitioner is shown.

    Backends' results come from `cache` when it has them ("default": `default_cache()`, in memory
    and under `$TEXIR_CACHE_DIR`; None: no cache); the partitions left to compile run in up to
    `jobs` worker processes (spawned; a calling script keeps its top level under
    `if __name__ == "__main__":`), or on `executor`, any `concurrent.futures.Executor` (e.g.
    Dask's `distributed.Client(...).get_executor()` or Ray's, to compile partitions on a cluster;
    the backends must be importable on its workers; an executor of threads in this process runs
    backends concurrently, which ExecuTorch's are not safe for), with the same results and errors
    as `jobs=1`. The cache also keeps the last few
    decompositions: re-lowering a program whose weights alone changed skips torch's decomposition
    retrace (`texir.lowering.decompose_memo`).

    `order` (default "executorch") places nodes as ExecuTorch's to_backend does, so that
    delegate blobs and debug maps are byte-equal to ExecuTorch's; "program" keeps the program's
    order (each delegate call at its partition's place), one graph sort per partition cheaper.
    An op outside core ATen left after decomposition and not kept by a partitioner is a
    `NonCoreOperatorError` naming the node, as ExecuTorch's `to_edge` refuses it;
    `allow_non_core=True` emits it anyway (`texir.adapters.core_aten`: the risk that it fails or
    aborts at run time). `transform(method, program)`, when given, rewrites each method's
    to_edge form before the first partitioner sees it (ExecuTorch's `transform_passes`; the
    report's `edge` is its result). `skip_dim_order=True` leaves ExecuTorch's dim-order ops out of
    the to_edge rewrites, as its `EdgeCompileConfig(_skip_dim_order=True)` does (`_to_copy`, `clone`
    stay ATen ops). Pure: the input is not modified. A texir Program already in core ATen
    lowers without torch through `texir.lowering.lower_decomposed`."""
    options = preprocess_options(cache, jobs, order, executor)

    def one(method: str, source: Source, parts: tuple[Partitioner, ...]) -> Lowered:
        return _lower_one(method, source, parts, options, order, allow_non_core, transform, skip_dim_order)

    if isinstance(program, Mapping):
        return per_method(program, partitioners, one)
    return one("forward", program, one_sequence(partitioners))


def _lower_one(
    method: str,
    source: Source,
    partitioners: tuple[Partitioner, ...],
    options: PreprocessOptions,
    order: NodeOrder,
    allow_non_core: bool,
    transform: EdgeTransform | None = None,
    skip_dim_order: bool = False,
) -> Lowered:
    clock = PhaseClock()
    # Convert once: each weight is hashed once (digest_memo), and the partitioners' decomposition
    # hooks share one ExportedProgram of the program they are shown (conversion_memo).
    with digest_memo(), conversion_memo(), _native_backends(partitioners):
        return _lower_one_memo(
            method, source, partitioners, options, order, allow_non_core, clock, transform, skip_dim_order
        )


def _native_backends(partitioners: Sequence[Partitioner]) -> contextlib.AbstractContextManager[object]:
    """texir's native XNNPACK backend registered for this lowering when its partitioner is among
    `partitioners` and no backend is registered under `XnnpackBackend` but one texir registered by
    itself (ExecuTorch's, which the bridge registers for ExecuTorch's partitioner): so `lower(ep,
    [xnnpack.partitioner()])` needs no `with xnnpack.registered():` and preprocesses natively
    whatever ran before it in the process. A backend the user registered there (such a block,
    `xnnpack.register()`, their own) stays; the registry is left as it was."""
    uses_native = any(isinstance(p, XnnpackNativePartitioner) for p in partitioners)
    if uses_native and (xnnpack.BACKEND_ID not in registered_backends()
                        or registered_implicitly(xnnpack.BACKEND_ID)):
        return xnnpack.registered()
    return contextlib.nullcontext()


def _lower_one_memo(
    method: str,
    source: Source,
    partitioners: tuple[Partitioner, ...],
    options: PreprocessOptions,
    order: NodeOrder,
    allow_non_core: bool,
    clock: PhaseClock,
    transform: EdgeTransform | None = None,
    skip_dim_order: bool = False,
) -> Lowered:
    retraced: list[Retrace] = []  # each step torch's retrace did, with why (the report's `retraced`)
    # The decomposed program's weights are the imported program's state entries (state_memo),
    # converted once; the memo ends with the decomposition, so no copied buffer outlives it.
    with state_memo():
        with clock.phase("import"):
            aten, ep = _imported(method, source, partitioners, options, retraced)
        with clock.phase("decompose"):
            keep = _kept_ops(method, aten, partitioners)
            program = _decomposed(ep, aten, sorted(keep), options.cache, retraced, allow_non_core)
            program, turned_down = _decompose_turned_down(method, program, partitioners, keep, retraced)
    # The functional input (its FX graph and IR) is not read past here: let it go before the
    # to_edge rewrites and the partitioners run (on a Llama, ~3.5 MiB of Python objects a layer)
    if aten is not None:
        forget_exported(aten)
    del aten, ep
    lowered = lower_edge(
        method, program, partitioners, options, order, keep=keep, turned_down=turned_down, clock=clock,
        transform=transform, skip_dim_order=skip_dim_order,
    )
    if not retraced:
        return lowered
    return msgspec.structs.replace(lowered, report=msgspec.structs.replace(lowered.report, retraced=tuple(retraced)))


def _imported(
    method: str, source: Source, partitioners: tuple[Partitioner, ...], options: PreprocessOptions,
    retraced: list[Retrace],
) -> tuple[Program | None, ExportedProgram | None]:
    """`source` made functional (as ExecuTorch's to_edge_transform_and_lower first does) after the
    partitioners' pre-decomposition hooks, as (its IR, the ExportedProgram it came from): the IR is
    converted only when a partitioner asks about it or the cache keys its decomposition; either
    side may be None."""
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
    functional = False
    if ep is not None and has_subclass_state(ep):
        # torchao's quantized weights unwrapped by ExecuTorch's first retrace, run_decompositions({}):
        # the program is functional after it, and a second such retrace would give it back unchanged
        ep, functional = functionalize(ep), True
        retraced.append(Retrace(step="functionalize", reason="tensor-subclass weights (torchao's quantized tensors)"))
    aten, ep = _transformed_before_decomposition(method, aten, ep, partitioners)
    if ep is not None:
        if not functional:
            ep = _functional(ep, retraced)  # ExecuTorch's to_edge_transform_and_lower always starts so
        aten = None  # (the functional program is another program than the input)
    asks = any(getattr(p, "ops_to_not_decompose", None) is not None for p in partitioners)
    if asks or (options.cache is not None and ep is not None):
        # Partitioners are asked about the program as ExecuTorch's run_decompositions({}) leaves
        # it: functional, the composite ops torch will not preserve (batch_norm) decomposed. The
        # decomposition's reuse key is that program too: it is converted once for both.
        if ep is None:
            assert aten is not None  # one of the two is set above
            ep = _functional(to_exported_program(aten), retraced)
        aten = from_exported_program(ep)
        if aten.dialect == "TRAINING":  # what run_decompositions gives back says "ATEN"
            aten = msgspec.structs.replace(aten, dialect="ATEN")
        remember_exported(aten, ep)  # the hooks' ExportedProgram of it is `ep` itself
    return aten, ep


def _kept_ops(method: str, aten: Program | None, partitioners: tuple[Partitioner, ...]) -> dict[str, str]:
    """The ops the partitioners ask to keep whole (`ops_to_not_decompose`), each with the first
    partitioner that asked."""
    keep: dict[str, str] = {}
    for partitioner in partitioners:
        if getattr(partitioner, "ops_to_not_decompose", None) is None:
            continue
        assert aten is not None  # _imported converts it when a partitioner asks
        for name in _call_hook(method, partitioner, "ops_to_not_decompose", aten, tuple):
            keep.setdefault(name, repr(partitioner))
    return keep


def _call_hook(
    method: str, partitioner: Partitioner, hook: str, program: Program, then: Callable[[Any], Any] = lambda x: x
) -> Any:
    """`then(partitioner.<hook>(program))` (`then`: e.g. `tuple`, so that a generator's failure counts
    too); anything but a texir error it raises is a `PartitionerError` naming the method, the
    partitioner and the hook, with the original as the cause."""
    try:
        return then(getattr(partitioner, hook)(program))
    except TexirError:
        raise
    except Exception as exc:  # a partitioner's failure of any kind becomes one typed error
        raise PartitionerError(
            f"method {method!r}: {partitioner!r}.{hook} raised {type(exc).__name__}: {exc}"
        ) from exc


def _transformed_before_decomposition(
    method: str, aten: Program | None, ep: ExportedProgram | None, partitioners: tuple[Partitioner, ...]
) -> tuple[Program | None, ExportedProgram | None]:
    """The program after each partitioner's optional `transform_for_pre_decomposition(program)`
    (ExecuTorch's hook of that name, run before any decomposition), as (Program, None) when one
    changed it, else as given."""
    current = aten
    for partitioner in partitioners:
        hook = getattr(partitioner, "transform_for_pre_decomposition", None)
        if hook is None:
            continue
        if current is None:
            if ep is None:  # pragma: no cover - _lower_one_memo sets one of the two
                raise PartitionerError("internal error: nothing to transform; please report")
            current = from_exported_program(ep)  # once, whatever the number of hooks
        changed = _call_hook(method, partitioner, "transform_for_pre_decomposition", current)
        if not isinstance(changed, Program):
            raise PartitionerError(
                f"method {method!r}: {partitioner!r}.transform_for_pre_decomposition returned "
                f"{type(changed).__name__}, not a texir Program"
            )
        if changed is not current:
            current = aten = changed
            ep = None
    return aten, ep


def _decomposed(
    ep: ExportedProgram | None, aten: Program | None, keep: list[str], cache: PreprocessCache | None,
    retraced: list[Retrace], allow_non_core: bool = False,
) -> Program:
    """The program decomposed keeping `keep`; `aten` is `ep` converted when both are given. With a
    cache, the decomposition of a program of the same structure (weights aside) is reused
    (`texir.lowering.decompose_memo`)."""
    key = None
    if cache is not None and aten is not None:
        key = decomposition_key(aten, keep)
        template = cache.decomposition(key)
        if template is not None:
            return rebind_state(template, aten)
    program = None
    if ep is not None and aten is not None:
        # `aten` is `ep` converted (`_imported`): its nodes already core ATen are copied as they
        # are, torch decomposes the others (where this covers the program; else None)
        program = decompose_functional_ir(ep, aten, keep, allow_non_core=allow_non_core)
    if program is None:
        if ep is None:
            if aten is None:  # pragma: no cover - _lower_one_memo sets one of the two
                raise PartitionerError("internal error: nothing to decompose; please report")
            ep = _functional(to_exported_program(aten), retraced)
        # Node names may differ from the retrace's on a program with dynamic shapes (no .pte byte does)
        why: list[str] = []
        program = from_exported_program(
            ep, decompose=True, keep=keep, allow_non_core=allow_non_core, exact_names=False, why=why
        )
        retraced.extend(Retrace(step="decompose", reason=reason) for reason in why)
    if cache is not None and key is not None and aten is not None and not allow_non_core:
        # (only programs that passed the core-ATen check are reused, so a reuse needs no check)
        template = template_of(program, aten)
        if template is not None:
            cache.store_decomposition(key, template)
    return program


def _functional(ep: ExportedProgram, retraced: list[Retrace]) -> ExportedProgram:
    """`ep` as ExecuTorch's to_edge_transform_and_lower first makes it (`run_decompositions({})`):
    functional, tensor-subclass weights unwrapped, the composites torch does not preserve
    (contiguous, reshape) run through their kernels. The decomposition proper starts from it, as
    ExecuTorch's does: decomposing the exported program at once gives other nodes (a `contiguous`
    after an op that the decomposition makes contiguous leaves no clone), other names and other
    debug handles. Without the retrace where `texir.adapters.local_decompose` can; where it cannot,
    `retraced` receives why."""
    why: list[str] = []
    functional = functional_program(ep, why=why)
    retraced.extend(Retrace(step="functionalize", reason=reason) for reason in why)
    return functional


def _decompose_turned_down(
    method: str, program: Program, partitioners: tuple[Partitioner, ...], keep: Mapping[str, str],
    retraced: list[Retrace],
) -> tuple[Program, tuple[TurnedDown, ...]]:
    """`program` with the nodes of kept ops that a partitioner turns down (its optional
    `nodes_to_decompose(program)`, node keys) decomposed after all, as ExecuTorch does with the
    nodes its partitioners' node filters reject. One more decomposition retrace, only when there
    are such nodes."""
    if not keep:
        return program, ()
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
        if getattr(partitioner, "nodes_to_decompose", None) is None:
            continue
        names = _call_hook(method, partitioner, "nodes_to_decompose", program, tuple)
        unknown = sorted(str(n) for n in names if n not in known)
        if unknown:
            raise PartitionerError(
                f"method {method!r}: {partitioner!r}.nodes_to_decompose named {unknown[:3]}, which are not nodes "
                "of the program it was shown; name nodes by key ('name', or 'subgraph/name' in nested graphs)"
            )
        for n in names:
            if n in kept:
                turned_down.setdefault(n, describe_partitioner(partitioner))
    if not turned_down:
        return program, ()
    notes = tuple(TurnedDown(node=n, target=kept[n], partitioner=p) for n, p in sorted(turned_down.items()))
    # the partitioners' hooks converted `program` already (decompose_nodes restores what it changes)
    decomposed = decompose_nodes(exported_program_of(program), sorted(turned_down), sorted(keep))
    retraced.append(Retrace(step="decompose_turned_down", reason=f"{len(turned_down)} kept node(s) turned down"))
    return from_exported_program(decomposed), notes
