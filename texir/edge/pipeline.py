"""The edge passes as named stages, and the runner that applies them.

A stage is a tuple of `NamedPass`es, each naming the ExecuTorch pass it mirrors. `run_stage` applies
one in order: a pass that raises becomes a `PassError` naming it, and with `TEXIR_VERIFY=1` (the test
suite sets it) `texir.ir.verify` runs after every pass, so a pass that leaves an invalid program is
named too. A program records the stage it reached in its `dialect`:

- `ATEN` (or `TRAINING`): as converted from torch.export; no edge pass applied.
- `EDGE_PARTITIONABLE`: ExecuTorch's to_edge rewrites applied (`TO_EDGE`, what `texir.orchestrate.lower`
  runs before partitioning); partitioners see this form.
- `EDGE`: the to_executorch rewrites applied too (`TO_EXECUTORCH`); what the emitter maps to a `.pte`.

`to_emittable` runs only what a program still misses, so the emitter never reruns the to_edge
rewrites on a lowered program.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Final

import msgspec

from texir.edge._rewrite import EdgeError
from texir.edge.debug_handles import compact_debug_handles
from texir.edge.dim_order import to_dim_order_ops
from texir.edge.empty_tensors import prune_empty_tensors
from texir.edge.graph_asserts import remove_graph_asserts
from texir.edge.mixed_dtype import cast_mixed_operands, cast_mixed_operands_aten, inline_mixed_scalars
from texir.edge.names import edge_node_names
from texir.edge.noop import remove_noop_ops
from texir.edge.scalar_tensor import lift_scalar_operands
from texir.edge.sym_to_tensor import sym_operands_to_tensors
from texir.edge.view_copy import normalize_view_copy_bases, replace_view_copies_with_views, replace_view_ops
from texir.edge.write_back import insert_write_back
from texir.edge.zero_dim import reduce_zero_dim_sums
from texir.ir.types import Dialect, Program
from texir.ir.verify import verify

__all__ = [
    "ATEN_DIALECTS",
    "DialectError",
    "EDGE_DIALECT",
    "EMIT_TO_EDGE",
    "NamedPass",
    "PARTITIONABLE_DIALECT",
    "PassError",
    "Stage",
    "TO_EDGE",
    "TO_EDGE_SKIP_DIM_ORDER",
    "TO_EXECUTORCH",
    "TO_EXECUTORCH_KEEP_VIEW_COPY",
    "VERIFY_ENV",
    "run_stage",
    "to_edge_stage",
    "to_emittable",
    "to_partitionable",
    "verify_enabled",
]

ATEN_DIALECTS: Final[frozenset[Dialect]] = frozenset({"ATEN", "TRAINING"})
PARTITIONABLE_DIALECT: Final[Dialect] = "EDGE_PARTITIONABLE"
EDGE_DIALECT: Final[Dialect] = "EDGE"
VERIFY_ENV = "TEXIR_VERIFY"


class PassError(EdgeError):
    """An edge pass failed, or (with TEXIR_VERIFY=1) left a program `texir.ir.verify` rejects."""

    def __init__(self, message: str, *, pass_name: str) -> None:
        super().__init__(message)
        self.pass_name = pass_name


class DialectError(EdgeError):
    """A program is not in a dialect the caller takes."""


class NamedPass(msgspec.Struct, frozen=True):
    """One pure `Program -> Program` rewrite, named, with the ExecuTorch pass it mirrors."""

    name: str
    fn: Callable[[Program], Program]
    mirrors: str


Stage = tuple[NamedPass, ...]

_ASSERTS = NamedPass("remove_graph_asserts", remove_graph_asserts, "RemoveGraphAssertsPass")
_LIFT = NamedPass("lift_scalar_operands", lift_scalar_operands, "ScalarToTensorPass + lift_constant_tensor_pass")
_SYM = NamedPass("sym_operands_to_tensors", sym_operands_to_tensors, "SymToTensorPass")
_MIXED = NamedPass("cast_mixed_operands", cast_mixed_operands, "RemoveMixedTypeOperators")
_MIXED_ATEN = NamedPass("cast_mixed_operands_aten", cast_mixed_operands_aten, "RemoveMixedTypeOperators")
_NOOP = NamedPass("remove_noop_ops", remove_noop_ops, "RemoveNoopPass")
_EMPTY = NamedPass("prune_empty_tensors", prune_empty_tensors, "PruneEmptyTensorsPass")
_VIEWS = NamedPass("replace_view_ops", replace_view_ops, "ReplaceViewOpsWithViewCopyOps")
_DIM_ORDER = NamedPass("to_dim_order_ops", to_dim_order_ops, "MemoryFormatOpsPass")
_HANDLES = NamedPass("compact_debug_handles", compact_debug_handles, "DebugHandleGeneratorPass")
_NAMES = NamedPass("edge_node_names", edge_node_names, "ExportPass retrace (edge node names)")

TO_EDGE: Stage = (_ASSERTS, _LIFT, _SYM, _MIXED, _NOOP, _EMPTY, _VIEWS, _DIM_ORDER, _HANDLES, _NAMES)
"""ExecuTorch's to_edge rewrites, run before partitioning (`texir.orchestrate.lower`): partitioners see
literals in Tensor positions as constants, and nodes named as in ExecuTorch ('aten_addmm_default'),
so backends that print names into their blobs agree. As in ExecuTorch's to_edge, a SymInt in a Tensor
position (`buffer.add_(x.shape[0])`) becomes an `aten::scalar_tensor` before the mixed-dtype casts,
so the partitioners' edge program passes ExecuTorch's edge verifier. Leaves `EDGE_PARTITIONABLE`."""

TO_EDGE_SKIP_DIM_ORDER: Stage = tuple(_MIXED_ATEN if p is _MIXED else p for p in TO_EDGE if p is not _DIM_ORDER)
"""`TO_EDGE` as ExecuTorch runs it with `EdgeCompileConfig(_skip_dim_order=True)`: no
MemoryFormatOpsPass, so `_to_copy`, `clone` and `empty.memory_format` stay ATen ops (memory format
and all) and the mixed-dtype casts are ATen `_to_copy`s, as RemoveMixedTypeOperators writes them.
(ExecuTorch's to_executorch then also leaves out LegalizePortableDimOrderPass, which texir does not
run in either form.)"""

EMIT_TO_EDGE: Stage = tuple(p for p in TO_EDGE if p not in (_LIFT, _NAMES))
"""`TO_EDGE` as plain `emit` runs it on an ATen program: scalars stay literals (the emitter makes
them 0-dim constants at their point of use, which keeps the value table's order) and nodes keep
their names (no partitioner reads them)."""

TO_EXECUTORCH: Stage = (
    NamedPass(
        "inline_mixed_scalars", inline_mixed_scalars,
        "ScalarToTensorPass + RemoveMixedTypeOperators (run in to_edge) for the literals left",
    ),
    NamedPass("insert_write_back", insert_write_back, "insert_write_back_for_buffers_pass"),
    NamedPass(
        "normalize_view_copy_bases", normalize_view_copy_bases,
        "NormalizeViewCopyBasePass + dead_code_elimination_pass",
    ),
    NamedPass("reduce_zero_dim_sums", reduce_zero_dim_sums, "none: the portable sum kernel aborts on a 0-dim tensor's dim"),
    NamedPass("replace_view_copies_with_views", replace_view_copies_with_views, "ReplaceViewCopyWithViewPass"),
)
"""ExecuTorch's to_executorch rewrites, run after partitioning (at emission), and texir's one guard
against a portable kernel that aborts (`texir.edge.zero_dim`). Leaves `EDGE`. First, the scalars in
Tensor positions of add/sub/mul/div/minimum that no lift reached (plain `emit` of an ATen program;
nested graphs) become `texir::inline_constant`s cast to the result's dtype: ExecuTorch does this in
to_edge, texir after partitioning, so partitioners and the debug-handle numbering (both in to_edge)
never meet a texir-only node. The views come last,
so any reshape an earlier pass writes is a candidate too; `texir::memory_view` is read by the emitter
only (no ExportedProgram is built from an `EDGE` program)."""

_VIEW_PASSES = frozenset({"normalize_view_copy_bases", "replace_view_copies_with_views"})

TO_EXECUTORCH_KEEP_VIEW_COPY: Stage = tuple(p for p in TO_EXECUTORCH if p.name not in _VIEW_PASSES)
"""`TO_EXECUTORCH` as ExecuTorch runs it with `ExecutorchBackendConfig(remove_view_copy=False)`: no
NormalizeViewCopyBasePass, dead-code elimination or ReplaceViewCopyWithViewPass, so every
`view_copy` stays a copy kernel (`EmitOptions(remove_view_copy=False)`)."""


def verify_enabled() -> bool:
    """Whether TEXIR_VERIFY asks for `texir.ir.verify` after every pass."""
    return os.environ.get(VERIFY_ENV, "") not in ("", "0")


def run_stage(program: Program, stage: Stage, *, check: bool | None = None) -> Program:
    """`program` with the passes of `stage` applied in order. `check` (default: TEXIR_VERIFY=1, read
    once here) verifies the input and the program after every pass. An invalid input raises the
    verifier's `IRError`; any later failure is a `PassError` naming the pass."""
    if check is None:
        check = verify_enabled()
    if check:
        verify(program)  # an invalid input is the caller's error (IRError naming the field), not a pass's
    for named in stage:
        try:
            program = named.fn(program)
        except Exception as exc:  # a pass's failure of any kind is reported under the pass's name
            raise PassError(
                f"edge pass {named.name} (ExecuTorch's {named.mirrors}) failed: {type(exc).__name__}: {exc}",
                pass_name=named.name,
            ) from exc
        if check:
            try:
                verify(program)
            except Exception as exc:
                raise PassError(
                    f"edge pass {named.name} (ExecuTorch's {named.mirrors}) left an invalid program: {exc}; "
                    "this is a texir bug, please report it",
                    pass_name=named.name,
                ) from exc
    return program


def to_edge_stage(*, skip_dim_order: bool = False) -> Stage:
    """The to_edge rewrites `lower` runs: `TO_EDGE`, or `TO_EDGE_SKIP_DIM_ORDER` for ExecuTorch's
    `EdgeCompileConfig(_skip_dim_order=True)`."""
    return TO_EDGE_SKIP_DIM_ORDER if skip_dim_order else TO_EDGE


def to_partitionable(program: Program, *, check: bool | None = None, skip_dim_order: bool = False) -> Program:
    """An ATen `program` with the to_edge rewrites applied (`to_edge_stage(skip_dim_order=...)`),
    marked `EDGE_PARTITIONABLE`."""
    _require(program, ATEN_DIALECTS, "texir.edge.pipeline.to_partitionable")
    stage = to_edge_stage(skip_dim_order=skip_dim_order)
    return msgspec.structs.replace(run_stage(program, stage, check=check), dialect=PARTITIONABLE_DIALECT)


def to_emittable(program: Program, *, check: bool | None = None, remove_view_copy: bool = True) -> Program:
    """`program` in the `EDGE` dialect the emitter maps, running only the stages it still misses: an
    `EDGE` program is returned as it is; an `EDGE_PARTITIONABLE` one gets `TO_EXECUTORCH`; an ATen
    one `EMIT_TO_EDGE` then `TO_EXECUTORCH`. `remove_view_copy=False` runs
    `TO_EXECUTORCH_KEEP_VIEW_COPY` instead (ExecuTorch's option of that name)."""
    if program.dialect == EDGE_DIALECT:
        return program
    if program.dialect != PARTITIONABLE_DIALECT:
        _require(program, ATEN_DIALECTS, "texir.emit")
        program = run_stage(program, EMIT_TO_EDGE, check=check)
    stage = TO_EXECUTORCH if remove_view_copy else TO_EXECUTORCH_KEEP_VIEW_COPY
    return msgspec.structs.replace(run_stage(program, stage, check=check), dialect=EDGE_DIALECT)


def _require(program: Program, dialects: frozenset[Dialect], who: str) -> None:
    if program.dialect not in dialects:
        raise DialectError(
            f"{who} takes a program in dialect {' or '.join(sorted(dialects))}, not {program.dialect!r}: "
            "convert an ExportedProgram with texir.adapters.from_exported_program (ATEN), lower it with "
            f"texir.orchestrate.lower ({PARTITIONABLE_DIALECT}), and emit either (emit completes it to {EDGE_DIALECT})"
        )
