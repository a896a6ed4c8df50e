"""The lowering entry points: `to_backend` (a partitioner's plan), `lower_whole` (one backend for
the whole program) and `call_partitioner` (a partitioner's plan, its failures typed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import overload

from texir.errors import TexirError
from texir.ir import CompileSpec, LoweredBackendModule, Program
from texir.lowering.backend import lower_with_backend
from texir.lowering.delegate import _Cache, lower_plan
from texir.lowering.errors import PartitionerError
from texir.lowering.plan import Partitioner, PartitionPlan

__all__ = ["call_partitioner", "lower_whole", "to_backend"]


def lower_whole(program: Program, backend_id: str, compile_specs: Sequence[CompileSpec] = ()) -> LoweredBackendModule:
    """The whole program compiled by one backend (ExecuTorch's ``to_backend(backend_id, program,
    compile_specs)``): its LoweredBackendModule."""
    if not isinstance(program, Program):
        raise PartitionerError(
            f"lower_whole takes one texir.ir.Program, not {type(program).__name__}; lower each method"
        )
    return lower_with_backend(backend_id, program, tuple(compile_specs))


@overload
def to_backend(program: Program, partitioner: Partitioner) -> Program: ...


@overload
def to_backend(program: Mapping[str, Program], partitioner: Partitioner) -> dict[str, Program]: ...


def to_backend(
    program: Program | Mapping[str, Program], partitioner: Partitioner
) -> Program | dict[str, Program]:
    """Lower every partition of `partitioner`'s plan.

    - ``to_backend(program, partitioner)``: the new Program with delegate calls.
    - ``to_backend({"forward": p, ...}, partitioner)``: each method; identical delegates of
      different methods are compiled once and share one LoweredBackendModule object.

    The whole program to one backend is `lower_whole`.
    """
    if isinstance(partitioner, str):
        raise PartitionerError(
            f"to_backend(program, {partitioner!r}) names a backend, not a partitioner; compile the whole "
            "program with lower_whole(program, backend_id, compile_specs)"
        )
    cache: _Cache = {}
    if isinstance(program, Program):
        return lower_plan(program, call_partitioner(partitioner, program), _cache=cache)
    return {
        name: lower_plan(method, call_partitioner(partitioner, method), _cache=cache)
        for name, method in program.items()
    }


def call_partitioner(partitioner: Partitioner, program: Program) -> PartitionPlan:
    """The partitioner's plan; anything it raises comes out as a PartitionerError naming it, with
    the original exception as the cause."""
    name = _describe(partitioner)
    try:
        plan = partitioner(program)
    except PartitionerError as exc:
        raise PartitionerError(f"partitioner {name}: {exc}") from exc
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


def _describe(partitioner: object) -> str:
    """A partitioner as an error names it: its class repr, or a function's module-qualified name."""
    qualname = getattr(partitioner, "__qualname__", None)
    if qualname is not None and not isinstance(partitioner, type):
        return f"{getattr(partitioner, '__module__', '?')}.{qualname}"
    return repr(partitioner)
