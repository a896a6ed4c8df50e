"""IR program -> `.pte` program: the edge form mapped to the schema (memory planning, out
variants, constants, delegates). Sits above lowering: it can emit a lowered module's wrapper."""

from __future__ import annotations

from texir.emit.common import DEFAULT_EXTERNAL_TAG, EmitArgumentError, EmitError, EmitOptions
from texir.emit.debug import DelegateDebug, Emitted, MethodDebug
from texir.emit.program import emit, emit_with_debug, lowered_module_buffer
from texir.emit.memory_plan import (
    Interval,
    MemoryPlan,
    MemoryPlanError,
    check_plan,
    plan_memory,
)

__all__ = [
    "DEFAULT_EXTERNAL_TAG",
    "DelegateDebug",
    "Emitted",
    "EmitArgumentError",
    "EmitError",
    "EmitOptions",
    "Interval",
    "MemoryPlan",
    "MemoryPlanError",
    "MethodDebug",
    "check_plan",
    "emit",
    "emit_with_debug",
    "lowered_module_buffer",
    "plan_memory",
]
