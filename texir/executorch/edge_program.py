"""IR program -> the edge-dialect ExportedProgram ExecuTorch's partitioners and backends read."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export import graph_signature as gs
from torch.utils import _pytree as pytree

from texir.adapters import delegate_op
from texir.adapters.decompositions import graph_modules
from texir.executorch.deps import require_executorch
from texir.adapters.fx_export import rebuilt_exported, to_exported_program
from texir.adapters.targets import canonical_target
from texir.edge import DIM_ORDER_OPS
from texir.errors import UnsupportedError
from texir.ir import LoweredBackendModule, NamedDataEntry, Program

__all__ = [
    "edge_target",
    "executorch_edge_target",
    "executorch_lowered_module",
    "graph_modules",
    "named_data_store_output",
    "to_edge_exported_program",
    "to_executorch_exported_program",
]

def edge_target(op: torch._ops.OpOverload) -> Any:
    """ExecuTorch's edge operator for an ATen (or other namespace) operator overload."""
    # executorch is an optional extra: imported on use
    from executorch.exir.dialects._ops import ops as exir_ops

    canonical = canonical_target(op)
    if canonical is None:
        raise UnsupportedError(f"{op!r} has no ExecuTorch edge operator")
    namespace, _, rest = canonical.partition("::")
    name, _, overload = rest.partition(".")
    return getattr(getattr(getattr(exir_ops.edge, namespace), name), overload or "default")


def executorch_edge_target(op: torch._ops.OpOverload) -> Any:
    """The target ExecuTorch's edge programs hold for `op`: its edge operator, or `op` itself for
    the operators to_edge leaves as ATen ones (symbolic sizes, scalar_tensor, asserts: ExecuTorch's
    own `should_lower_to_edge`; partitioners such as Vulkan's match them as ATen operators)."""
    # executorch is an optional extra: imported on use
    from executorch.exir.passes.replace_aten_with_edge_pass import should_lower_to_edge

    return edge_target(op) if should_lower_to_edge(op) else op


def to_executorch_exported_program(program: Program) -> ExportedProgram:
    """`program` as ExecuTorch's `ExecutorchProgramManager.exported_program()` shows it after
    to_executorch: the edge view with ExecuTorch's own `insert_write_back_for_buffers_pass` run on
    it (an ATen `copy_` into each mutated buffer or input before the output), its graph changed in
    place after the program is built, as ExecuTorch's to_executorch changes its own."""
    # executorch is an optional extra: imported on use
    from executorch.exir.passes.insert_write_back_for_buffers_pass import insert_write_back_for_buffers_pass

    ep = to_edge_exported_program(program)
    insert_write_back_for_buffers_pass(ep)
    ep.graph_module.recompile()
    return ep


def to_edge_exported_program(program: Program, *, converted: ExportedProgram | None = None) -> ExportedProgram:
    """`program` (in the to_edge form: texir.orchestrate.lower gives it) as the edge-dialect
    ExportedProgram ExecuTorch builds (dialect "EDGE", its edge verifier, the kept ops as
    `preserve_ops`), call_function targets ExecuTorch edge operators, with value metadata, module
    stacks, debug handles, `meta["custom"]` and the program's `backend_meta` notes in `node.meta`.
    A program holding the ATen ops ExecuTorch's dim-order pass replaces (`_to_copy`, `clone`,
    `empty.memory_format`: `lower(skip_dim_order=True)` keeps them) is verified as ExecuTorch's
    `EdgeCompileConfig(_skip_dim_order=True)` program is. Each delegate call is ExecuTorch's
    `executorch_call_delegate` on an ExecuTorch `LoweredBackendModule` (`executorch_lowered_module`),
    in control-flow branches too, so ExecuTorch's utilities (`get_delegates`,
    `format_delegated_graph`, ...) see the delegates. `converted`, when given, is `program` already
    converted by `to_exported_program` and nobody else's: it is made the edge program in place."""
    require_executorch("texir.executorch.to_edge_exported_program")
    # executorch is an optional extra: imported on use
    from executorch.exir.delegate import executorch_call_delegate

    ep = to_exported_program(program) if converted is None else converted
    notes: dict[str, dict[str, Any]] = {}
    for note in program.backend_meta:
        notes.setdefault(note.node, {})[note.key] = json.loads(note.value)
    kept: dict[str, torch._ops.OpOverload] = {}
    skip_dim_order = False
    theirs: dict[int, Any] = {}  # one ExecuTorch module per texir module, wherever it is called from
    for _, gm in graph_modules(ep.graph_module):
        for node in gm.graph.nodes:
            if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
                skip_dim_order = skip_dim_order or canonical_target(node.target) in DIM_ORDER_OPS
                if _kept_from_decomposition(node.target):
                    kept.setdefault(str(node.target), node.target)
                node.target = executorch_edge_target(node.target)
            elif node.op == "call_function" and node.target is delegate_op.texir_call_delegate:
                node.target = executorch_call_delegate
                val = node.meta.get("val")
                if isinstance(val, tuple):  # ExecuTorch's to_backend records a list
                    node.meta["val"] = list(val)
            elif node.op == "get_attr":
                ours = getattr(gm, str(node.target), None)
                if isinstance(ours, delegate_op.LoweredBackendModule):
                    module = theirs.get(id(ours))
                    if module is None:
                        # the texir module's own conversion (torch's verifier may have built it
                        # already), made ExecuTorch's edge program: the view replaces the module
                        module = theirs[id(ours)] = executorch_lowered_module(
                            ours.texir_module, converted=ours.original_module
                        )
                    setattr(gm, str(node.target), module)
        gm.recompile()
    for node in ep.graph_module.graph.nodes:
        found = notes.get(node.name)
        if found:
            node.meta.update(found)
    return _as_edge_dialect(ep, [kept[k] for k in sorted(kept)], skip_dim_order=skip_dim_order)


