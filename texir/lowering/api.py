"""`to_backend`, ExecuTorch's three seed forms over texir programs, and `call_partitioner` (a
partitioner's plan, its failures typed). `texir.lower` is the one lowering entry point; this is the
thin layer for code written against ExecuTorch's `to_backend`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import overload

from texir.errors import TexirError
from texir.ir import CompileSpec, LoweredBackendModule, Program
from texir.lowering.delegate import SharedModules, apply_plan
from texir.lowering.errors import PartitionerArgumentError, PartitionerError
from texir.lowering.plan import Partitioner, PartitionPlan
from texir.lowering.preprocess import PreprocessRequest, run_preprocess

__all__ = ["call_partitioner", "describe_partitioner", "to_backend"]


@overload
def to_backend(program: Program, partitioner: Partitioner, /) -> Program: ...


@overload
def to_backend(program: Mapping[str, Program], partitioner: Partitioner, /) -> dict[str, Program]: ...


@overload
def to_backend(
    backend_id: str, program: Program, compile_specs: Sequence[CompileSpec] = (), /
) -> LoweredBackendModule: ...


def to_backend(
    first: str | Program | Mapping[str, Program],
    second: Partitioner | Program,
    compile_specs: Sequence[CompileSpec] = (),
    /,
) -> Program | dict[str, Program] | LoweredBackendModule:
    """ExecuTorch's `to_backend`, in its three forms:

    - ``to_backend(program, partitioner)``: every partition of `partitioner`'s plan lowered; the
      new Program with delegate calls.
    - ``to_backend({"forward": p, ...}, partitioner)``: each method; identical delegates of
      different methods are compiled once and share one LoweredBackendModule object.
    - ``to_backend(backend_id, program, compile_specs)``: the whole program compiled by one
      backend; its LoweredBackendModule.

    No decomposition, no to_edge rewrites, no cache: `texir.lower` does all of that."""
    if isinstance(first, str):
        if not isinstance(second, Program):
            raise PartitionerError(
                f"to_backend({first!r}, ...) compiles one texir.ir.Program with that backend, not "
                f"{type(second).__name__}; lower each method"
            )
        request = PreprocessRequest(first, second, tuple(compile_specs))
        return run_preprocess([request])[0]
    if compile_specs:
        raise PartitionerError("to_backend(program, partitioner) takes no compile specs; the partitioner's plan names them")
    if isinstance(second, (str, Program)):
        raise PartitionerError(
            f"to_backend(program, {second!r}) is given a {type(second).__name__} where a partitioner goes; compile "
            "the whole program with to_backend(backend_id, program, compile_specs)"
        )
    if isinstance(second, list | tuple):
        raise PartitionerArgumentError(
            f"to_backend(program, partitioner) takes one partitioner, not a {type(second).__name__}; "
            "lower(program, [p1, p2]) runs several in turn"
        )
    shared: SharedModules = {}
    if isinstance(first, Program):
        return apply_plan(first, call_partitioner(second, first), shared=shared).program
    return {
        name: apply_plan(method, call_partitioner(second, method), shared=shared, numbering="fused").program
        for name, method in first.items()
    }


def call_partitioner(partitioner: Partitioner, program: Program) -> PartitionPlan:
    """The partitioner's plan; anything it raises comes out as a PartitionerError naming it, with
    the original exception as the cause."""
    name = describe_partitioner(partitioner)
    try:
        plan = partitioner(program)
    except PartitionerError as exc:
        # Same class, named: a subclass is also a builtin exception some callers catch
        # (ExecuTorch's asserts: texir.executorch's PartitionerModifiedGraphError is an AssertionError).
        raise type(exc)(f"partitioner {name}: {exc}") from exc
    except TexirError:
        raise
    except Exception as exc:
        raise PartitionerError(
            f"partitioner {name} raised {type(exc).__name__}: {exc}; the cause is attached "
            "(fix the partitioner, or return a texir.lowering.PartitionPlan)"
        ) from exc
    if not isinstance(plan, PartitionPlan):
        raise PartitionerError(
            f"partitioner {name} returned {type(plan).__name__}; return a texir.lowering.PartitionPlan"
        )
    return plan


def describe_partitioner(partitioner: object) -> str:
    """A partitioner as errors and reports name it (`DelegateReport.partitioner`): its repr, or a
    function's module-qualified name."""
    qualname = getattr(partitioner, "__qualname__", None)
    if qualname is not None and not isinstance(partitioner, type):
        return f"{getattr(partitioner, '__module__', '?')}.{qualname}"
    return repr(partitioner)
