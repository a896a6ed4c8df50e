"""The .pte emitter and memory planner: rules of the fact sheet, planner safety, determinism, errors."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.zoo import cached_export
from texir.adapters import from_exported_program
from texir.ir.op_facts import is_view, op_schema, out_variant, view_copy_target
from texir.ir import (
    CallFunction,
    GraphSignature,
    IntArg,
    Output,
    Placeholder,
    Program,
    RangeConstraint,
    Ref,
    TensorMeta,
    UserInput,
    UserOutput,
    build_graph,
)
from texir.ir.types import DType
from texir.emit import EmitError, EmitOptions, MemoryPlanError, check_plan, emit, plan_memory
from texir.emit.memory_plan import Interval, MemoryPlan
from texir.serialize.pte import (
    Int,
    IntList,
    KernelCall,
    Null,
    Tensor,
    TensorList,
    dumps,
)
from texir.executorch.runtime import load_method


def _program(name: str) -> Program:
    return from_exported_program(cached_export(name), decompose=False)


def _kernels(pte: object) -> list[tuple[str, tuple[int, ...]]]:
    plan = pte.program.execution_plan[0]  # type: ignore[attr-defined]
    out = []
    for ins in plan.chains[0].instructions:
        if isinstance(ins.instr_args, KernelCall):
            op = plan.operators[ins.instr_args.op_index]
            out.append((f"{op.name}.{op.overload}", ins.instr_args.args))
    return out


# --- op schema table ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "out"),
    [
        ("aten::add.Tensor", "aten::add.out"),
        ("aten::max.dim", "aten::max.dim_max"),
        ("aten::index.Tensor", "aten::index.Tensor_out"),
        ("aten::full.default", "aten::full.out"),
        ("aten::split_copy.Tensor", "aten::split_copy.Tensor_out"),
        ("dim_order_ops::_to_dim_order_copy.default", "dim_order_ops::_to_dim_order_copy.out"),
        ("aten::add.out", "aten::add.out"),
    ],
)
def test_out_variant_table(target: str, out: str) -> None:
    variant = out_variant(target)
    assert variant is not None and variant.target == out


def test_view_table_and_defaults() -> None:
    assert view_copy_target("aten::permute.default") == "aten::permute_copy.default"
    assert view_copy_target("aten::_unsafe_view.default") == "aten::view_copy.default"
    assert is_view("aten::select.int") and not is_view("aten::add.Tensor")
    assert out_variant("aten::copy_.default") is None
    alpha = op_schema("aten::add.out").arguments[2]
    assert (alpha.name, alpha.default) == ("alpha", IntArg(value=1))


# --- emission rules -------------------------------------------------------------------------------


def test_mlp_follows_exir_argument_rules() -> None:
    pte = emit(_program("mlp"))
    plan = pte.program.execution_plan[0]
    kernels = _kernels(pte)
    assert [k for k, _ in kernels] == [
        "aten::permute_copy.out", "aten::addmm.out", "aten::relu.out", "aten::permute_copy.out",
        "aten::addmm.out",
    ]
    # permute_copy.out(self, dims, *, out) + return slot = the out tensor again; dims an IntList of Ints.
    _, args = kernels[0]
    assert len(args) == 4 and args[2] == args[3]
    dims = plan.values[args[1]].val
    assert isinstance(dims, IntList)
    assert [plan.values[i].val for i in dims.items] == [Int(int_val=1), Int(int_val=0)]
    # addmm.out(self, mat1, mat2, *, beta=1, alpha=1, out) + return slot: defaults written out.
    _, args = kernels[1]
    assert len(args) == 7 and plan.values[args[3]].val == Int(int_val=1) and args[5] == args[6]
    # Parameters are constants; the user input is planned and listed.
    (x,) = plan.inputs
    x_val = plan.values[x].val
    assert isinstance(x_val, Tensor) and x_val.allocation_info is not None
    assert plan.non_const_buffer_sizes[0] == 0
    consts = [v.val for v in plan.values if isinstance(v.val, Tensor) and v.val.data_buffer_idx]
    assert len(consts) == 4 and all(t.allocation_info is None for t in consts)


def test_multi_output_op_returns_tensor_list_and_getitem_emits_nothing() -> None:
    pte = emit(_program("max_dim"))
    plan = pte.program.execution_plan[0]
    (op, args), *_ = [k for k in _kernels(pte) if k[0] == "aten::max.dim_max"]
    ret = plan.values[args[-1]].val
    assert isinstance(ret, TensorList) and ret.items == args[3:5]
    assert set(plan.outputs) <= set(range(len(plan.values)))


def test_constants_are_deduplicated_and_zero_copy() -> None:
    program = _program("mlp")
    pte = emit({"a": program, "b": program})
    assert [p.name for p in pte.program.execution_plan] == ["a", "b"]
    buffers = pte.program.constant_buffer
    assert len(buffers) == 1 + len(program.state) and buffers[0].storage.nbytes == 0
    by_digest = {e.value.data.digest(): e.value.data for e in program.state if e.value.data}
    for buf in buffers[1:]:
        source = by_digest[buf.storage.digest()]
        # The emitted payload is a view of the program's own bytes, not a copy.
        assert buf.storage.view().obj is source.view().obj


def test_mutable_buffer_is_written_back_with_copy() -> None:
    pte = emit(_program("running_stats"))
    plan = pte.program.execution_plan[0]
    copies = [args for op, args in _kernels(pte) if op == "aten::copy_."]
    assert copies
    for buf, _src, false, ret in copies:
        assert ret == buf and buf not in plan.inputs
        buf_val = plan.values[buf].val
        assert isinstance(buf_val, Tensor) and buf_val.allocation_info is not None


def test_dynamic_shapes_are_planned_at_upper_bound() -> None:
    pte = emit(_program("dynamic_mlp"))
    plan = pte.program.execution_plan[0]
    x = plan.values[plan.inputs[0]].val
    assert isinstance(x, Tensor) and x.shape_dynamism == 1 and x.sizes[0] == 64


def test_naive_planner_never_reuses() -> None:
    greedy = emit(_program("deep_mlp")).program.execution_plan[0].non_const_buffer_sizes[1]
    naive = emit(_program("deep_mlp"), EmitOptions(planner="naive")).program.execution_plan[0]
    assert naive.non_const_buffer_sizes[1] > greedy
    offsets = [v.val.allocation_info.memory_offset for v in naive.values
               if isinstance(v.val, Tensor) and v.val.allocation_info is not None]
    assert len(offsets) == len(set(offsets))


def test_naive_plan_runs_in_the_runtime() -> None:
    from executorch.runtime import Runtime

    from tests.zoo import zoo_model

    m = zoo_model("deep_mlp")
    module, args = m.build()
    data = dumps(emit(_program("deep_mlp"), EmitOptions(planner="naive")))
    (got,) = load_method(data).execute(list(args))
    torch.testing.assert_close(got, module(*args), rtol=1e-5, atol=1e-6)


def test_emit_does_not_modify_its_input() -> None:
    program = _program("attention")
    before = program
    emit(program)
    assert program == before and program is before


# --- errors ---------------------------------------------------------------------------------------


def _one_op_program(target: str, meta: TensorMeta, shape_symbol: bool = False) -> Program:
    x_meta = TensorMeta(dtype=DType.float32, shape=("s0",) if shape_symbol else (2,), strides=(1,))
    return Program(
        graph=build_graph([
            (Placeholder(name="x"), x_meta, None),
            (CallFunction(name="y", target=target, args=(Ref(name="x"),)), meta, None),
            (Output(args=(Ref(name="y"),)), None, None),
        ]),
        signature=GraphSignature(inputs=(UserInput(arg=Ref(name="x")),),
                                 outputs=(UserOutput(arg=Ref(name="y")),)),
        range_constraints=(RangeConstraint(symbol="s0", min=2, max=None),) if shape_symbol else (),
    )


def test_op_without_out_variant_names_node_and_op() -> None:
    meta = TensorMeta(dtype=DType.float32, shape=(2,), strides=(1,))
    with pytest.raises(EmitError, match=r"node 'y'.*aten::_fft_r2c|node 'y'.*no out variant"):
        emit(_one_op_program("aten::_sparse_coo_tensor_unsafe.default", meta))


def test_unknown_op_is_a_pte_error() -> None:
    meta = TensorMeta(dtype=DType.float32, shape=(2,), strides=(1,))
    with pytest.raises(EmitError, match="not known to torch"):
        emit(_one_op_program("aten::no_such_op.default", meta))


def test_unbounded_dynamic_dim_says_how_to_fix() -> None:
    meta = TensorMeta(dtype=DType.float32, shape=("s0",), strides=(1,))
    with pytest.raises(EmitError, match=r"no upper bound.*max="):
        emit(_one_op_program("aten::sin.default", meta, shape_symbol=True))


def test_sin_program_emits_minimal_kernel() -> None:
    meta = TensorMeta(dtype=DType.float32, shape=(2,), strides=(1,))
    pte = emit(_one_op_program("aten::sin.default", meta))
    ((op, args),) = _kernels(pte)
    assert op == "aten::sin.out" and args[1] == args[2]
    plan = pte.program.execution_plan[0]
    assert not any(isinstance(v.val, Null) for v in plan.values)


# --- memory planner ---------------------------------------------------------------------------------


def test_checker_rejects_overlap() -> None:
    intervals = [Interval(size=32, start=0, end=3), Interval(size=32, start=2, end=5)]
    with pytest.raises(MemoryPlanError, match="overlap"):
        check_plan(intervals, MemoryPlan(offsets=(0, 16), total=64))
    check_plan(intervals, MemoryPlan(offsets=(0, 32), total=64))
    with pytest.raises(MemoryPlanError, match="arena"):
        check_plan(intervals, MemoryPlan(offsets=(0, 48), total=64))


def test_greedy_reuses_dead_tensors() -> None:
    chain = [Interval(size=64, start=i, end=i + 1) for i in range(10)]
    plan = plan_memory(chain)
    check_plan(chain, plan)
    assert plan.total == 128


_intervals = st.lists(
    st.tuples(st.integers(0, 300), st.integers(0, 30), st.integers(0, 12)).map(
        lambda t: Interval(size=t[0], start=t[1], end=t[1] + t[2])
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(_intervals, st.sampled_from(["greedy", "naive"]))
def test_planners_never_overlap_live_tensors(intervals: list[Interval], planner: str) -> None:
    plan = plan_memory(intervals, planner=planner)  # type: ignore[arg-type]
    check_plan(intervals, plan)
    assert all(off % 16 == 0 for off in plan.offsets)
    assert plan.total <= sum((i.size + 15) // 16 * 16 for i in intervals)


# --- determinism ------------------------------------------------------------------------------------

_SCRIPT = """
import hashlib, sys, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, {root!r})
from tests.zoo import cached_export
from texir.adapters import from_exported_program
from texir.emit import emit
from texir.serialize.pte import dumps
for name in ("attention", "running_stats", "dynamic_seq"):
    data = dumps(emit(from_exported_program(cached_export(name), decompose=False)))
    print(name, hashlib.sha256(data).hexdigest())
