"""Delegation scenarios mirroring ExecuTorch's to_backend tests: golden before/after text, verify,
input untouched, and lowered outputs equal to eager."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from tests.lowering_helpers import TEST_BACKEND, assert_same_outputs, export_program, lower_scenario
from texir.testing.golden import Golden
from texir.ir import (
    BufferInput,
    DType,
    Ref,
    TensorMeta,
    ValueMeta,
    value_metas,
    BufferMutation,
    CallFunction,
    CompileSpec,
    GetAttr,
    Graph,
    IntArg,
    ParameterInput,
    Placeholder,
    Program,
    UserOutput,
    verify,
)
from texir.lowering import (
    NodeGroupPartitioner,
    OpSupportPartitioner,
    WholeProgramPartitioner,
    delegate_wrapper_program,
    get_lowered_submodules,
    to_backend,
)

ADD = "aten::add.Tensor"
MUL = "aten::mul.Tensor"
ADD_MUL = {ADD, MUL}


def _calls(program: Program, target: str) -> list[CallFunction]:
    return [n for n in program.graph.nodes if isinstance(n, CallFunction) and n.target == target]


def _delegates(program: Program) -> int:
    return len(_calls(program, "texir::call_delegate"))


def _call_handles(graph: Graph) -> dict[str, int | None]:
    """Debug handle of each call node that has provenance, by name."""
    return {
        n.name: prov.debug_handle
        for i, n in enumerate(graph.nodes)
        if isinstance(n, CallFunction) and (prov := graph.prov(i)) is not None
    }


def _seed(module: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    for p in module.parameters():
        with torch.no_grad():
            p.copy_(torch.randn_like(p))
    return module.eval()


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class AddMul(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a = x + y
        b = a * y
        return torch.sin(b) + x


class TwoIslands(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = (x + y) * y
        s = torch.sin(a)
        b = (s + x) * s
        c = torch.cos(b)
        return c * c + a, s


class SharedParam(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x * self.w
        return torch.sin(a) - self.w


class Buffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.full((4,), 2.0))
        self.register_buffer("shift", torch.ones(4), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * self.scale + self.shift)


class Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(x)
        return torch.sin(x) * self.count


class TwoCounters(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("a", torch.zeros(4))
        self.register_buffer("b", torch.ones(4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.a.add_(x)
        self.b.mul_(2.0)
        y = torch.sin(x) + self.a
        return y, torch.cos(y) + self.b


class LiftedConstant(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c = torch.tensor([1.0, 2.0, 3.0, 4.0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x + self.c) * self.c


class MultiOut(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a = x + y
        b = a * y
        return torch.sin(a) - torch.cos(b)


class OutputIsPartitionOutput(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a = x + y
        b = a * x
        return b, torch.sin(a), a


class Cond(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        def true_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.sin((x + y) * y)

        def false_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.cos(x * y + x)

        return torch.cond(x.sum() > 0, true_fn, false_fn, (x, y)) + y


class MaxDim(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        values, indices = torch.max(x * 2.0, dim=1)
        return torch.sin(values), indices


class Diamond(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x + 1.0
        r = torch.sin(a)
        return a * r


class PassThrough(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x + y


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


class Residual(nn.Module):
    def __init__(self, n: int = 3) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = (torch.relu(layer(x)) + x) * 0.5
        return x


X = torch.randn(2, 4)
Y = torch.randn(2, 4)
X4 = torch.randn(4)


def test_whole_program_keeps_params_in_parent(golden: Golden) -> None:
    module = _seed(MLP())
    lowered = lower_scenario(golden, "whole_mlp", module, (X,), WholeProgramPartitioner(TEST_BACKEND))
    assert _delegates(lowered) == 1
    (name, lbm, call), = get_lowered_submodules(lowered)
    assert name == "lowered_module_0" and call.name == "executorch_call_delegate"
    # Without tag_constants, the parameters stay in the parent and are passed in.
    assert sum(isinstance(s, ParameterInput) for s in lowered.signature.inputs) == 4
    assert len(call.args) == 1 + 5


def test_whole_program_consumes_params_with_tag_constants(golden: Golden) -> None:
    module = _seed(MLP())
    lowered = lower_scenario(
        golden,
        "whole_mlp_tag_constants", module, (X,), WholeProgramPartitioner(TEST_BACKEND, tag_constants=True)
    )
    assert not any(isinstance(s, ParameterInput) for s in lowered.signature.inputs)
    assert lowered.state == ()
    sub = lowered.lowered_modules[0].module.original_program
    assert [type(s).__name__ for s in sub.signature.inputs] == ["ParameterInput"] * 4 + ["UserInput"]
    assert len(sub.state) == 4


def test_add_mul_partition(golden: Golden) -> None:
    lowered = lower_scenario(golden, "add_mul", AddMul(), (X, Y), OpSupportPartitioner(TEST_BACKEND, ADD_MUL))
    # (x+y)*y is one partition; the trailing add after sin is another.
    assert _delegates(lowered) == 2
    assert _calls(lowered, "aten::sin.default")
    assert not _calls(lowered, ADD) and not _calls(lowered, MUL)


def test_several_partitions_in_order(golden: Golden) -> None:
    lowered = lower_scenario(golden, "several", TwoIslands(), (X, Y), OpSupportPartitioner(TEST_BACKEND, ADD_MUL))
    names = [name for name, _, _ in get_lowered_submodules(lowered)]
    assert names == ["lowered_module_0", "lowered_module_1", "lowered_module_2"]
    call_handles = _call_handles(lowered.graph)
    handles = [call_handles[call.name] for _, _, call in get_lowered_submodules(lowered) if call.name in call_handles]
    assert handles == sorted(handles) and len(set(handles)) == 3


def test_params_consumed_by_partition(golden: Golden) -> None:
    module = _seed(MLP())
    lowered = lower_scenario(
        golden,
        "params_consumed",
        module,
        (X,),
        OpSupportPartitioner(TEST_BACKEND, {"aten::addmm.default", "aten::permute.default"}, tag_constants=True),
    )
    assert not any(isinstance(s, ParameterInput) for s in lowered.signature.inputs)
    assert _delegates(lowered) == 2


def test_param_shared_with_parent_is_kept(golden: Golden) -> None:
    module = _seed(SharedParam())
    lowered = lower_scenario(
        golden,
        "param_shared_with_parent", module, (X4,), OpSupportPartitioner(TEST_BACKEND, {MUL}, tag_constants=True)
    )
    # The delegate owns a copy of w, and the parent keeps w for its own sub.
    assert [s.target for s in lowered.signature.inputs if isinstance(s, ParameterInput)] == ["w"]
    sub = lowered.lowered_modules[0].module.original_program
    assert [s.target for s in sub.signature.inputs if isinstance(s, ParameterInput)] == ["w"]
    assert [e.target for e in lowered.state] == ["w"]


def test_buffers_consumed(golden: Golden) -> None:
    lowered = lower_scenario(
        golden,
        "buffers_consumed", Buffers(), (X,), OpSupportPartitioner(TEST_BACKEND, ADD_MUL, tag_constants=True)
    )
    assert not any(isinstance(s, BufferInput) for s in lowered.signature.inputs)
    sub = lowered.lowered_modules[0].module.original_program
    assert {(s.target, s.persistent) for s in sub.signature.inputs if isinstance(s, BufferInput)} == {
        ("scale", True),
        ("shift", False),
    }


def test_buffers_not_consumed_without_tag_constants(golden: Golden) -> None:
    lowered = lower_scenario(golden, "buffers_not_consumed", Buffers(), (X,), OpSupportPartitioner(TEST_BACKEND, ADD_MUL))
    assert sum(isinstance(s, BufferInput) for s in lowered.signature.inputs) == 2


def test_buffer_mutation_consumed(golden: Golden) -> None:
    lowered = lower_scenario(
        golden,
        "buffer_mutation_consumed",
        Counter(),
        (X4,),
        WholeProgramPartitioner(TEST_BACKEND, tag_mutated_buffers=True),
    )
    assert not any(isinstance(s, BufferMutation) for s in lowered.signature.outputs)
    assert not any(isinstance(s, BufferInput) for s in lowered.signature.inputs)
    sub = lowered.lowered_modules[0].module.original_program
    assert isinstance(sub.signature.outputs[0], BufferMutation)


def test_buffer_mutation_not_consumed(golden: Golden) -> None:
    lowered = lower_scenario(
        golden,
        "buffer_mutation_not_consumed", Counter(), (X4,), OpSupportPartitioner(TEST_BACKEND, {ADD})
    )
    # The delegate returns the new value; the parent still writes the buffer back.
    (mutation,) = [s for s in lowered.signature.outputs if isinstance(s, BufferMutation)]
    getitem = next(n for n in lowered.graph.nodes if n.name == mutation.name)
    assert isinstance(getitem, CallFunction) and getitem.target == "_operator::getitem"
    sub = lowered.lowered_modules[0].module.original_program
    assert all(isinstance(s, UserOutput) for s in sub.signature.outputs)


def test_reindex_after_consumed_mutation(golden: Golden) -> None:
    lowered = lower_scenario(
        golden,
        "reindex_consumed_mutation",
        TwoCounters(),
        (X4,),
        OpSupportPartitioner(TEST_BACKEND, {ADD, MUL}, tag_mutated_buffers=True),
    )
    sub_outputs = [
        [type(s).__name__ for s in m.module.original_program.signature.outputs] for m in lowered.lowered_modules
    ]
    assert any(kinds[0] == "BufferMutation" and "UserOutput" in kinds for kinds in sub_outputs)
    # Getitem indices count user outputs only: the consumed mutations stay inside the delegate.
    for _, module, call in get_lowered_submodules(lowered):
        n_user = sum(isinstance(s, UserOutput) for s in module.original_program.signature.outputs)
        indices = [
            n.args[1].value
            for n in lowered.graph.nodes
            if isinstance(n, CallFunction) and n.target == "_operator::getitem" and n.args[0].name == call.name
            and isinstance(n.args[1], IntArg)
        ]
        assert sorted(indices) == list(range(n_user))
    assert not any(isinstance(s, BufferMutation) for s in lowered.signature.outputs)
    assert len(lowered.signature.outputs) == 2


def test_lifted_constant_consumed(golden: Golden) -> None:
    lowered = lower_scenario(
        golden,
        "lifted_constant_consumed",
        LiftedConstant(),
        (X4,),
        WholeProgramPartitioner(TEST_BACKEND, tag_constants=True),
    )
    assert lowered.state == ()
    sub = lowered.lowered_modules[0].module.original_program
    assert len(sub.state) == 1


def test_lifted_constant_shared_by_two_partitions_is_duplicated(golden: Golden) -> None:
    # ExecuTorch 1.5.1's default: tag_constant_data gives the constant the least user tag and
    # to_backend copies it into every other delegate using it; the parent keeps none.
    lowered = lower_scenario(
        golden,
        "lifted_constant_two_partitions",
        LiftedConstant(),
        (X4,),
        OpSupportPartitioner(TEST_BACKEND, ADD_MUL, tag_constants=True),
    )
    assert _delegates(lowered) == 2
    assert lowered.state == ()
    subs = [m.original_program for _, m, _ in get_lowered_submodules(lowered)]
    assert [[s.target for s in sub.state] for sub in subs] == [["c"], ["c"]]


def test_lifted_constant_shared_by_two_partitions_passed_in(golden: Golden) -> None:
    lowered = lower_scenario(
        golden,
        "lifted_constant_two_partitions_pass_in",
        LiftedConstant(),
        (X4,),
        OpSupportPartitioner(TEST_BACKEND, ADD_MUL, tag_constants=True, shared_constants="pass_in"),
    )
    assert _delegates(lowered) == 2
    assert len(lowered.state) == 1  # used by both delegates: passed to each, owned by neither
    subs = [m.original_program for _, m, _ in get_lowered_submodules(lowered)]
    assert all(sub.state == () for sub in subs)


def test_multi_output_partition(golden: Golden) -> None:
    lowered = lower_scenario(golden, "multi_output", MultiOut(), (X, Y), OpSupportPartitioner(TEST_BACKEND, ADD_MUL))
    (_, module, call), *rest = get_lowered_submodules(lowered)
    assert len(module.original_program.signature.outputs) == 2


def test_partition_output_is_program_output(golden: Golden) -> None:
    lowered = lower_scenario(
        golden,
        "output_is_program_output", OutputIsPartitionOutput(), (X, Y), OpSupportPartitioner(TEST_BACKEND, ADD_MUL)
    )
    out = lowered.graph.nodes[-1]
    targets = {n.name: n for n in lowered.graph.nodes}
    assert all(
        isinstance(targets[a.name], CallFunction) for a in out.args  # type: ignore[union-attr]
    )


def test_cond_branches_partitioned(golden: Golden) -> None:
    lowered = lower_scenario(golden, "cond_branches", Cond(), (X, Y), OpSupportPartitioner(TEST_BACKEND, ADD_MUL))
    names = sorted(m.name for m in lowered.lowered_modules)
    assert len(names) == 3  # the top-level add, one per branch
    for sub in lowered.graph.subgraphs:
        assert any(isinstance(n, CallFunction) and n.target == "texir::call_delegate" for n in sub.graph.nodes)
    assert_same_outputs(Cond(), lowered, (-X.abs(), Y))


def test_cond_whole_program(golden: Golden) -> None:
    lowered = lower_scenario(golden, "cond_whole", Cond(), (X, Y), WholeProgramPartitioner(TEST_BACKEND))
    assert lowered.graph.subgraphs == ()
    sub = lowered.lowered_modules[0].module.original_program
    assert len(sub.graph.subgraphs) == 2


def test_multi_output_op_and_getitem(golden: Golden) -> None:
    lowered = lower_scenario(
        golden,
        "max_dim", MaxDim(), (X,), OpSupportPartitioner(TEST_BACKEND, {MUL, "aten::max.dim"})
    )
    sub = lowered.lowered_modules[0].module.original_program
    assert any(isinstance(n, CallFunction) and n.target == "_operator::getitem" for n in sub.graph.nodes)


def test_non_convex_candidate_is_split(golden: Golden) -> None:
    lowered = lower_scenario(golden, "diamond", Diamond(), (X,), OpSupportPartitioner(TEST_BACKEND, ADD_MUL))
    assert _delegates(lowered) == 2


def test_input_passthrough(golden: Golden) -> None:
    lowered = lower_scenario(golden, "passthrough", PassThrough(), (X, Y), OpSupportPartitioner(TEST_BACKEND, {ADD}))
    assert _delegates(lowered) == 1


def test_node_group_partitioner(golden: Golden) -> None:
    program = export_program(TwoIslands(), (X, Y))
    lowered = lower_scenario(
        golden,
        "node_groups",
        TwoIslands(),
        (X, Y),
        NodeGroupPartitioner(TEST_BACKEND, {"first": ["add", "mul"], "second": ["mul_2", "add_2"]}),
        program=program,
    )
    assert [m.name for m in lowered.lowered_modules] == ["lowered_module_0", "lowered_module_1"]


def test_predicate_partitioner(golden: Golden) -> None:
    lowered = lower_scenario(
        golden,
        "predicate",
        TwoIslands(),
        (X, Y),
        OpSupportPartitioner(TEST_BACKEND, lambda node, metas: node.target.startswith("aten::") and "sin" not in node.target),
    )
    assert _calls(lowered, "aten::sin.default")


class MixedDtypes(nn.Module):
    def forward(self, x: torch.Tensor, i: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(x + x), torch.relu(i + i)


def test_predicate_sees_value_metadata() -> None:
    # A backend that runs float32 only: the predicate reads the call's own and its inputs' dtypes.
    def float32_only(node: CallFunction, metas: Mapping[str, ValueMeta]) -> bool:
        values = [metas.get(node.name)] + [metas.get(a.name) for a in node.args if isinstance(a, Ref)]
        return all(isinstance(m, TensorMeta) and m.dtype == DType.float32 for m in values)

    args = (torch.randn(2, 3), torch.arange(6).reshape(2, 3))
    program = export_program(MixedDtypes(), args)
    lowered = to_backend(program, OpSupportPartitioner(TEST_BACKEND, float32_only))
    verify(lowered)
    assert [c.target for c in _calls(lowered, "aten::add.Tensor")] == ["aten::add.Tensor"]
    assert len(_calls(lowered, "aten::relu.default")) == 1 and _delegates(lowered) == 1
    (named,) = lowered.lowered_modules
    inner = value_metas(named.module.original_program.graph)
    assert {m.dtype for m in inner.values() if isinstance(m, TensorMeta)} == {DType.float32}
    assert_same_outputs(MixedDtypes(), lowered, args)


def test_conv_bn_partition(golden: Golden) -> None:
    module = _seed(ConvBN())
    lowered = lower_scenario(
        golden,
        "conv_bn",
        module,
        (torch.randn(1, 3, 6, 6),),
        OpSupportPartitioner(TEST_BACKEND, {"aten::convolution.default"}, tag_constants=True),
    )
    assert _delegates(lowered) == 1


def test_residual_chain(golden: Golden) -> None:
    module = _seed(Residual())
    lowered = lower_scenario(
        golden,
        "residual", module, (X,), OpSupportPartitioner(TEST_BACKEND, {ADD, MUL, "aten::relu.default"})
    )
    assert _delegates(lowered) == 3


def test_compile_specs_reach_backend(golden: Golden) -> None:
    specs = (CompileSpec(key="max_value", value=b"\x04"),)
    lowered = lower_scenario(
        golden,
        "compile_specs", AddMul(), (X, Y), OpSupportPartitioner(TEST_BACKEND, {MUL}, specs)
    )
    module = lowered.lowered_modules[0].module
    assert module.compile_specs == specs and module.processed_bytes.endswith(b"max_value=04")


def test_dynamic_shapes(golden: Golden) -> None:
    batch = torch.export.Dim("batch", min=1, max=16)
    program = export_program(AddMul(), (X, Y), dynamic_shapes=({0: batch}, {0: batch}))
    lowered = lower_scenario(golden, "dynamic", AddMul(), (X, Y), OpSupportPartitioner(TEST_BACKEND, ADD_MUL), program=program)
    assert lowered.range_constraints == program.range_constraints
    assert_same_outputs(AddMul(), lowered, (torch.randn(5, 4), torch.randn(5, 4)))


def test_lower_twice_does_not_claim_delegates(golden: Golden) -> None:
    program = export_program(TwoIslands(), (X, Y))
    once = to_backend(program, OpSupportPartitioner(TEST_BACKEND, {MUL}))
    twice = lower_scenario(
        golden,
        "lower_twice", TwoIslands(), (X, Y), OpSupportPartitioner(TEST_BACKEND, {ADD}), program=once
    )
    names = [m.name for m in twice.lowered_modules]
    assert names == [f"lowered_module_{i}" for i in range(len(names))] and len(names) > _delegates(once)
    assert [n for n in twice.graph.nodes if n.name == "executorch_call_delegate_1"]


def test_debug_handles_survive() -> None:
    program = export_program(AddMul(), (X, Y))
    lowered = to_backend(program, OpSupportPartitioner(TEST_BACKEND, ADD_MUL))
    before = _call_handles(program.graph)
    after: dict[str, int | None] = {}
    for m in lowered.lowered_modules:
        after.update(_call_handles(m.module.original_program.graph))
    targets = {n.name: n.target for n in lowered.graph.nodes if isinstance(n, CallFunction)}
    after.update(
        (name, handle)
        for name, handle in _call_handles(lowered.graph).items()
        if targets[name] not in ("texir::call_delegate", "_operator::getitem")
    )
    assert after == before
    entries = [e for m in lowered.lowered_modules for e in (m.module.debug_handle_map or ())]
    assert sorted(h for e in entries for h in e.debug_handles) == sorted(
        before[n] for n in before if n.startswith(("add", "mul"))
    )


def test_whole_program_to_backend_id_and_wrapper() -> None:
    program = export_program(AddMul(), (X, Y))
    module = to_backend(TEST_BACKEND, program, [CompileSpec(key="k", value=b"v")])
    assert module.original_program is program and module.backend_id == TEST_BACKEND
    wrapper = delegate_wrapper_program("lowered_module_0", module)
    verify(wrapper)
    assert [type(n).__name__ for n in wrapper.graph.nodes] == [
        "Placeholder", "Placeholder", "GetAttr", "CallFunction", "CallFunction", "Output",
    ]
    assert isinstance(wrapper.graph.nodes[2], GetAttr)
    assert_same_outputs(AddMul(), wrapper, (X, Y))


def test_multi_method_shares_identical_delegates() -> None:
    forward = export_program(AddMul(), (X, Y))
    other = export_program(AddMul(), (X, Y))
    result = to_backend({"forward": forward, "other": other}, OpSupportPartitioner(TEST_BACKEND, {MUL}))
    assert set(result) == {"forward", "other"}
    a = result["forward"].lowered_modules[0].module
    b = result["other"].lowered_modules[0].module
    assert a is b
    verify(result["other"])


def test_placeholders_ordered_params_buffers_inputs(golden: Golden) -> None:
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("buf", torch.ones(4))
            self.w = nn.Parameter(torch.ones(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x * self.buf) + self.w

    lowered = lower_scenario(
        golden,
        "placeholder_order", Mixed(), (X4,), WholeProgramPartitioner(TEST_BACKEND, tag_constants=True)
    )
    sub = lowered.lowered_modules[0].module.original_program
    kinds = [type(s).__name__ for s in sub.signature.inputs]
    assert kinds == ["ParameterInput", "BufferInput", "UserInput"]
    assert [n.name for n in sub.graph.nodes if isinstance(n, Placeholder)][0].startswith("p_")


class MapBody(nn.Module):
    def forward(self, xs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        from functorch.experimental import control_flow

        def body(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.sin(x + y) * y

        return control_flow.map(body, xs, y) + 1.0


class InputMutation(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.add_(y)
        return torch.sin(x) * y


def test_map_body_partitioned(golden: Golden) -> None:
    lowered = lower_scenario(
        golden,
        "map_body", MapBody(), (torch.randn(3, 4), X4), OpSupportPartitioner(TEST_BACKEND, ADD_MUL)
    )
    (body,) = lowered.graph.subgraphs
    assert sum(isinstance(n, CallFunction) and n.target == "texir::call_delegate" for n in body.graph.nodes) == 2
    assert len(lowered.lowered_modules) == 3


def test_user_input_mutation_from_delegate(golden: Golden) -> None:
    lowered = lower_scenario(
        golden,
        "user_input_mutation", InputMutation(), (X4, X4.clone()), WholeProgramPartitioner(TEST_BACKEND)
    )
    kinds = [type(s).__name__ for s in lowered.signature.outputs]
    assert kinds == ["UserInputMutation", "UserOutput"]
    assert lowered.signature.outputs[0].name == "getitem"  # type: ignore[union-attr]


class ParamThroughParent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.w) * torch.sin(self.w)


def test_consumed_param_also_feeding_the_partition_through_the_parent(golden: Golden) -> None:
    # w is consumed by the mul partition and also reaches it through the parent's sin: legal,
    # the parent keeps w for sin and the delegate owns its own copy.
    module = _seed(ParamThroughParent())
    lowered = lower_scenario(
        golden,
        "param_through_parent", module, (X4,), OpSupportPartitioner(TEST_BACKEND, {MUL}, tag_constants=True)
    )
    assert [e.target for e in lowered.state] == ["w"]
    assert _delegates(lowered) == 1


def test_plan_lists_ops_to_keep_from_decomposition() -> None:
    from texir.lowering.plan import ops_to_not_decompose

    program = export_program(AddMul(), (X, Y))
    partitioner = OpSupportPartitioner(TEST_BACKEND, {MUL, ADD})
    assert partitioner(program).ops_to_not_decompose == (ADD, MUL)
    assert ops_to_not_decompose(partitioner, program) == (ADD, MUL)
    assert WholeProgramPartitioner(TEST_BACKEND)(program).ops_to_not_decompose == ()
