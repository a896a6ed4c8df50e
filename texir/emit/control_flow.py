"""Control flow in the `.pte`: torch.cond, torch.map and torch.scan inlined with jumps, as
ExecuTorch's emitter writes them (a mixin of `MethodEmitter`)."""

from __future__ import annotations

from typing import cast

from texir.emit.common import CondRegion, EmitError, PendingTensor
from texir.emit.values import ValueTable, result_requires_grad
from texir.ir.types import (
    Argument,
    CallFunction,
    GetAttr,
    Graph,
    ListArg,
    Output,
    Placeholder,
    Ref,
    SubgraphMeta,
    TensorMeta,
    TupleArg,
    TupleMeta,
)
from texir.serialize.pte.schema import Bool, Instruction, Int, JumpFalseCall, MoveCall, TensorShapeDynamism

__all__ = ["CONTROL_FLOW", "ControlFlow"]

CONTROL_FLOW = frozenset({"higher_order::cond", "higher_order::map_impl", "higher_order::scan"})
"""The higher-order ops the runtime runs, inlined as jumps by `ControlFlow.emit_control_flow`."""


class ControlFlow(ValueTable):
    """torch.cond, torch.map and torch.scan; the body's nodes go through the method's own `emit_call`."""

    def emit_call(self, node: CallFunction, *, where: str) -> None:
        raise NotImplementedError  # MethodEmitter's

    def emit_control_flow(self, node: CallFunction, *, where: str) -> None:
        """The node's control flow op (one of `CONTROL_FLOW`)."""
        emitters = {
            "higher_order::cond": self.emit_cond,
            "higher_order::map_impl": self.emit_map,
            "higher_order::scan": self.emit_scan,
        }
        emitters[node.target](node, where=where)

    def subgraph(self, arg: Argument, *, where: str) -> Graph:
        meta = self.metas.get(arg.name) if isinstance(arg, Ref) else None
        if not isinstance(meta, SubgraphMeta):
            raise EmitError(f"{where}: branch argument is not a get_attr of a nested graph")
        for sub in self.graph.subgraphs:
            if sub.name == meta.graph:
                return sub.graph
        raise EmitError(f"{where}: nested graph {meta.graph!r} is missing from the graph's subgraphs")

    def emit_cond(self, node: CallFunction, *, where: str) -> None:
        """torch.cond inlined with jumps, as ExecuTorch's emitter does: JumpFalse(pred -> else), true
        branch, moves into the results, JumpFalse(False -> end), false branch, moves."""
        operand_arg = node.args[3] if len(node.args) == 4 else None
        if not isinstance(operand_arg, (ListArg, TupleArg)):
            raise EmitError(f"{where}: cond needs (pred, true_graph, false_graph, operands)")
        pred_arg, true_arg, false_arg = node.args[:3]
        pred = self.scalar(pred_arg, where=where)
        true_graph = self.subgraph(true_arg, where=where)
        false_graph = self.subgraph(false_arg, where=where)
        operands = [self.scalar(item, where=where) for item in operand_arg.items]
        meta = self.graph.meta(node)
        item_metas = list(meta.items) if isinstance(meta, TupleMeta) else [meta] if meta is not None else []
        # ExecuTorch's edge retrace runs the cond with autograd on: a result requires grad when an
        # operand does (a parameter the branches close over, or a value computed from one).
        grad = any(getattr(self.values[i], "requires_grad", False) for i in operands)
        outs: list[int] = []
        for k, m in enumerate(item_metas):
            if not isinstance(m, TensorMeta):
                raise EmitError(f"{where}: cond result of kind {type(m).__name__} is not supported")
            outs.append(self.tensor_value(m, where=where, planned=True, start=self.step,
                                          requires_grad=result_requires_grad(node.target, k, m.dtype, grad)))
        jump_else = len(self.instructions)
        self.instructions.append(Instruction(instr_args=JumpFalseCall(cond_value_index=pred,
                                                                      destination_instruction=-1)))
        branches = (self.groups, self.groups + 1)
        self.groups += 2
        true_results = self.emit_branch(true_graph, operands, outs, where=where, group=branches[0])
        for src, dst in zip(true_results, outs):
            self.instructions.append(Instruction(instr_args=MoveCall(move_from=src, move_to=dst)))
        jump_end = len(self.instructions)
        self.instructions.append(Instruction(instr_args=JumpFalseCall(cond_value_index=-1,
                                                                      destination_instruction=-1)))
        else_start = len(self.instructions)
        false_results = self.emit_branch(false_graph, operands, outs, where=where, group=branches[1])
        for src, dst in zip(false_results, outs):
            self.instructions.append(Instruction(instr_args=MoveCall(move_from=src, move_to=dst)))
        # The constant False the jump to the end reads comes after the false branch's values, as in
        # ExecuTorch's emitter (it emits the branch first, then the jump over it).
        false_value = self.add(Bool(bool_val=False))
        self.instructions[jump_else] = Instruction(instr_args=JumpFalseCall(
            cond_value_index=pred, destination_instruction=else_start))
        self.instructions[jump_end] = Instruction(instr_args=JumpFalseCall(
            cond_value_index=false_value, destination_instruction=len(self.instructions)))
        # Each branch is planned on its own (`texir.emit.plan_assembly`), as ExecuTorch plans a
        # cond's submodules; a move makes a result the branch's own tensor, so the branches' memory
        # is reserved until the results are last read. A branch returning an operand makes the
        # result that operand's tensor: it then stays live to the end of this graph.
        for index in (*true_results, *false_results):
            value = self.values[index]
            if isinstance(value, PendingTensor) and value.storage is not None:
                storage = self.storages[value.storage]
                if storage.group == self.group:
                    storage.end = self.last_step
        self.cond_regions.append(CondRegion(
            group=self.group, step=self.step, branches=branches,
            results=tuple(s for s in (self.storage_of(i) for i in outs) if s is not None),
        ))
        self.by_name[node.name] = tuple(outs)

    def storage_of(self, index: int) -> int | None:
        value = self.values[index]
        return value.storage if isinstance(value, PendingTensor) else None

    def emit_map(self, node: CallFunction, *, where: str) -> None:
        """torch.map as a loop, as ExecuTorch's emitter writes it: n = sym_size(x, 0); then per
        iteration select_copy(x, 0, i) into the body's first input, the body, et_copy_index(out,
        result, i), i += 1, and JumpFalse(i == n -> back to the select); finally i -= n, so that
        the next call starts at 0 again."""
        if len(node.args) != 3 or not isinstance(node.args[1], (ListArg, TupleArg)) \
                or not isinstance(node.args[2], (ListArg, TupleArg)):
            raise EmitError(f"{where}: map_impl needs (body_graph, [mapped], [operands])")
        body = self.subgraph(node.args[0], where=where)
        mapped, extra = node.args[1].items, node.args[2].items
        if len(mapped) != 1:
            raise EmitError(
                f"{where}: torch.map over {len(mapped)} tensors; the ExecuTorch runtime's loop maps one "
                "(stack the inputs into one tensor, or map over a tuple index instead)"
            )
        meta = self.graph.meta(node)
        items = list(meta.items) if isinstance(meta, TupleMeta) else [meta]
        if len(items) != 1 or not isinstance(items[0], TensorMeta):
            raise EmitError(f"{where}: torch.map with {len(items)} results; the ExecuTorch runtime's loop "
                            "returns one tensor (concatenate the results in the body)")
        placeholders = [n for n in body.nodes if isinstance(n, Placeholder)]
        slice_meta = body.meta(placeholders[0]) if placeholders else None
        if not isinstance(slice_meta, TensorMeta):
            raise EmitError(f"{where}: the map body's first input is not a tensor")
        self.check_stackable(items[0], "the map's result", where=where)
        x = self.scalar(mapped[0], where=where)
        operands = [self.scalar(item, where=where) for item in extra]
        first_storage = len(self.storages)
        out = self.tensor_value(items[0], where=where, planned=True, start=self.step)
        out_pending = cast(PendingTensor, self.values[out])
        out_pending.dynamism = TensorShapeDynamism.DYNAMIC_BOUND  # et_copy_index grows it row by row
        index = self.add(Int(int_val=0))
        count = self.add(Int(int_val=0))
        self.kernel("aten::sym_size.int", (x, self.add(Int(int_val=0)), count))
        row = self.tensor_value(slice_meta, where=where, planned=True, start=self.step)
        loop_start = len(self.instructions)
        self.kernel("aten::select_copy.int_out", (x, self.add(Int(int_val=0)), index, row, row))
        (result,) = self.emit_branch(body, [row, *operands], [out], where=where)
        self.kernel("executorch_prim::et_copy_index.tensor", (out, result, index))
        self.kernel("executorch_prim::add.Scalar", (index, self.add(Int(int_val=1)), index))
        done = self.add(Bool(bool_val=False))
        self.kernel("executorch_prim::eq.Scalar", (index, count, done))
        self.instructions.append(Instruction(instr_args=JumpFalseCall(
            cond_value_index=done, destination_instruction=loop_start)))
        self.kernel("executorch_prim::sub.Scalar", (index, count, index))
        # The body runs many times: its tensors, the row, the result and the operands stay live
        # (unshared) to the end of the method.
        self.keep_live(first_storage, (x, *operands))
        self.by_name[node.name] = (out,)

    def emit_scan(self, node: CallFunction, *, where: str) -> None:
        """torch.scan as a loop, as ExecuTorch's emitter writes it: n = sym_size(xs[0], 0); each
        carry result copy_'d from its init; then per iteration select_copy(x, 0, i) of every xs
        into the body's slice inputs, the body (its carry inputs are the carry results), copy_ of
        the body's new carries into the carry results, et_copy_index(ys, y, i) of every stacked
        result, i += 1 and JumpFalse(i == n -> back to the selects); finally i -= n."""
        args = node.args
        if len(args) != 4 or not all(isinstance(a, (ListArg, TupleArg)) for a in args[1:]):
            raise EmitError(f"{where}: scan needs (combine_graph, [init], [xs], [additional_inputs])")
        body = self.subgraph(args[0], where=where)
        init, xs, extra = (cast(ListArg | TupleArg, a).items for a in args[1:])
        if not xs:
            raise EmitError(f"{where}: torch.scan over no tensors; the ExecuTorch runtime's loop counts the "
                            "iterations from the first of xs (pass at least one tensor to scan over)")
        meta = self.graph.meta(node)
        items = list(meta.items) if isinstance(meta, TupleMeta) else [meta]
        if len(items) < len(init):
            raise EmitError(f"{where}: scan has {len(items)} results for {len(init)} carries")
        for i, item in enumerate(items):
            if not isinstance(item, TensorMeta):
                raise EmitError(f"{where}: scan result {i} is {type(item).__name__}; the ExecuTorch runtime's "
                                "loop carries and stacks tensors only (return tensors from combine_fn)")
        for i, item in enumerate(items[len(init):]):
            self.check_stackable(cast(TensorMeta, item), f"stacked result {i}", where=where)
        placeholders = [n for n in body.nodes if isinstance(n, Placeholder)]
        slice_metas = [body.meta(p) for p in placeholders[len(init):len(init) + len(xs)]]
        if len(slice_metas) != len(xs) or not all(isinstance(m, TensorMeta) for m in slice_metas):
            raise EmitError(f"{where}: the scan body's inputs after the {len(init)} carries are not "
                            f"{len(xs)} tensor slices of xs")
        inits = [self.scalar(item, where=where) for item in init]
        sources = [self.scalar(item, where=where) for item in xs]
        operands = [self.scalar(item, where=where) for item in extra]
        first_storage = len(self.storages)
        outs = [self.tensor_value(cast(TensorMeta, m), where=where, planned=True, start=self.step) for m in items]
        carries, stacked = outs[:len(init)], outs[len(init):]
        for y in stacked:  # et_copy_index grows each stacked result row by row
            cast(PendingTensor, self.values[y]).dynamism = TensorShapeDynamism.DYNAMIC_BOUND
        index = self.add(Int(int_val=0))
        count = self.add(Int(int_val=0))
        self.kernel("aten::sym_size.int", (sources[0], self.add(Int(int_val=0)), count))
        for carry, start in zip(carries, inits):
            self.kernel("aten::copy_.default", (carry, start, self.add(Bool(bool_val=False)), carry))
        slices = [self.tensor_value(cast(TensorMeta, m), where=where, planned=True, start=self.step)
                  for m in slice_metas]
        loop_start = len(self.instructions)
        for source, row in zip(sources, slices):
            self.kernel("aten::select_copy.int_out", (source, self.add(Int(int_val=0)), index, row, row))
        results = self.emit_branch(body, [*carries, *slices, *operands], outs, where=where)
        for carry, new in zip(carries, results):
            self.kernel("aten::copy_.default", (carry, new, self.add(Bool(bool_val=False)), carry))
        for y, row_result in zip(stacked, results[len(carries):]):
            self.kernel("executorch_prim::et_copy_index.tensor", (y, row_result, index))
        self.kernel("executorch_prim::add.Scalar", (index, self.add(Int(int_val=1)), index))
        done = self.add(Bool(bool_val=False))
        self.kernel("executorch_prim::eq.Scalar", (index, count, done))
        self.instructions.append(Instruction(instr_args=JumpFalseCall(
            cond_value_index=done, destination_instruction=loop_start)))
        self.kernel("executorch_prim::sub.Scalar", (index, count, index))
        self.keep_live(first_storage, (*inits, *sources, *operands))
        self.by_name[node.name] = tuple(outs)

    @staticmethod
    def check_stackable(meta: TensorMeta, what: str, *, where: str) -> None:
        """et_copy_index grows a loop's stacked result along dim 0 only and checks that its other
        dims, which a dynamic tensor starts at their upper bounds, equal each step's: a symbolic
        dim there fails the run (0x12) whenever it is below its bound, in ExecuTorch's `.pte` too."""
        symbolic = [str(d) for d in meta.shape[1:] if isinstance(d, str)]
        if symbolic:
            raise EmitError(
                f"{where}: {what} has dynamic dims {symbolic} besides the loop's; the ExecuTorch runtime's "
                "et_copy_index stacks rows of a fixed shape and fails whenever they are below their bound "
                "(export those dims static, e.g. pad the input to the maximum)"
            )

    def keep_live(self, first_storage: int, operands: tuple[int, ...]) -> None:
        """A loop's body runs many times: the tensors planned since `first_storage` and the
        operands it reads stay live (unshared) to the end of the method."""
        for storage in self.storages[first_storage:]:
            storage.end = self.last_step
        for value_index in operands:
            value = self.values[value_index]
            if isinstance(value, PendingTensor) and value.storage is not None:
                self.storages[value.storage].end = self.last_step

    def emit_branch(
        self, graph: Graph, operands: list[int], outs: list[int], *, where: str, group: int | None = None
    ) -> list[int]:
        """The body's nodes, its placeholders bound to `operands`; the values it returns. With a
        `group` (a cond branch), its tensors are planned in that group, steps counting its nodes;
        a loop body's stay in the enclosing group (they are kept live, `keep_live`)."""
        placeholders = [n for n in graph.nodes if isinstance(n, Placeholder)]
        if len(placeholders) != len(operands):
            raise EmitError(f"{where}: body takes {len(placeholders)} inputs, the call passes {len(operands)}")
        saved = (self.by_name, self.metas, self.graph, self._output_names)
        saved_steps = (self.group, self.step, self.last_step)
        self.by_name, self.metas, self.graph, self._output_names = {}, {}, graph, None
        if group is not None:
            self.group, self.last_step = group, len(graph.nodes)
        try:
            for ph, index in zip(placeholders, operands):
                self.by_name[ph.name] = index
                self.metas[ph.name] = graph.meta(ph)
            results: list[int] = []
            for step, n in enumerate(graph.nodes):
                if group is not None:
                    self.step = step
                if isinstance(n, GetAttr):
                    self.metas[n.name] = graph.meta(n)
                elif isinstance(n, CallFunction):
                    self.metas[n.name] = graph.meta(n)
                    self.where = f"{where} > {n.name!r} ({n.target})"
                    self.emit_call(n, where=self.where)
                elif isinstance(n, Output):
                    results = [self.scalar(a, where=where) for a in n.args]
        finally:
            self.by_name, self.metas, self.graph, self._output_names = saved
            self.group, self.step, self.last_step = saved_steps
        if len(results) != len(outs):
            raise EmitError(f"{where}: body returns {len(results)} values, the call has {len(outs)} results")
        return results
