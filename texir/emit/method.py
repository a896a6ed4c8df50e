"""One method's nodes emitted in order: kernel calls, views, casts, control flow, delegates, outputs."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import cast

import msgspec

from texir.errors import PteError
from texir.ir.analysis import iter_refs
from texir.ir.names import INLINE_CONSTANT, MEMORY_VIEW
from texir.ir.op_facts import SYM_OPS
from texir.ir.op_schema import OpSchema
from texir.ir.types import (
    DTYPE_ITEMSIZE,
    Argument,
    BoolArg,
    BufferInput,
    BufferMutation,
    UserInputMutation,
    CallFunction,
    ConstantTensorInput,
    FloatArg,
    GetAttr,
    IntArg,
    ListArg,
    NoneArg,
    NoneMeta,
    Output,
    ParameterInput,
    Placeholder,
    Ref,
    ScalarMeta,
    SymBoolMeta,
    SymFloatMeta,
    SymIntMeta,
    TensorMeta,
    TupleArg,
    TupleMeta,
    UserInput,
    UserOutput,
    ValueMeta,
)
from texir.serialize.pte.dtypes import DTYPE_TO_SCALAR_TYPE, SCALAR_TYPE_TO_DTYPE
from texir.serialize.pte.schema import (
    Bool,
    ExecutionPlan,
    Int,
    IntList,
    Null,
    ScalarType,
    TensorList,
    TensorShapeDynamism,
)

from texir.edge.view_copy import VIEW_COPY
from texir.emit.common import (
    CALL_DELEGATE_TARGET,
    DIM_ORDER_TARGETS,
    GETITEM_TARGET,
    SYM_ARITH,
    EmitError,
    PendingTensor,
    Storage,
    literal_of,
)
from texir.emit.control_flow import CONTROL_FLOW
from texir.emit.delegate_call import DelegateCalls
from texir.emit.plan_assembly import assemble_plan
from texir.emit.values import result_requires_grad


class MethodEmitter(DelegateCalls):
    """Emits one edge-form Program as a `.pte` ExecutionPlan."""

    def emit_method(self) -> ExecutionPlan:
        program = self.program
        nodes = program.graph.nodes
        specs = program.signature.inputs
        placeholders = [n for n in nodes if isinstance(n, Placeholder)]
        if len(specs) != len(placeholders):
            raise EmitError(
                f"method {self.name!r}: signature has {len(specs)} inputs for {len(placeholders)} placeholders; "
                "run texir.ir.verify(program)"
            )
        output = nodes[-1]
        if not isinstance(output, Output):
            raise EmitError(f"method {self.name!r}: the graph does not end with an Output node")
        if len(program.signature.outputs) != len(output.args):
            raise EmitError(f"method {self.name!r}: signature outputs do not match the Output node")
        mutated = {
            spec.target: arg for spec, arg in zip(program.signature.outputs, output.args)
            if isinstance(spec, BufferMutation)
        }
        spec_of = dict(zip((p.name for p in placeholders), specs))
        last_step = self.last_step
        handles = program.graph.debug_handles()
        for step, node in enumerate(nodes):
            self.step = step
            where = f"method {self.name!r}, node {node.name!r}"
            self.where = f"{where} ({node.target})" if isinstance(node, CallFunction) else where
            if isinstance(node, Placeholder):
                idx = self.emit_placeholder(node, spec_of[node.name], mutated, where=where)
                spec = spec_of[node.name]
                if isinstance(spec, BufferInput) and (spec.target in mutated or spec.target in self.state.shared):
                    # The edge form writes the new value back just before the output.
                    pending = self.values[idx]
                    if isinstance(pending, PendingTensor) and pending.storage is not None:
                        self.storages[pending.storage].end = last_step
            elif isinstance(node, GetAttr):
                self.metas[node.name] = self.graph.meta(node)
            elif isinstance(node, CallFunction):
                self.metas[node.name] = self.graph.meta(node)
                before = len(self.instructions)
                try:
                    self.emit_call(node, where=f"{where} ({node.target})")
                except EmitError:
                    raise
                except PteError as exc:
                    raise EmitError(f"{where} ({node.target}): {exc}") from exc
                handle = handles[step]
                if handle is not None and node.target != CALL_DELEGATE_TARGET and node.target not in CONTROL_FLOW:
                    # Each instruction of the node (casts the emitter adds run for it, as the cast
                    # nodes ExecuTorch inserts carry their consumer's handle).
                    self.debug_handles.extend(
                        (i, handle) for i in range(before, len(self.instructions)) if i not in self.without_handle
                    )
            else:
                self.emit_output(node, where=where)
        return assemble_plan(self)

    def emit_placeholder(
        self, node: Placeholder, spec: object, mutated: Mapping[str, Argument], *, where: str
    ) -> int:
        meta = self.graph.meta(node)
        self.metas[node.name] = meta
        if isinstance(spec, (ParameterInput, BufferInput, ConstantTensorInput)):
            if isinstance(spec, BufferInput) and (spec.target in mutated or spec.target in self.state.shared):
                if not isinstance(meta, TensorMeta):
                    raise EmitError(f"{where}: mutable buffer {spec.target!r} has no tensor metadata")
                idx = self.mutable_buffer(node, spec.target, meta, where=where)
            else:
                data = self.state_by_target.get(spec.target)
                if data is None:
                    raise EmitError(f"{where}: no state entry for {spec.target!r}; the program lacks its data")
                if data.data is None:
                    raise EmitError(
                        f"{where}: state {spec.target!r} has no payload (a snapshot without data); "
                        "convert with data or load a snapshot written with include_data=True (`texir snapshot --include-data`)"
                    )
                tag = self.external_tag(node, spec.target, where=where)
                if tag is None:
                    idx = self.constant_tensor(data.meta, data.data, where=where, digest=data.sha256)
                else:
                    idx = self.external_tensor(
                        data.meta, data.data, fqn=spec.target, tag=tag, where=where, digest=data.sha256
                    )
        elif isinstance(spec, UserInput):
            if isinstance(meta, TensorMeta):
                idx = self.tensor_value(
                    meta, where=where, planned=self.options.alloc_graph_input, start=0
                )
            elif isinstance(meta, ScalarMeta):
                idx = self.scalar(literal_of(meta.value), where=where)
            elif isinstance(meta, (SymIntMeta, SymBoolMeta, SymFloatMeta)):
                idx = self.add(Int(int_val=0))
            elif isinstance(meta, NoneMeta) or meta is None:
                idx = self.add(Null())
            else:
                raise EmitError(f"{where}: user input of kind {type(meta).__name__} is not supported")
            self.inputs.append(idx)
        else:
            raise EmitError(
                f"{where}: input kind {type(spec).__name__} is not supported by the .pte emitter"
            )
        self.by_name[node.name] = idx
        return idx

    def emit_call(self, node: CallFunction, *, where: str) -> None:
        target = node.target
        if target == GETITEM_TARGET:
            self.emit_getitem(node, where=where)
            return
        if target == CALL_DELEGATE_TARGET:
            self.emit_delegate(node, where=where)
            return
        if target in SYM_ARITH:
            args = [self.scalar(a, where=where) for a in node.args]
            result = self.add(Int(int_val=0))
            self.kernel(SYM_ARITH[target], (*args, result))
            self.by_name[node.name] = result
            return
        if target in CONTROL_FLOW:
            self.emit_control_flow(node, where=where)
            return
        if target.startswith("higher_order::"):
            raise EmitError(
                f"{where}: control flow ({target}) is not supported by the .pte emitter; "
                "export with torch.cond, torch.map or torch.scan instead, or delegate the region"
            )
        if target in SYM_OPS:
            schema = self.ops.op_schema(target)
            bound = self.bind(node, schema)
            args = [self.argument(a, self._arg_or_default(bound, a, node, where), where=where)
                    for a in schema.arguments]
            result = self.add(Int(int_val=0))
            self.kernel(target, (*args, result))
            self.by_name[node.name] = result
            return
        if target == INLINE_CONSTANT:
            self.inline_constant(node, where=where)
            return
        if target == MEMORY_VIEW:
            if self.emit_static_view(node, where=where):
                return
            # The base's memory cannot be shared (see emit_static_view): the reshape is copied.
            node = msgspec.structs.replace(node, target=VIEW_COPY)
            target = VIEW_COPY
        facts = self.ops.op_facts(target)
        if facts is None:
            self.ops.op_schema(target)  # raises the error that names the unknown operator
            raise EmitError(f"{where}: operator {target} is not known to torch")
        kwargs_override: dict[str, Argument] = {}
        forced: tuple[int, ...] | None = None
        if target in DIM_ORDER_TARGETS:
            order_arg = dict(node.kwargs).get("dim_order")
            if not isinstance(order_arg, ListArg):
                # No explicit order (preserve_format, or a dtype cast): the input's layout as emitted.
                order_arg = self.preserved_dim_order(node)
                kwargs_override = {"dim_order": order_arg}
            forced = tuple(i.value for i in order_arg.items if isinstance(i, IntArg))
        elif facts.is_view:
            raise EmitError(
                f"{where}: view op has no copy variant; decompose it before emitting "
                "(the edge form turns views into their *_copy variants)"
            )
        functional = facts.schema
        out = facts.out
        bound = self.bind(node, functional)
        bound.update(kwargs_override)
        if out is None:
            if functional.is_mutable:
                self.emit_inplace(node, functional, bound, where=where)
                return
            raise EmitError(
                f"{where}: operator {target} has no out variant, so the ExecuTorch runtime has no kernel "
                "for it. Delegate it to a backend that takes it; or, if the program was converted without "
                "decomposing (from_exported_program(ep) with decompose=False), decompose it to core ATen "
                "first (texir.lower and `texir lower` always do)"
            )
        inline = self.inline_operands(functional, bound, where=where)
        self.emit_out_call(node, out, bound, where=where, forced_order=forced, emitted=inline)

    def emit_out_call(
        self, node: CallFunction, out: OpSchema, bound: Mapping[str, Argument], *, where: str,
        forced_order: tuple[int, ...] | None = None,
        emitted: Mapping[str, int] | None = None,
    ) -> None:
        meta = self.graph.meta(node)
        out_args = out.out_args
        # Allocate the out tensors first (exir's memory.alloc nodes precede their op).
        item_metas: list[ValueMeta]
        if len(out_args) == 1 and out_args[0].kind != "tensor_list":
            if not isinstance(meta, TensorMeta):
                raise EmitError(f"{where}: expected one tensor result, metadata is {type(meta).__name__}")
            item_metas = [meta]
        elif isinstance(meta, TupleMeta):
            item_metas = list(meta.items)
        else:
            raise EmitError(f"{where}: expected a tuple of results, metadata is {type(meta).__name__}")
        # With alloc_graph_output=False a method output is left to the caller (no allocation_info).
        planned = self.options.alloc_graph_output or not (
            self.graph is self.program.graph and node.name in self.output_names
        )
        # Layouts follow the op's tensor inputs (a view's metadata carries its base's strides, but
        # its copy variant writes a fresh contiguous tensor); dim-order ops say theirs explicitly.
        orders: set[tuple[int, ...]] = set()
        if forced_order is not None:
            orders.add(forced_order)
        else:
            for value in bound.values():
                for name in iter_refs(value):
                    found = self.by_name.get(name)
                    tensor = self.values[found] if isinstance(found, int) else None
                    if isinstance(tensor, PendingTensor):
                        orders.add(tensor.dim_order)
        allowed = frozenset(orders)
        grad_in = self.grad_flows(node.target, bound)
        out_values: dict[str, int] = {}
        result_indices: list[int] = []
        if len(out_args) == 1 and out_args[0].kind == "tensor_list":
            items = []
            for i, m in enumerate(item_metas):
                if not isinstance(m, TensorMeta):
                    raise EmitError(f"{where}: list result item is {type(m).__name__}, not a tensor")
                items.append(self.tensor_value(m, where=where, planned=planned, start=self.step, allowed_orders=allowed,
                    forced_order=forced_order, requires_grad=result_requires_grad(node.target, i, m.dtype, grad_in)))
            result_indices = items
        else:
            if len(item_metas) != len(out_args):
                raise EmitError(
                    f"{where}: {len(item_metas)} results but out variant {out.target} has {len(out_args)} outs"
                )
            for i, (a, m) in enumerate(zip(out_args, item_metas)):
                if not isinstance(m, TensorMeta):
                    raise EmitError(f"{where}: result {a.name!r} is {type(m).__name__}, not a tensor")
                out_values[a.name] = self.tensor_value(m, where=where, planned=planned, start=self.step, allowed_orders=allowed,
                    forced_order=forced_order, requires_grad=result_requires_grad(node.target, i, m.dtype, grad_in))
                result_indices.append(out_values[a.name])
        args: list[int] = []
        for a in out.arguments:
            if a.is_out and a.kind == "tensor_list":
                # The list of out tensors is made where its argument stands (ExecuTorch's emitter
                # emits arguments in schema order; the tensors themselves were allocated first).
                args.append(self.add(TensorList(items=tuple(result_indices))))
            elif a.is_out:
                args.append(out_values[a.name])
            elif emitted and a.name in emitted:
                args.append(emitted[a.name])
            else:
                args.append(self.argument(a, self._arg_or_default(bound, a, node, where), where=where))
        if len(out_args) == 1 and out_args[0].kind != "tensor_list":
            ret = out_values[out_args[0].name]
        else:
            ret = self.add(TensorList(items=tuple(result_indices)))
        self.kernel(out.target, (*args, ret))
        if isinstance(meta, TupleMeta) or out_args[0].kind == "tensor_list":
            self.by_name[node.name] = tuple(result_indices)
        else:
            self.by_name[node.name] = result_indices[0]

    def inline_constant(self, node: CallFunction, *, where: str) -> None:
        """A `texir::inline_constant`: nothing is emitted here; its user emits it (`inline_operands`)."""
        meta = self.graph.meta(node)
        literal = node.args[0] if len(node.args) == 1 and not node.kwargs else None
        if not isinstance(literal, (IntArg, FloatArg, BoolArg)) or not isinstance(meta, TensorMeta) or meta.shape:
            raise EmitError(
                f"{where}: {INLINE_CONSTANT} takes one bool/int/float literal and has 0-dim tensor metadata "
                f"(got args {node.args!r}, kwargs {node.kwargs!r}, metadata {type(meta).__name__}); "
                "make it with texir.edge.inline_mixed_scalars"
            )
        if DTYPE_TO_SCALAR_TYPE.get(meta.dtype) is None:
            raise EmitError(f"{where}: inline constant dtype {meta.dtype} has no ExecuTorch scalar type")
        self.inline[node.name] = literal

    def inline_operands(self, schema: OpSchema, bound: Mapping[str, Argument], *, where: str) -> dict[str, int]:
        """The inline constants among the Tensor operands, emitted before the op's own values (where
        ExecuTorch's lifted scalar and its cast stand): each a 0-dim constant of its literal's dtype,
        cast to its node's dtype when they differ."""
        emitted: dict[str, int] = {}
        for a in schema.in_args:
            arg = bound.get(a.name)
            literal = self.inline.get(arg.name) if a.kind == "tensor" and isinstance(arg, Ref) else None
            if literal is None or not isinstance(arg, Ref):
                continue
            self.inline[arg.name] = None  # one user: a second read is refused by `ref`
            meta = self.metas.get(arg.name)
            want = DTYPE_TO_SCALAR_TYPE[meta.dtype] if isinstance(meta, TensorMeta) else None
            index = self.scalar_tensor(literal, where=where)
            value = self.values[index]
            if want is not None and isinstance(value, PendingTensor) and value.scalar_type != want:
                index = self.cast(index, value, want, where=where)
            emitted[a.name] = index
        return emitted

    def cast(self, index: int, value: PendingTensor, dtype: ScalarType, *, where: str) -> int:
        out = PendingTensor(
            scalar_type=dtype, sizes=value.sizes, dim_order=value.dim_order, requires_grad=False,
            dynamism=value.dynamism,
        )
        out.storage = len(self.storages)
        self.storages.append(Storage(
            size=math.prod(value.sizes) * DTYPE_ITEMSIZE[SCALAR_TYPE_TO_DTYPE[dtype]],
            start=self.step, end=self.step, group=self.group,
        ))
        out_index = self.add(out)
        non_blocking = self.add(Bool(bool_val=False))
        dims = self.add(IntList(items=tuple(self.add(Int(int_val=d)) for d in value.dim_order)))
        self.use(index)
        self.kernel("dim_order_ops::_to_dim_order_copy.out", (index, non_blocking, dims, out_index, out_index))
        return out_index

    def emit_inplace(
        self, node: CallFunction, schema: OpSchema, bound: Mapping[str, Argument], *, where: str
    ) -> None:
        args = [self.argument(a, self._arg_or_default(bound, a, node, where), where=where)
                for a in schema.arguments]
        # The return slot of an in-place op is the mutated input itself.
        self.kernel(schema.target, (*args, args[0]))
        self.by_name[node.name] = args[0]

    def preserved_dim_order(self, node: CallFunction) -> ListArg:
        """The dim order of a dim-order op's input as emitted (not torch's view strides): what
        preserve_format keeps, and what a cast inserted by the edge form keeps."""
        meta = self.graph.meta(node)
        rank = len(meta.shape) if isinstance(meta, TensorMeta) else 0
        base = node.args[0] if node.args else None
        found = self.by_name.get(base.name) if isinstance(base, Ref) else None
        base_value = self.values[found] if isinstance(found, int) else None
        order: tuple[int, ...]
        if isinstance(base_value, PendingTensor) and len(base_value.dim_order) == rank:
            order = base_value.dim_order
        else:
            order = tuple(range(rank))
        return ListArg(items=tuple(IntArg(value=d) for d in order))

    def emit_static_view(self, node: CallFunction, *, where: str) -> bool:
        """A `texir::memory_view` (the edge pass `replace_view_copies_with_views` made it of a reshape
        no output reads) of a planned or constant, contiguous tensor becomes a second Tensor value
        over the same memory: with no instruction when static, through `executorch_prim::et_view`
        (which sets the runtime shape) when dynamic. False where the memory does not allow it (a base
        neither planned nor constant, e.g. an input with `alloc_graph_input=False`; a base in another
        dim order; a static view of a dynamic base): the caller copies instead."""
        meta = self.graph.meta(node)
        if not isinstance(meta, TensorMeta):
            return False
        if not node.args or not isinstance(node.args[0], Ref):
            return False
        base_index = self.by_name.get(node.args[0].name)
        if not isinstance(base_index, int):
            return False
        base = self.values[base_index]
        if not isinstance(base, PendingTensor):
            return False
        if base.storage is None and base.data_buffer_idx == 0:
            return False
        if base.dim_order != tuple(range(len(base.dim_order))):
            return False
        dynamic = any(isinstance(d, str) for d in meta.shape)
        if base.dynamism != TensorShapeDynamism.STATIC and not dynamic:
            return False
        if dynamic and base.storage is None:
            return False
        sizes = tuple(self.bounds.upper(d, where=where) for d in meta.shape)
        alias = PendingTensor(
            scalar_type=base.scalar_type, sizes=sizes, dim_order=tuple(range(len(sizes))),
            requires_grad=base.requires_grad,  # a view requires grad as its base does
            dynamism=TensorShapeDynamism.DYNAMIC_BOUND if dynamic else TensorShapeDynamism.STATIC,
            data_buffer_idx=base.data_buffer_idx, storage=base.storage,
        )
        if not dynamic:
            self.use(base_index)
            self.by_name[node.name] = self.add(alias)
            return True
        self.use(base_index)
        size_arg = node.args[1] if len(node.args) > 1 else dict(node.kwargs).get("size", NoneArg())
        seq = size_arg.items if isinstance(size_arg, (ListArg, TupleArg)) else (size_arg,)
        sizes_index = self.add(IntList(items=tuple(self.scalar(item, where=where) for item in seq)))
        out = self.add(alias)
        self.without_handle.add(len(self.instructions))  # ExecuTorch's _emit_view records no handle
        self.kernel("executorch_prim::et_view.default", (base_index, sizes_index, out))
        self.by_name[node.name] = out
        return True

    def emit_output(self, node: Output, *, where: str) -> None:
        # Buffer mutations were written back by the edge form's copy_ nodes; a mutated user input
        # was too, and is returned (its placeholder, holding the new value) where the signature says.
        for spec, arg in zip(self.program.signature.outputs, node.args):
            if isinstance(spec, BufferMutation):
                continue
            if isinstance(spec, UserInputMutation):
                self.outputs.append(self.ref(spec.target, where=where))
                continue
            if not isinstance(spec, UserOutput):
                raise EmitError(f"{where}: output kind {type(spec).__name__} is not supported by the .pte emitter")
            if isinstance(arg, Ref):
                self.outputs.append(self.ref(arg.name, where=where))
            else:
                self.outputs.append(self.scalar(arg, where=where))
