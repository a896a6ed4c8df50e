"""`emit`: IR Programs (one per method) to a `.pte` program; `lowered_module_buffer`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from texir.edge import to_emittable
from texir.ir.types import (
    DTYPE_ITEMSIZE,
    BufferInput,
    BufferMutation,
    ConstantMethod,
    Placeholder,
    Program,
    TensorMeta,
)
from texir.lowering.lowered_modules import delegate_wrapper_program
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
    EmitArgumentError,
    EmitError,
    EmitOptions,
    ProgramState,
)
from texir.emit.debug import Emitted
from texir.emit.memory_plan import align_up
from texir.emit.method import MethodEmitter
from texir.emit.plan_assembly import constant_method_plan


def emit(
    program: Program | Mapping[str, Program],
    options: EmitOptions | None = None,
    *,
    constant_methods: Mapping[str, ConstantMethod] | None = None,
) -> PteProgram:
    """Emit one Program (method "forward") or several (method name -> Program) as a `.pte` program:
    `emit_with_debug(...).program`; see there."""
    return emit_with_debug(program, options, constant_methods=constant_methods).program


def emit_with_debug(
    program: Program | Mapping[str, Program],
    options: EmitOptions | None = None,
    *,
    constant_methods: Mapping[str, ConstantMethod] | None = None,
) -> Emitted:
    """Emit one Program (method "forward") or several (method name -> Program) as a `.pte` program.

    Pure: the input is not modified. Constant payloads and delegate blobs are Blob views of the
    program's own data (never copied), deduplicated by content hash; methods are sorted by name.
    `constant_methods` (from `texir.adapters.constant_methods`) follow them in the mapping's order,
    as ExecuTorch writes `to_edge(..., constant_methods=...)`. Also returns each method's debug
    maps (`Emitted.debug`), as ExecuTorch's `ExecutorchProgramManager` reports them.
    """
    options = options or EmitOptions()
    if not isinstance(program, Program | Mapping):
        inner = getattr(program, "program", None)
        if isinstance(inner, Program | Mapping):  # texir.lower's result (Lowered) holds the program
            raise EmitArgumentError(
                f"emit() takes the lowered Program, not the {type(program).__name__} result around it; "
                "write emit(lowered.program)"
            )
        raise EmitArgumentError(
            f"emit() takes a texir.ir.Program or a mapping of method name -> Program, not {type(program).__name__}"
        )
    methods = {"forward": program} if isinstance(program, Program) else dict(program)
    if not methods:
        raise EmitError("no methods to emit; pass a Program or a non-empty mapping of name -> Program")
    state = ProgramState()
    edge: dict[str, Program] = {}
    for name, method in methods.items():
        if not isinstance(method, Program):
            raise EmitError(f"method {name!r} is a {type(method).__name__}, not a texir.ir.Program")
        edge[name] = to_emittable(method, remove_view_copy=options.remove_view_copy)
    if options.share_mutable_buffers:
        state.shared, state.shared_size = shared_state_layout(edge, options.alignment)
    plans = []
    debug = []
    for name in sorted(methods):
        emitter = MethodEmitter(name, edge[name], state, options)
        plans.append(emitter.emit_method())
        debug.append(emitter.debug())
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
    return Emitted(
        program=PteProgram(program=root, named_data=tuple(named), mutable_data=mutable, external=external),
        debug=tuple(debug),
    )


def shared_state_layout(methods: Mapping[str, Program], alignment: int) -> tuple[dict[str, int], int]:
    """Offsets in the shared-state arena of every buffer some method mutates, by fully qualified
    name, in order of first mutation (methods in the order given, placeholders in graph order),
    each rounded up to `alignment`; and the arena's size."""
    offsets: dict[str, int] = {}
    size = 0
    for name, program in methods.items():
        mutated = {s.target for s in program.signature.outputs if isinstance(s, BufferMutation)}
        placeholders = [n for n in program.graph.nodes if isinstance(n, Placeholder)]
        for node, spec in zip(placeholders, program.signature.inputs):
            if not isinstance(spec, BufferInput) or spec.target not in mutated or spec.target in offsets:
                continue
            meta = program.graph.meta(node)
            if not isinstance(meta, TensorMeta) or any(isinstance(d, str) for d in meta.shape):
                raise EmitError(
                    f"method {name!r}: shared mutable buffer {spec.target!r} needs a static tensor shape"
                )
            offsets[spec.target] = size
            size += align_up(math.prod(int(d) for d in meta.shape) * DTYPE_ITEMSIZE[meta.dtype], alignment)
    return offsets, size


def lowered_module_buffer(
    name: str,
    module: LoweredBackendModule,
    options: PteOptions | None = None,
    emit_options: EmitOptions | None = None,
) -> bytes:
    """The `.pte` bytes of a lowered module's wrapper program (inputs -> one delegate call ->
    outputs), the counterpart of ExecuTorch's `LoweredBackendModule.buffer()`."""
    return dumps(emit(delegate_wrapper_program(name, module), emit_options), options)
