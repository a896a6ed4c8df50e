"""Conformance of texir's .pte output against the ExecuTorch 1.5.1 runtime, deserializer and emitter."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import torch
import torch.utils._pytree as pytree

from tests.zoo import ZOO, cached_export, example_argsets, zoo_model
import texir.backends  # noqa: F401  (registers the demo and reference backends)
from texir.adapters import from_exported_program
from texir.ir import CallFunction, CompileSpec, Program
from texir.lowering import DelegationSpec, PartitionPlan, get_lowered_submodules, to_backend
from texir.emit import EmitOptions, emit
from texir.serialize.pte import dumps, loads
from texir.executorch.runtime import RuntimeRunError, load_method

# Kernels the ExecuTorch 1.5.1 pip runtime does not register: a .pte using them fails to load, and
# ExecuTorch's own .pte of the same model fails the same way (checked below).
RUNTIME_MISSING_KERNEL = {"topk": "aten::sort.values"}
COND_MODELS = [m.name for m in ZOO if "cond" in m.tags]
RUNNABLE = [m.name for m in ZOO if m.name not in RUNTIME_MISSING_KERNEL]
EMITTABLE = [m.name for m in ZOO]


@functools.cache
def texir_program(name: str) -> Program:
    return from_exported_program(cached_export(name), decompose=False)


@functools.cache
def texir_pte(name: str) -> bytes:
    # A model whose kernel the runtime lacks is refused by default (tests/test_runtime_ops.py);
    # written anyway here to show the runtime fails on it exactly as on ExecuTorch's own .pte.
    return dumps(emit(texir_program(name), EmitOptions(check_plan=True, check_operators=name not in RUNTIME_MISSING_KERNEL)))


@functools.cache
def executorch_pte(name: str) -> bytes:
    from executorch import exir

    m = zoo_model(name)
    module, args = m.build()
    ep = torch.export.export(module, args, dynamic_shapes=m.dynamic_shapes, strict=False)
    return bytes(exir.to_edge(ep).to_executorch().buffer)


def _runtime() -> Any:
    from executorch.runtime import Runtime

    return Runtime.get()


def _kernel_ops(program: Any) -> list[str]:
    plan = program.execution_plan[0]
    ops = []
    for instruction in plan.chains[0].instructions:
        args = instruction.instr_args
        if hasattr(args, "op_index"):
            op = plan.operators[args.op_index]
            ops.append(f"{op.name}.{op.overload}")
        elif hasattr(args, "destination_instruction"):
            ops.append(f"{type(args).__name__}->{args.destination_instruction}")
        else:
            ops.append(type(args).__name__)
    return ops


@pytest.mark.parametrize("name", RUNNABLE)
def test_runtime_matches_eager(name: str) -> None:
    m = zoo_model(name)
    module, _ = m.build()
    method = load_method(texir_pte(name))
    calls = 0
    for args in example_argsets(m):
        for _ in range(3 if m.stateful else 1):
            got = method.execute(pytree.tree_leaves(args))
            with torch.no_grad():
                expected = pytree.tree_leaves(module(*args))
            assert len(got) == len(expected)
            for g, e in zip(got, expected):
                torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
            calls += 1
    assert calls >= (2 if m.alt_args is not None or m.stateful else 1)


def test_zoo_coverage() -> None:
    assert len(RUNNABLE) >= 25
    assert {"dynamic_mlp", "dynamic_conv", "dynamic_seq"} <= set(RUNNABLE)
    assert any(zoo_model(n).stateful for n in RUNNABLE)


@pytest.mark.parametrize("name", sorted(RUNTIME_MISSING_KERNEL))
def test_missing_runtime_kernel_fails_like_executorch(name: str) -> None:
    from executorch.exir._serialize._program import deserialize_pte_binary

    ours = texir_pte(name)
    theirs = executorch_pte(name)
    kernel = RUNTIME_MISSING_KERNEL[name]
    assert kernel in _kernel_ops(deserialize_pte_binary(ours).program)
    assert kernel in _kernel_ops(deserialize_pte_binary(theirs).program)
    for data in (ours, theirs):
        with pytest.raises(RuntimeRunError):
            load_method(data)


@pytest.mark.parametrize("name", COND_MODELS)
def test_cond_is_inlined_with_jumps(name: str) -> None:
    from texir.serialize.pte import JumpFalseCall, MoveCall

    plan = emit(texir_program(name)).program.execution_plan[0]
    instructions = [i.instr_args for i in plan.chains[0].instructions]
    jumps = [(k, i) for k, i in enumerate(instructions) if isinstance(i, JumpFalseCall)]
    assert len(jumps) >= 2 and any(isinstance(i, MoveCall) for i in instructions)
    for _, jump in jumps:
        assert 0 < jump.destination_instruction <= len(instructions)
    # Both branches were taken by the runtime test above: the zoo's alt_args flip the predicate.
    assert zoo_model(name).alt_args is not None


@pytest.mark.parametrize("name", EMITTABLE)
def test_executorch_deserializer_reads_texir_pte(name: str) -> None:
    from executorch.exir._serialize._program import deserialize_pte_binary

    data = texir_pte(name)
    theirs = deserialize_pte_binary(data).program
    ours = loads(data).program
    assert len(theirs.execution_plan) == 1
    plan, our_plan = theirs.execution_plan[0], ours.execution_plan[0]
    assert plan.name == "forward"
    assert len(plan.values) == len(our_plan.values)
    assert list(plan.inputs) == list(our_plan.inputs)
    assert list(plan.outputs) == list(our_plan.outputs)
    assert list(plan.non_const_buffer_sizes) == list(our_plan.non_const_buffer_sizes)
    assert len(plan.chains[0].instructions) == len(our_plan.chains[0].instructions)
    # Constants come back as the same payloads (ExecuTorch's reader keeps the alignment padding).
    # Without constants the file has no segments, and ExecuTorch's reader leaves the list empty.
    if len(ours.constant_buffer) > 1:
        assert len(theirs.constant_buffer) == len(ours.constant_buffer)
    else:
        assert len(theirs.constant_buffer) == 0
    for their_buf, our_buf in zip(theirs.constant_buffer, ours.constant_buffer):
        payload = our_buf.storage.tobytes()
        assert bytes(their_buf.storage)[: len(payload)] == payload
        assert len(their_buf.storage) - len(payload) < 16


# Models whose kernel sequence equals ExecuTorch's to_edge().to_executorch() output exactly. (Not
# compared: norms, which ExecuTorch's to_edge rejects: var_mean is not core ATen there; it still
# matches eager above.) Jumps are compared with their destinations.
SAME_KERNELS_AS_EXECUTORCH = [
    "mlp", "deep_mlp", "conv_bn", "convnet", "conv_relu_tan", "attention", "transformer_block",
    "direct_params", "running_stats", "tuple_inputs", "dict_io", "nested_io", "max_dim", "split_chunk",
    "int_lists", "embedding", "resnet_tiny", "residual_mlp", "where_mask", "factories", "pad_slice",
    "matmul_variants", "dynamic_mlp", "dynamic_conv", "dynamic_seq", "buffers", "lifted_constant",
    "multi_output", "scalars", "index_gather", "dtypes", "topk", "cat_stack", "cond_simple",
    "cond_closure_nested", "cond_multi_output",
]


@pytest.mark.parametrize("name", SAME_KERNELS_AS_EXECUTORCH)
def test_kernel_calls_equal_executorch(name: str) -> None:
    from executorch.exir._serialize._program import deserialize_pte_binary

    ours = deserialize_pte_binary(texir_pte(name)).program
    theirs = deserialize_pte_binary(executorch_pte(name)).program
    assert _kernel_ops(ours) == _kernel_ops(theirs)
    a, b = ours.execution_plan[0], theirs.execution_plan[0]
    # Same argument-list lengths: every default and the return slot, as exir writes them.
    assert [len(getattr(i.instr_args, "args", ())) for i in a.chains[0].instructions] == [
        len(getattr(i.instr_args, "args", ())) for i in b.chains[0].instructions
    ]
    assert (len(a.inputs), len(a.outputs)) == (len(b.inputs), len(b.outputs))
    assert a.container_meta_type.encoded_inp_str == b.container_meta_type.encoded_inp_str
    assert a.container_meta_type.encoded_out_str == b.container_meta_type.encoded_out_str
    assert [(o.name, o.overload) for o in a.operators] == [(o.name, o.overload) for o in b.operators]


def test_several_methods_load_and_run() -> None:
    pte = emit({"mlp": texir_program("mlp"), "forward": texir_program("deep_mlp")})
    assert [p.name for p in pte.program.execution_plan] == ["forward", "mlp"]
    program = _runtime().load_program(dumps(pte))
    for method, name in (("forward", "deep_mlp"), ("mlp", "mlp")):
        module, args = zoo_model(name).build()
        (got,) = program.load_method(method).execute(list(args))
        torch.testing.assert_close(got, module(*args), rtol=1e-5, atol=1e-6)


# --- delegated programs ---------------------------------------------------------------------------

DEMO_ID = "BackendWithDelegateMappingDemo"
TAIL_FROM = 2  # calls from the second conv on are delegated


def _demo_model() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    module, args = zoo_model("conv_relu_tan").build()
    return module, args


def _texir_tail(program: Program) -> PartitionPlan:
    calls = [n.name for n in program.graph.nodes if isinstance(n, CallFunction)]
    return PartitionPlan.build(
        {name: "tail" for name in calls[TAIL_FROM:]},
        {"tail": DelegationSpec(backend_id=DEMO_ID, compile_specs=(CompileSpec(key="level", value=b"\x03"),))},
    )


def _executorch_tail() -> Any:
    from executorch.exir.backend.compile_spec_schema import CompileSpec as EtCompileSpec
    from executorch.exir.backend.partitioner import DelegationSpec as EtSpec
    from executorch.exir.backend.partitioner import Partitioner, PartitionResult
    from executorch.exir.backend.test import backend_with_delegate_mapping_demo  # noqa: F401

    class TailPartitioner(Partitioner):  # type: ignore[misc]  # executorch is untyped
        def partition(self, exported_program: Any) -> Any:
            calls = [n for n in exported_program.graph.nodes if n.op == "call_function"]
            for node in calls[TAIL_FROM:]:
                node.meta["delegation_tag"] = "tail"
            return PartitionResult(
                tagged_exported_program=exported_program, partition_tags={"tail": EtSpec(DEMO_ID, [EtCompileSpec("level", b"\x03")])}
            )

    return TailPartitioner()


@functools.cache
def _delegated_pair() -> tuple[bytes, bytes]:
    from executorch import exir

    module, args = _demo_model()
    ep = torch.export.export(module, args, strict=True)
    edge = exir.to_edge(ep, compile_config=exir.EdgeCompileConfig(_check_ir_validity=False))
    theirs = bytes(edge.to_backend(_executorch_tail()).to_executorch().buffer)
    program = from_exported_program(ep, decompose=True)
    ours = dumps(emit(to_backend(program, _texir_tail), EmitOptions(check_plan=True)))
    return ours, theirs


def _delegate_view(data: bytes) -> dict[str, Any]:
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(data).program
    plan = program.execution_plan[0]
    delegates = []
    for d in plan.delegates:
        assert d.processed.location == 0  # the deserializer moves segment blobs back inline
        blob = bytes(program.backend_delegate_data[d.processed.index].data)
        delegates.append((d.id, [(c.key, bytes(c.value)) for c in d.compile_specs], blob))
    return {
        "delegates": delegates,
        "inputs": len(plan.inputs),
        "outputs": len(plan.outputs),
        "kernels": [k for k in _kernel_ops(program)],
    }


def test_delegated_structure_equals_executorch() -> None:
    ours, theirs = _delegated_pair()
    mine, et = _delegate_view(ours), _delegate_view(theirs)
    assert mine == et
    assert [(d[0], d[1]) for d in mine["delegates"]] == [(DEMO_ID, [("level", b"\x03")])]
    assert mine["kernels"][-1] == "DelegateCall"


def test_delegated_pte_blob_is_a_segment_and_inline_on_request() -> None:
    from executorch.exir._serialize._program import deserialize_pte_binary
    from texir.serialize.pte import PteOptions, read_pte

    ours, _ = _delegated_pair()
    raw = read_pte(ours)
    (delegate,) = raw.program.execution_plan[0].delegates
    assert delegate.processed.location == 1 and delegate.processed.index == 1
    program = loads(ours)
    inline = dumps(program, PteOptions(extract_delegate_segments=False))
    (d2,) = read_pte(inline).program.execution_plan[0].delegates
    assert d2.processed.location == 0
    assert deserialize_pte_binary(inline).program.backend_delegate_data[0].data == (
        program.program.backend_delegate_data[0].data.tobytes()
    )


def test_lowered_module_buffer_matches_executorch_buffer_structure() -> None:
    from executorch import exir
    from executorch.exir.backend.backend_api import to_backend as et_to_backend
    from executorch.exir.backend.test import backend_with_delegate_mapping_demo  # noqa: F401
    from texir.emit import lowered_module_buffer

    module, args = _demo_model()
    ep = torch.export.export(module, args, strict=True)
    edge = exir.to_edge(ep, compile_config=exir.EdgeCompileConfig(_check_ir_validity=False))
    theirs = et_to_backend(DEMO_ID, edge.exported_program(), [])
    lowered = to_backend(DEMO_ID, from_exported_program(ep, decompose=True), ())
    ours = lowered_module_buffer("lowered_module_0", lowered)
    assert _delegate_view(ours) == _delegate_view(bytes(theirs.buffer()))


def test_delegated_program_lists_lowered_module_once() -> None:
    ours, _ = _delegated_pair()
    program = loads(ours).program
    assert len(program.backend_delegate_data) == 1
    module, args = _demo_model()
    lowered = to_backend(from_exported_program(torch.export.export(module, args, strict=True),
                                               decompose=True), _texir_tail)
    ((_, lm, _),) = get_lowered_submodules(lowered)
    assert program.backend_delegate_data[0].data.tobytes() == lm.processed_bytes


# --- random programs --------------------------------------------------------------------------------

_UNARY = ("relu", "sin", "tanh", "neg", "exp_small", "reshape", "transpose")
_BINARY = ("add", "mul", "sub", "maximum", "cat_sum")


class _Random(torch.nn.Module):
    def __init__(self, ops: list[tuple[str, int]]) -> None:
        super().__init__()
        self.ops = ops
        self.register_buffer("w", torch.linspace(-1.0, 1.0, 12).reshape(3, 4))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values = [x, y, self.w]
        for op, pick in self.ops:
            a, b = values[pick % len(values)], values[(pick // 7) % len(values)]
            if op == "relu":
                v = torch.relu(a)
            elif op == "sin":
                v = torch.sin(a)
            elif op == "tanh":
                v = torch.tanh(a)
            elif op == "neg":
                v = -a
            elif op == "exp_small":
                v = torch.exp(a * 0.1)
            elif op == "reshape":
                v = a.reshape(4, 3).reshape(3, 4)
            elif op == "transpose":
                v = a.t().contiguous().t()
            elif op == "add":
                v = a + b * 0.5
            elif op == "mul":
                v = a * b
            elif op == "sub":
                v = a - b
            elif op == "maximum":
                v = torch.maximum(a, b)
            else:
                v = torch.cat([a, b], dim=1)[:, 2:6] + 1.0
            values.append(v)
        return values[-1], values[len(values) // 2]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(_UNARY + _BINARY), st.integers(0, 48)), min_size=1, max_size=10),
       st.sampled_from(["greedy", "naive"]))
def test_random_programs_run_like_eager(ops: list[tuple[str, int]], planner: str) -> None:
    module = _Random(ops).eval()
    g = torch.Generator().manual_seed(len(ops))
    args = (torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g))
    ep = torch.export.export(module, args, strict=False).run_decompositions()
    program = from_exported_program(ep, decompose=False)
    data = dumps(emit(program, EmitOptions(planner=planner, check_plan=True)))  # type: ignore[arg-type]
    got = load_method(data).execute(list(args))
    expected = module(*args)
    assert len(got) == 2
    for g_, e in zip(got, expected):
        torch.testing.assert_close(g_, e, rtol=1e-5, atol=1e-6)


# The whole file against ExecuTorch's: texir's flatbuffer writer builds ExecuTorch's bytes, requires_grad
# is written as ExecuTorch's edge program leaves it, the greedy memory planner makes ExecuTorch's
# decisions. Where files still differ, the cause: "memory plan" (decoded programs equal but for where
# tensors were placed) or "values" (the value table differs too: see docs/compat.md). Strict both
# ways: a model that becomes equal fails here until it is moved to "equal".
WHOLE_FILE = {
    "mlp": "equal", "conv_bn": "equal", "convnet": "equal", "conv_relu_tan": "equal",
    "direct_params": "equal", "embedding": "equal", "dynamic_conv": "equal",
    "deep_mlp": "equal", "running_stats": "equal", "tuple_inputs": "equal",
    "dict_io": "equal", "nested_io": "equal", "max_dim": "equal",
    "resnet_tiny": "equal", "residual_mlp": "equal", "where_mask": "equal",
    "factories": "equal", "pad_slice": "equal", "matmul_variants": "equal",
    "dynamic_mlp": "equal", "dynamic_seq": "equal", "buffers": "equal",
    "lifted_constant": "equal", "multi_output": "equal", "scalars": "equal",
    "index_gather": "equal", "dtypes": "equal",
    "attention": "equal", "transformer_block": "equal", "split_chunk": "equal", "int_lists": "equal",
    "cat_stack": "equal", "cond_simple": "equal", "cond_closure_nested": "equal",
    "cond_multi_output": "equal",
}


def _unplanned(data: bytes) -> Any:
    """The decoded program with every planned offset and the arena sizes zeroed."""
    import msgspec

    from texir.serialize.pte import Tensor

    p = loads(data)
    plans = []
    for plan in p.program.execution_plan:
        values = []
        for v in plan.values:
            if isinstance(v.val, Tensor) and v.val.allocation_info is not None:
                info = msgspec.structs.replace(v.val.allocation_info, memory_offset_low=0, memory_offset_high=0)
                v = msgspec.structs.replace(v, val=msgspec.structs.replace(v.val, allocation_info=info))
            values.append(v)
        plans.append(msgspec.structs.replace(plan, values=tuple(values), non_const_buffer_sizes=()))
    return msgspec.structs.replace(p, program=msgspec.structs.replace(p.program, execution_plan=tuple(plans)))


@pytest.mark.parametrize("name", sorted(WHOLE_FILE))
def test_whole_file_against_executorch(name: str) -> None:
    """texir's user path (`texir.lower` with no partitioner, `emit`, `dumps`) against ExecuTorch's
    `to_edge(ep).to_executorch()` on the same export."""
    import texir

    ours = dumps(emit(texir.lower(cached_export(name, False), []).program))
    theirs = executorch_pte(name)
    if ours == theirs:
        found = "equal"
    elif _unplanned(ours) == _unplanned(theirs):
        found = "memory plan"
    else:
        found = "values"
    assert found == WHOLE_FILE[name]


class _TwoConds(torch.nn.Module):
    """The first cond's result is still read after the second cond has run."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y1 = torch.cond(x.sum() > 0, lambda t: t.sin() * 2.0, lambda t: t.cos() - 1.0, (x,))
        y2 = torch.cond(x.mean() > 2, lambda t: t.exp() + 3.0, lambda t: t.tanh() * 5.0, (x,))
        return y1 + y2


