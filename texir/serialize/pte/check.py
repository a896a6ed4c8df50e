"""Index references of a logical `.pte` program checked the way the ExecuTorch runtime checks them
at load: a value, operator, delegate, buffer or instruction index out of range is an error naming
the table and the index, before any consumer dereferences it."""

from __future__ import annotations

from collections.abc import Callable

from texir.errors import PteError
from texir.serialize.pte import schema as s

__all__ = ["check_indices"]


def check_indices(pte: s.PteProgram, error: Callable[[str], PteError]) -> None:
    """Raise `error(message)` for the first index reference that points outside its table."""
    p = pte.program
    n_constants = len(p.constant_buffer)
    n_blobs = len(p.backend_delegate_data)
    for plan in p.execution_plan:
        where = f"ExecutionPlan {plan.name!r}"
        n_values = len(plan.values)

        def value(index: int, what: str, *, optional: bool = False) -> None:
            if optional and index == -1:
                return
            if not 0 <= index < n_values:
                raise error(f"{where}.{what} = {index} is outside values (size {n_values})")

        for i, index in enumerate(plan.inputs):
            value(index, f"inputs[{i}]")
        for i, index in enumerate(plan.outputs):
            value(index, f"outputs[{i}]")
        for v, ev in enumerate(plan.values):
            val = ev.val
            if isinstance(val, s.Tensor):
                external = val.extra_tensor_info is not None and val.extra_tensor_info.location == s.TensorDataLocation.EXTERNAL
                if (
                    val.data_buffer_idx and val.allocation_info is None and not external
                    and not (p.constant_segment is not None or val.data_buffer_idx < n_constants)
                ):
                    raise error(
                        f"{where}.values[{v}] (Tensor).data_buffer_idx = {val.data_buffer_idx} is outside "
                        f"constant_buffer (size {n_constants})"
                    )
                if len(val.dim_order) != len(val.sizes):
                    raise error(f"{where}.values[{v}] (Tensor): dim_order has {len(val.dim_order)} entries for {len(val.sizes)} sizes")
            elif isinstance(val, (s.TensorList, s.IntList)):
                for k, item in enumerate(val.items):
                    value(item, f"values[{v}] ({type(val).__name__}).items[{k}]")
            elif isinstance(val, s.OptionalTensorList):
                for k, item in enumerate(val.items):
                    value(item, f"values[{v}] (OptionalTensorList).items[{k}]", optional=True)
        for d, delegate in enumerate(plan.delegates):
            ref = delegate.processed
            if ref.location == s.DataLocation.INLINE and not 0 <= ref.index < n_blobs:
                raise error(
                    f"{where}.delegates[{d}] ({delegate.id}).processed.index = {ref.index} is outside "
                    f"backend_delegate_data (size {n_blobs})"
                )
        for c, chain in enumerate(plan.chains):
            n_instructions = len(chain.instructions)
            for i, index in enumerate(chain.inputs):
                value(index, f"chains[{c}].inputs[{i}]")
            for i, index in enumerate(chain.outputs):
                value(index, f"chains[{c}].outputs[{i}]")
            for k, instruction in enumerate(chain.instructions):
                at = f"chains[{c}].instructions[{k}]"
                args = instruction.instr_args
                if isinstance(args, s.KernelCall):
                    if not 0 <= args.op_index < len(plan.operators):
                        raise error(f"{where}.{at} (KernelCall).op_index = {args.op_index} is outside operators (size {len(plan.operators)})")
                    for a, index in enumerate(args.args):
                        value(index, f"{at} (KernelCall).args[{a}]")
                elif isinstance(args, s.DelegateCall):
                    if not 0 <= args.delegate_index < len(plan.delegates):
                        raise error(
                            f"{where}.{at} (DelegateCall).delegate_index = {args.delegate_index} is outside "
                            f"delegates (size {len(plan.delegates)})"
                        )
                    for a, index in enumerate(args.args):
                        value(index, f"{at} (DelegateCall).args[{a}]")
                elif isinstance(args, s.MoveCall):
                    value(args.move_from, f"{at} (MoveCall).move_from")
                    value(args.move_to, f"{at} (MoveCall).move_to")
                elif isinstance(args, s.JumpFalseCall):
                    value(args.cond_value_index, f"{at} (JumpFalseCall).cond_value_index")
                    if not 0 <= args.destination_instruction <= n_instructions:
                        raise error(
                            f"{where}.{at} (JumpFalseCall).destination_instruction = {args.destination_instruction} "
                            f"is outside the chain ({n_instructions} instructions)"
                        )
                elif isinstance(args, s.FreeCall):
                    value(args.value_index, f"{at} (FreeCall).value_index")