"""


def test_bytes_do_not_depend_on_hash_seed() -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    outputs = []
    for seed in ("0", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        result = subprocess.run(
            [sys.executable, "-c", _SCRIPT.format(root=root)], env=env, capture_output=True,
            text=True, timeout=300, check=True,
        )
        outputs.append(result.stdout)
    assert outputs[0] == outputs[1] and outputs[0].count("\n") == 3
    local = dumps(emit(_program("attention")))
    assert f"attention {hashlib.sha256(local).hexdigest()}" in outputs[0]


def test_unsupported_control_flow_names_node() -> None:
    meta = TensorMeta(dtype=DType.float32, shape=(2,), strides=(1,))
    with pytest.raises(EmitError, match=r"node 'y'.*higher_order::while_loop.*not supported.*torch.cond, torch.map or torch.scan"):
        emit(_one_op_program("higher_order::while_loop", meta))
    with pytest.raises(EmitError, match=r"node 'y'.*higher_order::map_impl.*map_impl needs \(body_graph, \[mapped\], \[operands\]\)"):
        emit(_one_op_program("higher_order::map_impl", meta))


def test_unplanned_inputs_and_outputs_run_in_the_runtime() -> None:
    from executorch.runtime import Runtime

    from tests.zoo import zoo_model

    options = EmitOptions(alloc_graph_input=False, alloc_graph_output=False)
    pte = emit(_program("mlp"), options)
    plan = pte.program.execution_plan[0]
    for index in (*plan.inputs, *plan.outputs):
        value = plan.values[index].val
        assert isinstance(value, Tensor) and value.allocation_info is None
    module, args = zoo_model("mlp").build()
    (got,) = load_method(dumps(pte)).execute(list(args))
    torch.testing.assert_close(got, module(*args), rtol=1e-5, atol=1e-6)


_INLINE = """program dialect=EDGE
  inputs:
    %x: user_input
  outputs:
    %{user}: user_output