def test_sequential_conds_keep_earlier_results() -> None:
    """ExecuTorch plans every cond of a graph into one shared branch region, so its `.pte` lets the
    second cond's branch overwrite the first cond's result (which, after the runtime's move, is
    the first branch's own tensor). texir keeps the regions apart while a result is still read:
    its file runs like eager, ExecuTorch's does not (a deliberate difference, docs/limitations.md)."""
    import texir
    from executorch import exir

    module = _TwoConds().eval()
    ep = torch.export.export(module, (torch.rand(3, 4) + 0.1,))
    ours = dumps(emit(texir.lower(ep, []).program, EmitOptions(check_plan=True)))
    theirs = bytes(exir.to_edge(ep).to_executorch().buffer)
    assert loads(ours).program.execution_plan[0].non_const_buffer_sizes[1] > \
        loads(theirs).program.execution_plan[0].non_const_buffer_sizes[1]
    for x in (torch.rand(3, 4) + 0.1, -torch.rand(3, 4) - 0.1, torch.rand(3, 4) + 2.5):
        with torch.no_grad():
            expected = module(x)
        (got,) = load_method(ours).execute([x])
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    x = torch.rand(3, 4) + 0.1
    (wrong,) = load_method(theirs).execute([x])
    assert not torch.allclose(wrong, module(x), rtol=1e-3, atol=1e-3)
