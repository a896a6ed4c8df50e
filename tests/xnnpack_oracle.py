"""Both sides of an XNNPACK lowering, for the oracle tests: ExecuTorch 1.5.1's
`to_edge_transform_and_lower(..., [XnnpackPartitioner()]).to_executorch()` and texir's
`lower(..., [executorch_partitioner(XnnpackPartitioner())])` + `emit`, each run in the runtime."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from texir.emit import EmitOptions, emit, emit_with_debug
from texir.ir import CALL_DELEGATE, CallFunction, GetAttr, Program, Ref, TensorMeta, TupleMeta
from texir.serialize.pte.codec import dumps
from texir.executorch.runtime import RuntimeRunError, load_method

__all__ = ["Lowered", "PteView", "executorch_xnnpack", "native_xnnpack", "pte_view", "run_pte", "texir_xnnpack"]


@dataclass(frozen=True)
class PteView:
    """What the oracle compares in a .pte: delegates (backend ids and blobs, in order) and named data."""

    delegates: list[tuple[str, bytes]]
    named: dict[str, bytes] = field(default_factory=dict)
    kernels: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Lowered:
    pte: bytes | None
    error: BaseException | None = None
    partitions: list[Counter[str]] = field(default_factory=list)
    """Per delegate call (in graph order): the ops of its sub-program with their shapes."""
    debug_maps: tuple[Any, Any, Any] | None = None
    """ExecuTorch's debug_handle_map, delegate_map and instruction -> number of outputs (texir's from
    `emit_with_debug`), for tests/test_executorch_backends.py's debug-map comparison."""
    program: Program | None = None
    """texir's lowered program (native XNNPACK), kept where `lower` gave one even if `emit` failed."""


def pte_view(data: bytes) -> PteView:
    from executorch.exir._serialize._program import deserialize_pte_binary

    pte = deserialize_pte_binary(data)
    program = pte.program
    delegates = []
    for plan in program.execution_plan:
        for d in plan.delegates:
            delegates.append((d.id, bytes(program.backend_delegate_data[d.processed.index].data)))
    named: dict[str, bytes] = {}
    if pte.named_data is not None:
        for key, entry in pte.named_data.pte_data.items():
            named[key] = bytes(pte.named_data.buffers[entry.buffer_index])
    kernels = sorted({op.name for plan in program.execution_plan for op in plan.operators})
    return PteView(delegates=delegates, named=named, kernels=kernels)


def executorch_xnnpack(ep: torch.export.ExportedProgram, **options: Any) -> Lowered:
    """ExecuTorch's own lowering; `options` go to XnnpackPartitioner (e.g. per_op_mode=True)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    try:
        edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner(**options)])
        gm = edge.exported_program().graph_module
        partitions = []
        for node in gm.graph.nodes:
            if node.op == "call_function" and "call_delegate" in str(node.target):
                sub = getattr(gm, node.args[0].target).original_module.graph
                partitions.append(Counter(
                    f"{_op_name(n.target)}{_shape(n.meta.get('val'))}" for n in sub.nodes if n.op == "call_function"
                ))
        manager = edge.to_executorch()
        maps = (manager.debug_handle_map, manager.delegate_map, manager._emitter_output.instruction_id_to_num_outs_map)
    except Exception as exc:  # the oracle's own failure is part of what is compared
        return Lowered(pte=None, error=exc)
    return Lowered(pte=bytes(manager.buffer), partitions=partitions, debug_maps=maps)


def _op_name(target: Any) -> str:
    from texir.adapters.targets import canonical_target

    op = getattr(target, "_op", target)  # an edge dialect op wraps the aten OpOverload
    return canonical_target(op) or str(target)


def _shape(val: Any) -> str:
    if isinstance(val, torch.Tensor):
        return "[" + ", ".join(str(d) for d in val.shape) + "]"
    if isinstance(val, (tuple, list)):
        return "(" + ", ".join(_shape(v) for v in val) + ")"
    return ""


def texir_xnnpack(ep: torch.export.ExportedProgram, options: EmitOptions | None = None) -> Lowered:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from texir.executorch import executorch_partitioner
    from texir.orchestrate import lower

    try:
        program = lower(ep, [executorch_partitioner(XnnpackPartitioner())]).program
        emitted = emit_with_debug(program, options)
        pte = dumps(emitted.program)
    except Exception as exc:
        return Lowered(pte=None, error=exc)
    maps = (emitted.debug_handle_map(), emitted.delegate_map(), emitted.instruction_id_to_num_outs_map())
    return Lowered(pte=pte, partitions=texir_partitions(program), debug_maps=maps)


def native_xnnpack(ep: torch.export.ExportedProgram, **options: Any) -> Lowered:
    """texir's own XNNPACK partitioner and backend (`texir.backends.xnnpack`), no ExecuTorch code;
    `options` go to its `partitioner()`."""
    from texir.backends.xnnpack import registered
    from texir.backends.xnnpack.partitioner import partitioner
    from texir.orchestrate import lower

    program = None
    try:
        with registered():
            program = lower(ep, [partitioner(**options)]).program
        pte = dumps(emit(program))
    except Exception as exc:
        return Lowered(pte=None, error=exc, program=program)
    return Lowered(pte=pte, partitions=texir_partitions(program), program=program)


def texir_partitions(program: Program) -> list[Counter[str]]:
    modules = {m.name: m.module for m in program.lowered_modules}
    attrs = {n.name: n.target for n in program.graph.nodes if isinstance(n, GetAttr)}
    partitions = []
    for node in program.graph.nodes:
        if isinstance(node, CallFunction) and node.target == CALL_DELEGATE and isinstance(node.args[0], Ref):
            sub = modules[attrs[node.args[0].name]].original_program.graph
            partitions.append(Counter(
                f"{n.target}{_ir_shape(sub.meta(n))}" for n in sub.nodes if isinstance(n, CallFunction)
            ))
    return partitions


def _ir_shape(meta: Any) -> str:
    if isinstance(meta, TensorMeta):
        return "[" + ", ".join(str(d) for d in meta.shape) + "]"
    if isinstance(meta, TupleMeta):
        return "(" + ", ".join(_ir_shape(m) for m in meta.items) + ")"
    return ""


def run_pte(data: bytes, args: tuple[Any, ...], calls: int = 1) -> list[list[torch.Tensor]]:
    try:
        method = load_method(data)
    except RuntimeRunError as exc:  # the oracle reports the runtime's own error (tests pin its text)
        if isinstance(exc.__cause__, RuntimeError):
            raise exc.__cause__ from None
        raise
    return [list(method.execute(pytree.tree_leaves(args))) for _ in range(calls)]
