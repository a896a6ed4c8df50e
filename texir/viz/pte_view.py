"""A stable outline text of a `.pte` program (methods, operators, delegates, values, instructions)
and of a `.bpte` (its program, then its cases), in the indentation style `texir.viz.diff`
compares, for snapshots and `texir diff`."""

from __future__ import annotations

import hashlib

from texir.serialize import bpte
from texir.serialize.bpte.check import dtype_name
from texir.serialize.pte import schema as s
from texir.serialize.pte.codec import loads as loads_pte

__all__ = ["bundle_text", "pte_text"]


def _sha(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _value(v: s.EValue, program: s.Program) -> str:
    val = v.val
    if isinstance(val, s.Tensor):
        text = f"tensor {val.scalar_type.name.lower()}{list(val.sizes)}"
        if tuple(val.dim_order) != tuple(range(len(val.sizes))):
            text += f" dim_order={list(val.dim_order)}"
        if val.shape_dynamism != s.TensorShapeDynamism.STATIC:
            text += f" {val.shape_dynamism.name.lower()}"
        if val.data_buffer_idx:
            idx = val.data_buffer_idx
            buffers = program.constant_buffer
            if 0 <= idx < len(buffers):
                text += f" const sha256={_sha(buffers[idx].storage.view())}"
            else:
                text += f" const #{idx}"
        if val.allocation_info is not None:
            a = val.allocation_info
            offset = a.memory_offset_low + (a.memory_offset_high << 32)
            text += f" mem{a.memory_id}+{offset}"
        if val.extra_tensor_info is not None and val.extra_tensor_info.fully_qualified_name:
            text += f" fqn={val.extra_tensor_info.fully_qualified_name}"
        return text
    if isinstance(val, s.Null):
        return "null"
    if isinstance(val, s.Int):
        return f"int {val.int_val}"
    if isinstance(val, s.Bool):
        return f"bool {val.bool_val}"
    if isinstance(val, s.Double):
        return f"double {val.double_val!r}"
    if isinstance(val, s.String):
        return f"string {val.string_val!r}"
    if isinstance(val, (s.IntList, s.DoubleList, s.BoolList)):
        return f"{type(val).__name__} {list(val.items)}"
    if isinstance(val, (s.TensorList, s.OptionalTensorList)):
        return f"{type(val).__name__} [{', '.join(f'%{i}' for i in val.items)}]"
    return type(val).__name__


def _operator(op: s.Operator) -> str:
    return f"{op.name}.{op.overload}" if op.overload else op.name


def _refs(items: tuple[int, ...]) -> str:
    return ", ".join(f"%{i}" for i in items)


def _instruction(ins: s.Instruction, plan: s.ExecutionPlan) -> str:
    arg = ins.instr_args
    if isinstance(arg, s.KernelCall):
        ops = plan.operators
        name = _operator(ops[arg.op_index]) if 0 <= arg.op_index < len(ops) else f"op#{arg.op_index}"
        return f"kernel {name}({_refs(arg.args)})"
    if isinstance(arg, s.DelegateCall):
        dels = plan.delegates
        name = dels[arg.delegate_index].id if 0 <= arg.delegate_index < len(dels) else "?"
        return f"delegate #{arg.delegate_index} {name}({_refs(arg.args)})"
    if isinstance(arg, s.MoveCall):
        return f"move %{arg.move_from} -> %{arg.move_to}"
    if isinstance(arg, s.JumpFalseCall):
        return f"jump_false %{arg.cond_value_index} -> [{arg.destination_instruction}]"
    if isinstance(arg, s.FreeCall):
        return f"free %{arg.value_index}"
    return type(arg).__name__


def _delegate_blob(d: s.BackendDelegate, program: s.Program) -> str:
    ref = d.processed
    if ref.location == s.DataLocation.INLINE and 0 <= ref.index < len(program.backend_delegate_data):
        data = program.backend_delegate_data[ref.index].data
        return f"processed={data.nbytes}B sha256={_sha(data.view())}"
    return f"processed={ref.location.name.lower()}#{ref.index}"


def pte_text(pte: s.PteProgram) -> str:
    program = pte.program
    out = [f"pte version={program.version}"]
    for plan in program.execution_plan:
        out.append(f"method {plan.name}:")
        out.append(f"  inputs: [{', '.join(f'%{i}' for i in plan.inputs)}]")
        out.append(f"  outputs: [{', '.join(f'%{i}' for i in plan.outputs)}]")
        out.append(f"  non_const_buffer_sizes: {list(plan.non_const_buffer_sizes)}")
        if plan.operators:
            out.append("  operators:")
            out.extend(f"    {_operator(op)}" for op in plan.operators)
        if plan.delegates:
            out.append("  delegates:")
            for i, d in enumerate(plan.delegates):
                out.append(f"    [{i}] backend={d.id} {_delegate_blob(d, program)}")
                out.extend(f"      compile_spec {c.key}={bytes(c.value).hex()}" for c in d.compile_specs)
        out.append("  values:")
        out.extend(f"    [{i}] {_value(v, program)}" for i, v in enumerate(plan.values))
        for ci, chain in enumerate(plan.chains):
            out.append(f"  chain {ci}:")
            out.append(f"    inputs: [{', '.join(f'%{i}' for i in chain.inputs)}]")
            out.append(f"    outputs: [{', '.join(f'%{i}' for i in chain.outputs)}]")
            out.append("    instructions:")
            out.extend(f"      [{k}] {_instruction(ins, plan)}" for k, ins in enumerate(chain.instructions))
    if len(program.constant_buffer) > 1:
        out.append("constant_buffer:")
        for i, buf in enumerate(program.constant_buffer[1:], start=1):
            out.append(f"  [{i}] {buf.storage.nbytes}B sha256={_sha(buf.storage.view())}")
    if pte.named_data:
        out.append("named_data:")
        out.extend(f"  {nd.key}={nd.data.nbytes}B sha256={_sha(nd.data.view())}" for nd in pte.named_data)
    return "\n".join(out) + "\n"


def _bundled_value(v: bpte.Value) -> str:
    val = v.val
    if isinstance(val, bpte.Tensor):
        text = f"tensor {dtype_name(val.scalar_type)}{list(val.sizes)}"
        if tuple(val.dim_order) != tuple(range(len(val.sizes))):
            text += f" dim_order={list(val.dim_order)}"
        return f"{text} {val.data.nbytes}B sha256={_sha(val.data.view())}"
    if isinstance(val, bpte.Int):
        return f"int {val.int_val}"
    if isinstance(val, bpte.Bool):
        return f"bool {val.bool_val}"
    return f"double {val.double_val!r}"


def bundle_text(bundle: bpte.BundledProgram) -> str:
    """The outline of a bundled program: its `.pte`'s (as `pte_text`), then each method's cases
    (inputs and expected outputs by dtype, shape and content hash)."""
    out = [f"bpte version={bundle.version}", pte_text(loads_pte(bundle.program.view())).rstrip("\n")]
    for suite in bundle.method_test_suites:
        out.append(f"cases {suite.method_name}:")
        for k, case in enumerate(suite.test_cases):
            out.append(f"  case {k}:")
            out.extend(f"    input [{i}] {_bundled_value(v)}" for i, v in enumerate(case.inputs))
            out.extend(f"    expected [{i}] {_bundled_value(v)}" for i, v in enumerate(case.expected_outputs))
    return "\n".join(out) + "\n"
