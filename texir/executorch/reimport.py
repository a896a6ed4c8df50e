"""Programs that already hold ExecuTorch's work, imported as texir IR: edge-dialect operators
(`EdgeOpOverload`) as the ATen operators they wrap, ExecuTorch's `executorch_call_delegate` as
texir's delegate call, and each ExecuTorch `LoweredBackendModule` as texir's lowered module with
the same backend id, blob, compile specs, debug handle map and named data (so emission writes the
same delegate bytes). Registered with the importer (`texir.adapters.foreign`) when this module is
imported; nothing here imports executorch: the objects it reads are ExecuTorch's already."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import msgspec
import torch
from torch.export import ExportedProgram

from texir.adapters.foreign import register_lowered_importer, register_target_namer
from texir.adapters.fx_import import from_exported_program
from texir.adapters.targets import canonical_target
from texir.edge.pipeline import PARTITIONABLE_DIALECT
from texir.executorch.backend import compile_spec_from_executorch, delegate_info_from_executorch, named_data_entries
from texir.ir import DebugHandleEntry, LoweredBackendModule, Program
from texir.ir.names import CALL_DELEGATE

__all__ = ["from_executorch_lowered", "import_executorch_program"]

_EXECUTORCH_DIALECT = "EDGE"
"""What ExecuTorch's edge programs say in `ExportedProgram.dialect`: the form texir calls
`EDGE_PARTITIONABLE` (after to_edge, before to_executorch's passes)."""


def _executorch_call_delegate() -> Any:
    return getattr(torch.ops.higher_order, "executorch_call_delegate", None)


def _name_target(target: Any) -> str | None:
    """ExecuTorch's edge operators as the operator they wrap; its delegate call as texir's."""
    edge_ops = sys.modules.get("executorch.exir.dialects.edge._ops")
    if edge_ops is not None and isinstance(target, edge_ops.EdgeOpOverload):
        return canonical_target(target._op)
    if target is _executorch_call_delegate():
        return CALL_DELEGATE
    return None


def _lowered_class() -> type | None:
    module = sys.modules.get("executorch.exir.lowered_backend_module")
    return None if module is None else getattr(module, "LoweredBackendModule", None)


def import_executorch_program(ep: ExportedProgram) -> Program:
    """`ep` (ATen or ExecuTorch edge dialect, possibly holding ExecuTorch delegates) as texir IR; an
    edge program comes back in texir's `EDGE_PARTITIONABLE` dialect, the form it is in."""
    program = from_exported_program(ep)
    if program.dialect == _EXECUTORCH_DIALECT:
        program = msgspec.structs.replace(program, dialect=PARTITIONABLE_DIALECT)
    return program


def _debug_handle_map(meta: Any) -> tuple[DebugHandleEntry, ...] | None:
    raw = meta.get("debug_handle_map") if isinstance(meta, dict) else None
    if not raw:
        return None
    return tuple(
        DebugHandleEntry(identifier=key, debug_handles=tuple(int(h) for h in handles))
        for key, handles in raw.items()
    )


def from_executorch_lowered(
    value: Any, import_program: Callable[[ExportedProgram], Program] = import_executorch_program
) -> LoweredBackendModule | None:
    """ExecuTorch's `LoweredBackendModule` `value` as texir's lowered module, or None when `value`
    is not one. Its original program is imported with `import_program` (nested delegates too)."""
    cls = _lowered_class()
    if cls is None or not isinstance(value, cls):
        return None
    module: Any = value  # ExecuTorch's class is untyped
    backend_id = str(module.backend_id)
    original = import_program(module.original_module)
    if original.dialect == _EXECUTORCH_DIALECT:
        original = msgspec.structs.replace(original, dialect=PARTITIONABLE_DIALECT)
    return LoweredBackendModule(
        backend_id=backend_id,
        processed_bytes=bytes(module.processed_bytes),
        compile_specs=tuple(compile_spec_from_executorch(f"lowered module of backend {backend_id!r}", s) for s in module.compile_specs),
        original_program=original,
        debug_handle_map=_debug_handle_map(getattr(module, "meta", None)),
        named_data=named_data_entries(backend_id, module.named_data_store_output),
        delegate_info=delegate_info_from_executorch(
            f"lowered module of backend {backend_id!r} (meta['_delegate_info_meta'])",
            (getattr(module, "meta", None) or {}).get("_delegate_info_meta"),
        ),
    )


register_target_namer(_name_target)
register_lowered_importer(from_executorch_lowered)
