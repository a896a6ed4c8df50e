"""ETRecord files for texir programs, so ExecuTorch's devtools `Inspector` maps the ETDump events of
a texir `.pte` back to texir's nodes and to the delegates' debug identifiers.

An ETRecord is a zip holding the edge program (as ExecuTorch's serde writes an ExportedProgram, each
node with its `debug_handle`) and the emitter's debug maps. texir writes it with ExecuTorch's own
`ETRecord` class. The program is, as in ExecuTorch, the edge program before partitioning
(`texir.lower` returns it as `Lowered.edge`), with edge operators; the maps are
`texir.emit.emit_with_debug`'s. Given the lowered program instead, each lowered module is swapped for
an ExecuTorch `LoweredBackendModule` over its sub-program (ExecuTorch's serde only knows its own):
the Inspector still attributes every event to its handles, but names no ops inside delegates.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from texir.adapters.delegate_op import LoweredBackendModule as TexirLowered
from texir.adapters.delegate_op import texir_call_delegate
from texir.adapters.fx_export import to_exported_program
from texir.errors import TexirError, UnsupportedError
from texir.executorch.deps import require_executorch
from texir.executorch.edge_program import executorch_edge_target, to_edge_exported_program
from texir.ir.types import Program

__all__ = ["DebugMaps", "EtrecordError", "write_etrecord"]


class EtrecordError(TexirError):
    """The ETRecord cannot be written for this program and emitter output."""


class DebugMaps(Protocol):
    """What `texir.emit.emit_with_debug` returns (`Emitted`); emit sits above this bridge, so the
    bridge names only the maps it reads."""

    def debug_handle_map(self) -> dict[str, dict[int, int | list[int]]]: ...

    def delegate_map(self) -> dict[str, dict[int, dict[str, object]]]: ...

    def instruction_id_to_num_outs_map(self) -> dict[str, dict[int, int]]: ...


def write_etrecord(
    path: str | os.PathLike[str], program: Program | Mapping[str, Program], emitted: DebugMaps
) -> None:
    """Write the ETRecord of `program` (the edge program before partitioning, as `texir.lower`
    returns it, or the emitted Program itself; or a mapping method name -> one) and `emitted` (what
    `emit_with_debug` returned) to `path`, atomically. Needs the `executorch` extra."""
    require_executorch("writing an ETRecord")
    from executorch.devtools.etrecord._etrecord import ETRecord  # executorch is an optional extra: imported on use

    methods = {"forward": program} if isinstance(program, Program) else dict(program)
    handles = emitted.debug_handle_map()
    debug_names = sorted(handles)
    if sorted(methods) != debug_names:
        raise EtrecordError(
            f"the emitter output has methods {debug_names} but the program has {sorted(methods)}; pass the "
            "Program (or mapping) that emit_with_debug was given"
        )
    edge = {name: _exported(name, methods[name]) for name in sorted(methods)}
    record = ETRecord(
        edge_dialect_program=edge["forward"] if list(edge) == ["forward"] else edge,
        _debug_handle_map=handles,
        _delegate_map=emitted.delegate_map(),
        _instruction_id_to_num_outs_map=emitted.instruction_id_to_num_outs_map(),
    )
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    try:
        record.save(str(tmp))
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):  # (on a read-only file system even this fails: the cause matters)
            tmp.unlink(missing_ok=True)
        if not isinstance(exc, Exception):
            raise
        if isinstance(exc, OSError):
            raise EtrecordError(f"cannot write {target}: {exc.strerror or exc}") from exc
        raise EtrecordError(f"ExecuTorch's ETRecord could not save method(s) {list(edge)}: {exc}") from exc


def _exported(name: str, program: Program) -> Any:
    """`program` as an ExportedProgram whose delegate calls are ExecuTorch's, over ExecuTorch
    lowered modules (their `original_module` the delegated sub-program, handles included)."""
    # executorch is an optional extra: imported on use
    from executorch.exir.backend.compile_spec_schema import CompileSpec
    from executorch.exir.delegate import executorch_call_delegate
    from executorch.exir.lowered_backend_module import LoweredBackendModule

    if not program.lowered_modules:
        return to_edge_exported_program(program)
    ep = to_exported_program(program)
    gm = ep.graph_module
    for node in gm.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            try:
                node.target = executorch_edge_target(node.target)  # the Inspector names ops as the edge dialect does
            except UnsupportedError:
                pass
        if node.op != "call_function" or node.target is not texir_call_delegate:
            continue
        attr = node.args[0]
        ours = getattr(gm, str(attr.target), None)
        if not isinstance(ours, TexirLowered):
            raise EtrecordError(f"method {name!r}, node {node.name!r}: {attr.target!r} is not a lowered module")
        module = ours.texir_module
        theirs = LoweredBackendModule(
            edge_program=to_exported_program(module.original_program),
            backend_id=module.backend_id,
            processed_bytes=module.processed_bytes,
            compile_specs=[CompileSpec(c.key, c.value) for c in module.compile_specs],
        )
        setattr(gm, str(attr.target), theirs)
        node.target = executorch_call_delegate
    gm.recompile()
    return ep
