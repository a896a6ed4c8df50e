"""`emit`: IR Programs (one per method) to a `.pte` program; `lowered_module_buffer`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from texir.edge import to_edge_program
from texir.ir.types import (
    ConstantMethod,
    Program,
)
from texir.lowering.lowered import delegate_wrapper_program
from texir.serialize.pte.codec import PteOptions, dumps
from texir.serialize.pte.schema import (
    BackendDelegateInlineData,
    Buffer,
    NamedBlob,
    PtdEntry,
    PtdFile,
    PteProgram,
)
from texir.serialize.pte.schema import Program as PteRoot

if TYPE_CHECKING:
    from texir.ir.types import LoweredBackendModule
from texir.emit.common import (
    EmitError,
    EmitOptions,
    ProgramState,
)
from texir.emit.method import MethodEmitter
from texir.emit.values import constant_method_plan


def emit(
    program: Program | Mapping[str, Program],
    options: EmitOptions | None = None,
    *,
    constant_methods: Mapping[str, ConstantMethod] | None = None,
) -> PteProgram:
    """Emit one Program (method "forward") or several (method name -> Program) as a `.pte` program.

    Pure: the input is not modified. Constant payloads and delegate blobs are Blob views of the
    program's own data (never copied), deduplicated by content hash; methods are sorted by name.
    `constant_methods` (from `texir.adapters.constant_methods`) follow them in the mapping's order,
    as ExecuTorch writes `to_edge(..., constant_methods=...)`.
    """
    options = options or EmitOptions()
    methods = {"forward": program} if isinstance(program, Program) else dict(program)
    if not methods:
        raise EmitError("no methods to emit; pass a Program or a non-empty mapping of name -> Program")
    state = ProgramState()
    plans = []
    for name in sorted(methods):
        method = methods[name]
        if not isinstance(method, Program):
            raise EmitError(f"method {name!r} is a {type(method).__name__}, not a texir.ir.Program")
        plans.append(MethodEmitter(name, to_edge_program(method), state, options).emit_method())
    for name, getter in (constant_methods or {}).items():
        if name in methods:
            raise EmitError(f"constant method {name!r} has the name of a program method; rename one of them")
        if not isinstance(getter, ConstantMethod):
            raise EmitError(
                f"constant method {name!r} is a {type(getter).__name__}; build it with "
                "texir.adapters.constant_methods({name: value})"
            )
        plans.append(constant_method_plan(name, getter, state))
    root = PteRoot(
        execution_plan=tuple(plans),
        constant_buffer=tuple(Buffer(storage=blob) for blob in state.constants),
        backend_delegate_data=tuple(BackendDelegateInlineData(data=blob) for blob in state.delegate_data),
    )
    named: list[NamedBlob] = []
    for key, (entry, owner) in state.named.items():
        if entry.data is None:
            continue
        if options.external_named_data is None:
            named.append(NamedBlob(key=key, data=entry.data, alignment=entry.alignment))
        else:
            state.external_entry(
                options.external_named_data, PtdEntry(key=key, data=entry.data, alignment=entry.alignment),
                owner, entry.sha256,
            )
    external = tuple(
        PtdFile(tag=tag, entries=tuple(entry for entry, _ in entries.values()))
        for tag, entries in sorted(state.external.items())
    )
    mutable = tuple(Buffer(storage=blob) for blob in state.mutable) if len(state.mutable) > 1 else ()
    return PteProgram(program=root, named_data=tuple(named), mutable_data=mutable, external=external)


def lowered_module_buffer(
    name: str,
    module: LoweredBackendModule,
    options: PteOptions | None = None,
    emit_options: EmitOptions | None = None,
) -> bytes:
    """The `.pte` bytes of a lowered module's wrapper program (inputs -> one delegate call ->
    outputs), the counterpart of ExecuTorch's `LoweredBackendModule.buffer()`."""
    return dumps(emit(delegate_wrapper_program(name, module), emit_options), options)