def executorch_lowered_module(module: LoweredBackendModule, *, converted: ExportedProgram | None = None) -> Any:
    """texir's lowered module as ExecuTorch's `LoweredBackendModule`, built as ExecuTorch's
    `to_backend` builds one: its `original_module` the partition's edge program (nested delegates
    ExecuTorch's too), the blob, compile specs and named data, and `meta["debug_handle_map"]`
    (ExecuTorch's form, identifier -> handles), so it is callable, traceable and emittable.
    `converted`: the original program already converted (see `to_edge_exported_program`)."""
    # executorch is an optional extra: imported on use
    from executorch.exir.backend.compile_spec_schema import CompileSpec
    from executorch.exir.lowered_backend_module import LoweredBackendModule as ExecutorchLowered

    lowered = ExecutorchLowered(
        edge_program=_called_flat(to_edge_exported_program(module.original_program, converted=converted)),
        backend_id=module.backend_id,
        processed_bytes=module.processed_bytes,
        compile_specs=[CompileSpec(spec.key, spec.value) for spec in module.compile_specs],
        named_data_store_output=named_data_store_output(module.named_data),
    )
    handles = module.debug_handle_map
    lowered.meta = {
        "debug_handle_map": None if handles is None
        else {entry.identifier: entry.debug_handles for entry in handles},
    }
    if module.delegate_info is not None:  # ExecuTorch's to_backend sets it only when there is one
        lowered.meta["_delegate_info_meta"] = json.loads(module.delegate_info)  # tuples come back as lists
    return lowered


def _called_flat(ep: ExportedProgram) -> ExportedProgram:
    """`ep` taking its user inputs as flat positional tensors and returning its user outputs as a
    list: how texir's delegate calls pass them (flattened, results read by getitem), so ExecuTorch's
    `executorch_call_delegate`, which calls `original_module.module()` with the call's arguments,
    runs it whatever structure (dict, list, single tensor) the program was exported with."""
    if not ep.module_call_graph:
        return ep
    names = [s.arg.name for s in ep.graph_signature.input_specs if s.kind is gs.InputKind.USER_INPUT]
    n_out = sum(1 for s in ep.graph_signature.output_specs if s.kind is gs.OutputKind.USER_OUTPUT)
    _, in_spec = pytree.tree_flatten(((0,) * len(names), {}))
    _, out_spec = pytree.tree_flatten([0] * n_out)
    top = ep.module_call_graph[0]
    if top.signature is not None:
        signature = dataclasses.replace(
            top.signature, in_spec=in_spec, out_spec=out_spec, forward_arg_names=names
        )
        ep._module_call_graph[0] = dataclasses.replace(top, signature=signature)
    return ep


def named_data_store_output(entries: tuple[NamedDataEntry, ...]) -> Any:
    """texir's named-data entries as ExecuTorch's `NamedDataStoreOutput` (None for none, as a
    backend that stores nothing returns)."""
    if not entries:
        return None
    # executorch is an optional extra: imported on use
    from executorch.exir._serialize._named_data_store import NamedDataStore

    store = NamedDataStore()
    for entry in entries:
        if entry.data is None:
            raise UnsupportedError(
                f"named data {entry.key!r} has no payload (a snapshot written without data); load the "
                "program with its data to build ExecuTorch's view of it"
            )
        store.add_named_data(entry.key, entry.data.tobytes(), alignment=entry.alignment)
    return store.get_named_data_store_output()


def _kept_from_decomposition(op: torch._ops.OpOverload) -> bool:
    """An ATen op that the edge decomposition leaves only when a partitioner asks to keep it (not
    core ATen, not a view-copy); ExecuTorch's verifier then needs it in `preserve_ops`."""
    if op.namespace != "aten" or op.is_view:
        return False
    return torch.Tag.core not in op.tags and torch.Tag.view_copy not in op.tags


def _as_edge_dialect(
    ep: ExportedProgram, preserve_ops: list[torch._ops.OpOverload], *, skip_dim_order: bool = False
) -> ExportedProgram:
    """`ep` rebuilt as ExecuTorch's `_generate_edge_program` builds the edge program partitioners
    and backends are shown: with `EXIREdgeDialectVerifier(class_only=True, preserve_ops=...)`,
    so `ep.dialect == "EDGE"` and `ep.validate()` checks what ExecuTorch's checks (Arm's TOSA
    backend calls it). Building it validates it, as in ExecuTorch."""
    # executorch is an optional extra: imported on use
    from executorch.exir import EdgeCompileConfig
    from executorch.exir.verification.verifier import EXIREdgeDialectVerifier

    verifier = EXIREdgeDialectVerifier(
        edge_compile_config=EdgeCompileConfig(_skip_dim_order=skip_dim_order), class_only=True,
        preserve_ops=preserve_ops,
    )
    try:
        return rebuilt_exported(ep, verifiers=[verifier])
    except Exception as exc:  # ExecuTorch's SpecViolationError and friends: one typed error
        raise UnsupportedError(
            f"the program is not valid edge dialect for ExecuTorch's verifier ({type(exc).__name__}: {exc}); "
            "lower it with texir.orchestrate.lower, which decomposes it as ExecuTorch's to_edge does"
        ) from exc
