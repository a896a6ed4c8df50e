"""The `.pte` layer: schema structs mirroring program.fbs, the codec and (separately) the emitter."""

from __future__ import annotations

from texir.serialize.pte.codec import (
    PteDecodeError,
    PteEncodeError,
    PteOptions,
    dump,
    dumps,
    iter_chunks,
    load,
    loads,
    read_pte,
    tensor_nbytes,
    to_logical,
)
from texir.serialize.pte.emit import EmitError, EmitOptions, emit, lowered_module_buffer
from texir.serialize.pte.memory_plan import MemoryPlanError, check_plan, plan_memory
from texir.serialize.pte.schema import *  # noqa: F403
from texir.serialize.pte.schema import __all__ as _schema_all

__all__ = [
    *_schema_all,
    "EmitError",
    "EmitOptions",
    "MemoryPlanError",
    "check_plan",
    "emit",
    "lowered_module_buffer",
    "plan_memory",
    "PteDecodeError",
    "PteEncodeError",
    "PteOptions",
    "dump",
    "dumps",
    "iter_chunks",
    "load",
    "loads",
    "read_pte",
    "tensor_nbytes",
    "to_logical",
]
