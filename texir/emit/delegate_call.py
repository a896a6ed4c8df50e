"""Emitting a delegate call: the lowered module's blob, named data and compile specs into the program,
one DelegateCall instruction, the debug maps ETRecord reads; and the getitems that unpack its results."""

from __future__ import annotations

from texir.emit.common import EmitError
from texir.emit.control_flow import ControlFlow
from texir.emit.debug import DelegateDebug
from texir.ir.blob import Blob
from texir.ir.types import CallFunction, DelegateMeta, IntArg, Output, Ref, ScalarMeta, SymIntMeta, TensorMeta, TupleMeta
from texir.serialize.pte.schema import (
    BackendDelegate, BackendDelegateDataReference, CompileSpec, DataLocation, DelegateCall, Instruction, Int,
)

__all__ = ["DelegateCalls"]


class DelegateCalls(ControlFlow):
    """The value table, control flow and delegate calls; `MethodEmitter` adds the other nodes."""

    def emit_getitem(self, node: CallFunction, *, where: str) -> None:
        if len(node.args) != 2 or not isinstance(node.args[0], Ref) or not isinstance(node.args[1], IntArg):
            raise EmitError(f"{where}: getitem needs (value, int index)")
        source = self.by_name.get(node.args[0].name)
        if not isinstance(source, tuple):
            raise EmitError(f"{where}: getitem of {node.args[0].name!r}, which is not a multi-output value")
        index = node.args[1].value
        if not -len(source) <= index < len(source):
            raise EmitError(f"{where}: getitem index {index} out of range for {len(source)} results")
        self.by_name[node.name] = source[index]

    def emit_delegate(self, node: CallFunction, *, where: str) -> None:
        if not node.args or not isinstance(node.args[0], Ref):
            raise EmitError(f"{where}: call_delegate's first argument must name a lowered module")
        module_meta = self.metas.get(node.args[0].name)
        if not isinstance(module_meta, DelegateMeta):
            raise EmitError(f"{where}: {node.args[0].name!r} is not a get_attr of a lowered module")
        module = self.lowered.get(module_meta.module)
        if module is None:
            raise EmitError(
                f"{where}: lowered module {module_meta.module!r} is not in program.lowered_modules"
            )
        inputs = [self.scalar(arg, where=where) for arg in node.args[1:]]
        meta = self.graph.meta(node)
        item_metas = list(meta.items) if isinstance(meta, TupleMeta) else [meta] if meta is not None else []
        outs: list[int] = []
        for m in item_metas:
            if isinstance(m, TensorMeta):
                outs.append(self.tensor_value(m, where=where, planned=True, start=self.step))
            elif isinstance(m, (SymIntMeta, ScalarMeta)):
                outs.append(self.add(Int(int_val=0)))
            else:
                raise EmitError(f"{where}: delegate output of kind {type(m).__name__} is not supported")
        for entry in module.named_data:
            self.state.named_data(entry, f"delegate {module_meta.module!r} ({module.backend_id}) of method {self.name!r}")
        blob_index = self.state.delegate_blob(Blob(module.processed_bytes))
        self.delegates.append(BackendDelegate(
            id=module.backend_id,
            processed=BackendDelegateDataReference(location=DataLocation.INLINE, index=blob_index),
            compile_specs=tuple(CompileSpec(key=c.key, value=c.value) for c in module.compile_specs),
        ))
        if "xnnpack" in module.backend_id.lower():
            self.xnnpack_groups.add(self.group)
        self.instructions.append(Instruction(instr_args=DelegateCall(
            delegate_index=len(self.delegates) - 1, args=(*inputs, *outs),
        )))
        index = len(self.instructions) - 1
        inner = module.original_program.graph
        self.debug_handles.append((index, tuple(
            h for n, h in zip(inner.nodes, inner.debug_handles()) if isinstance(n, CallFunction) and h is not None
        )))
        inner_out = inner.nodes[-1]
        self.debug_num_outputs.append((index, len(inner_out.args) if isinstance(inner_out, Output) else 1))
        self.debug_delegates.append((index, DelegateDebug(
            backend_id=module.backend_id,
            delegate_map=tuple((e.identifier, e.debug_handles) for e in module.debug_handle_map or ()),
        )))
        if isinstance(meta, TupleMeta):
            self.by_name[node.name] = tuple(outs)
        elif outs:
            self.by_name[node.name] = outs[0]