graph():
  %x : f32[2, 3] = placeholder
  %c : f32[] = texir::inline_constant(2)
  %{user} : f32[2, 3] = aten::{op}(%x, %c)
  return (%{user},)
"""


def test_an_inline_constant_is_emitted_at_its_user_and_cast_to_its_dtype() -> None:
    import texir.serialize.pte as pte
    from texir.ir import parse_program

    program = emit(parse_program(_INLINE.format(user="mul", op="mul.Tensor")))
    plan = program.program.execution_plan[0]
    ops = [plan.operators[i.instr_args.op_index].name for i in plan.chains[0].instructions]
    assert ops == ["dim_order_ops::_to_dim_order_copy", "aten::mul"]  # the int64 2 cast to float, then used
    values = plan.values
    # value 0 is the user input (nothing lifted before it), then the int64 constant and its float copy
    assert [getattr(values[i].val, "scalar_type", None) for i in range(3)] == [
        pte.ScalarType.FLOAT, pte.ScalarType.LONG, pte.ScalarType.FLOAT,
    ]


def test_an_inline_constant_read_twice_is_a_typed_error() -> None:
    from texir.ir import parse_program

    text = _INLINE.format(user="mul", op="mul.Tensor").replace(
        "  return (%mul,)", "  %add : f32[2, 3] = aten::add.Tensor(%mul, %c)\n  return (%add,)"
    ).replace("%mul: user_output", "%add: user_output")
    program = parse_program(text)
    with pytest.raises(EmitError, match=r"inline constant 'c' is read where it cannot be emitted inline"):
        emit(program)
