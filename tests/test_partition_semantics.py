"""Partitioning semantics equal to ExecuTorch 1.5.1's (issue 11).

- texir's `OpSupportPartitioner` gives the partitions torch's `CapabilityBasedPartitioner` gives,
  on random DAGs (hypothesis) and on models run through both pipelines;
- constants shared by two partitions follow the plan's policy (`duplicate` as ExecuTorch);
- unused parameters leave the lowered program; keep-together groups; provenance-aware filters.

Each oracle case runs ExecuTorch's `to_edge(...).to_backend(...)` and texir's `to_backend` on the
same model: same delegate count, same consumed inputs per delegate, same parent signature, and
outputs equal to eager on both sides.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from executorch.exir import to_edge
from executorch.exir.backend.canonical_partitioners.group_partitioner import (
    GroupBasedPartitioner,
)
from executorch.exir.backend.partitioner import (
    DelegationSpec,
    Partitioner,
    PartitionResult,
)
from executorch.exir.backend.utils import tag_constant_data
from executorch.exir.lowered_backend_module import (
    get_lowered_submodules as et_get_lowered_submodules,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.fx import Graph as FxGraph
from torch.fx import GraphModule
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from tests.lowering_helpers import TEST_BACKEND, assert_same_outputs, export_program
from tests.test_lowering_oracle import (
    _et_signature,
    _EtBackend,
    _normalize,
    _texir_signature,
)
from texir.ir import (
    CallFunction,
    DType,
    Graph,
    GraphBuilder,
    GraphSignature,
    Output,
    Placeholder,
    Program,
    Ref,
    TensorMeta,
    UserInput,
    UserOutput,
)
from texir.ir.analysis import node_inputs
from texir.lowering import (
    NodeContext,
    OpSupportPartitioner,
    PartitionPlan,
    SharedConstantError,
    WholeProgramPartitioner,
    get_lowered_submodules,
    to_backend,
)
from texir.lowering.plan import DelegationSpec as TexirSpec
from texir.lowering.plan import validate_plan

assert _EtBackend.__name__ == "TexirOracleBackend"  # ExecuTorch finds the backend by class name

# --------------------------------------------------------------------------------------------------
# Random DAGs: texir's partitions are torch's


def _random_dag(draw: Any, max_nodes: int = 24) -> tuple[list[list[int]], list[bool]]:
    n = draw(st.integers(min_value=1, max_value=max_nodes))
    preds: list[list[int]] = []
    for i in range(n):
        if i == 0:
            preds.append([])
            continue
        window = draw(st.sampled_from([2, 3, 6, 30]))
        k = draw(st.integers(min_value=0, max_value=2))
        preds.append(sorted({draw(st.integers(min_value=max(0, i - window), max_value=i - 1)) for _ in range(k)}))
    ratio = draw(st.sampled_from([0.3, 0.6, 0.9]))
    supported = [draw(st.floats(min_value=0, max_value=1)) < ratio for _ in range(n)]
    return preds, supported


def _texir_dag(preds: list[list[int]]) -> Program:
    meta = TensorMeta(dtype=DType.float32, shape=(2,), strides=(1,))
    b = GraphBuilder()
    b.add(Placeholder(name="x"), meta)
    used = {p for ps in preds for p in ps}
    for i, ps in enumerate(preds):
        refs = [Ref(name=f"n{p}") for p in ps] or [Ref(name="x")]
        b.add(CallFunction(name=f"n{i}", target="aten::add.Tensor", args=(refs[0], refs[-1])), meta)
    outs = tuple(Ref(name=f"n{i}") for i in range(len(preds)) if i not in used)
    b.add(Output(args=outs))
    sig = GraphSignature(inputs=(UserInput(arg=Ref(name="x")),), outputs=tuple(UserOutput(arg=o) for o in outs))
    return Program(graph=b.build(), signature=sig)


def _fx_dag(preds: list[list[int]]) -> tuple[GraphModule, list[torch.fx.Node]]:
    """The fx twin of `_texir_dag(preds)`."""
    g = FxGraph()
    x = g.placeholder("x")
    nodes: list[torch.fx.Node] = []
    for i, ps in enumerate(preds):
        args = [nodes[p] for p in ps] or [x]
        node = g.call_function(torch.ops.aten.add.Tensor, (args[0], args[-1]))
        node.name = f"n{i}"
        nodes.append(node)
    users = {a for n in nodes for a in n.all_input_nodes}
    g.output(tuple(n for n in nodes if n not in users))
    return GraphModule(nn.Module(), g), nodes


def _torch_partitions(preds: list[list[int]], supported: list[bool]) -> list[set[str]]:
    gm, _ = _fx_dag(preds)
    ok = {f"n{i}" for i, s in enumerate(supported) if s}

    class Support(OperatorSupportBase):
        def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
            return node.name in ok

    parts = CapabilityBasedPartitioner(gm, Support(), allows_single_node_partition=True).propose_partitions()
    return [{n.name for n in p.nodes} for p in parts]


def _assert_convex(graph: Graph, members: set[str]) -> None:
    succ: dict[str, list[str]] = {n.name: [] for n in graph.nodes}
    for node in graph.nodes:
        for name in set(node_inputs(node)):
            succ[name].append(node.name)
    frontier = [u for m in members for u in succ[m] if u not in members]
    seen = set(frontier)
    while frontier:
        node = frontier.pop()
        assert node not in members, f"partition {sorted(members)} is not convex (re-entered at {node})"
        for u in succ[node]:
            if u not in seen:
                seen.add(u)
                frontier.append(u)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_partitions_equal_capability_based_partitioner(data: Any) -> None:
    preds, supported = data.draw(st.composite(lambda draw: _random_dag(draw))())
    program = _texir_dag(preds)
    ok = {f"n{i}" for i, s in enumerate(supported) if s}
    plan = OpSupportPartitioner(TEST_BACKEND, lambda node, metas: node.name in ok)(program)
    ours: dict[str, set[str]] = {}
    for name, tag in plan.tags:
        ours.setdefault(tag, set()).add(name)
    theirs = _torch_partitions(preds, supported)
    assert sorted(map(sorted, ours.values())) == sorted(map(sorted, theirs))
    for members in ours.values():
        _assert_convex(program.graph, members)
    validate_plan(program, plan)  # partitions also depend on each other without cycles


# --------------------------------------------------------------------------------------------------
# ExecuTorch oracle


def _op_name(target: Any) -> str:
    match = re.search(r"(aten|quantized_decomposed)\.[\w]+\.[\w]+", str(target))
    return match.group(0).replace("_copy", "") if match else str(target)


def _canonical(op: str) -> str:
    return op.replace(".", "::", 1)


class _EtSupport(OperatorSupportBase):
    def __init__(self, supported: Callable[[str], bool]) -> None:
        self.supported = supported

    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        return node.op == "call_function" and self.supported(_op_name(node.target))


class _EtCapability(Partitioner):
    """ExecuTorch's usual capability partitioner: CapabilityBasedPartitioner (or the group-based
    one, given groups of op names), then tag_constant_data."""

    def __init__(self, supported: Callable[[str], bool], groups: set[str] | None = None) -> None:
        super().__init__()
        self.supported = supported
        self.groups = groups
        self.delegation_spec = DelegationSpec("TexirOracleBackend", [])

    def partition(self, ep: Any) -> PartitionResult:
        gm = ep.graph_module
        support = _EtSupport(self.supported)
        if self.groups is None:
            partitions = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True).propose_partitions()
        else:
            # One group: every call node whose op is among `groups`.
            node_groups = [[n for n in gm.graph.nodes if n.op == "call_function" and _op_name(n.target) in self.groups]]
            partitions = GroupBasedPartitioner(
                gm, support, allows_single_node_partition=True, node_groups=node_groups
            ).propose_partitions()
        tags = {}
        for i, partition in enumerate(partitions):
            for node in partition.nodes:
                node.meta["delegation_tag"] = f"tag{i}"
            tags[f"tag{i}"] = self.delegation_spec
        tag_constant_data(ep)
        return PartitionResult(tagged_exported_program=ep, partition_tags=tags)


class _AllCalls(Partitioner):
    """Everything in one partition, constants tagged (ExecuTorch's whole-graph delegation)."""

    def __init__(self) -> None:
        super().__init__()
        self.delegation_spec = DelegationSpec("TexirOracleBackend", [])

    def partition(self, ep: Any) -> PartitionResult:
        for node in ep.graph_module.graph.nodes:
            if node.op == "call_function":
                node.meta["delegation_tag"] = "tag0"
        tag_constant_data(ep)
        return PartitionResult(tagged_exported_program=ep, partition_tags={"tag0": self.delegation_spec})


def _consumed(sig: tuple[list[str], list[str]]) -> list[str]:
    return sorted(k for k in _normalize(sig[0]) if k != "USER_INPUT")


def _flat(value: Any) -> list[torch.Tensor]:
    leaves, _ = torch.utils._pytree.tree_flatten(value)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def _compare(module: nn.Module, args: tuple[Any, ...], et_partitioner: Partitioner, partitioner: Any) -> Program:
    """Both pipelines on `module`; returns texir's lowered program."""
    et = to_edge(torch.export.export(copy.deepcopy(module), args)).to_backend(et_partitioner).exported_program()
    program = export_program(copy.deepcopy(module), args)
    lowered = to_backend(program, partitioner)

    et_subs = [m.original_module for _, m, _ in et_get_lowered_submodules(et.graph_module)]
    ours = [m.original_program for _, m, _ in get_lowered_submodules(lowered)]
    assert len(ours) == len(et_subs), f"texir made {len(ours)} delegates, ExecuTorch {len(et_subs)}"
    ours_consumed = sorted(_consumed(_texir_signature(sub)) for sub in ours)
    et_consumed = sorted(_consumed(_et_signature(sub.graph_signature)) for sub in et_subs)
    assert ours_consumed == et_consumed
    ins, outs = _texir_signature(lowered)
    et_ins, et_outs = _et_signature(et.graph_signature)
    assert (_normalize(ins), outs) == (_normalize(et_ins), et_outs)

    expected = _flat(module(*args))
    for actual in (_flat(et.module()(*args)),):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a, e)
    assert_same_outputs(module, lowered, args, calls=1)
    return lowered


def _only(*ops: str) -> Callable[[str], bool]:
    return lambda op: op in ops


def _all_but(*ops: str) -> Callable[[str], bool]:
    return lambda op: op not in ops


def _texir(supported: Callable[[str], bool], **kwargs: Any) -> OpSupportPartitioner:
    """The texir partitioner with the same support rule as the ExecuTorch side."""

    def predicate(node: CallFunction, metas: Any) -> bool:
        return supported(node.target.replace("::", ".", 1).replace("_copy", ""))

    return OpSupportPartitioner(TEST_BACKEND, predicate, tag_constants=True, **kwargs)


class TwoAddsOneBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("b", torch.ones(4))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.sin(x + self.b), torch.cos(y + self.b)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(8, 8) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.q(x) @ self.k(x).transpose(-1, -2) / 8**0.5
        return self.o(torch.softmax(scores, dim=-1) @ self.v(x))


class SharedWeight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x * self.w) * self.w


class UnusedParameter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.unused = nn.Parameter(torch.randn(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).relu()


class BehindUnsupported(nn.Module):
    """A supported node behind an unrelated unsupported one (the README's old corner case)."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = x + 1
        s = torch.sin(y)
        return a * 2, s + a


class ChainThroughUnsupported(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = torch.sin(x * 2 + 1)
        return x + 1


class MultiOutput(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        values, indices = torch.max(x * 2, dim=1)
        return values + 1, torch.sin(values) * indices.float()


class Islands(nn.Module):
    """Independent supported islands around unsupported ops: one partition (horizontal fusion)."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.sin(x * 2), torch.cos(y + 1), (x - y) * 3


class DiamondUnsupportedMiddle(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x * 2
        return torch.sin(a) + a * 3


class CondModel(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        def yes(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.sin(a + b)

        def no(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.cos(a - b)

        z = x * 2
        return torch.cond(x.sum() > 0, yes, no, (z, y)) * 3 + z


class QuantLinear(nn.Module):
    """A dequantize -> linear chain (int8 weights, as pt2e leaves it)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("wq", torch.randint(-100, 100, (8, 8), dtype=torch.int8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dq = torch.ops.quantized_decomposed
        xq = dq.quantize_per_tensor.default(x, 0.05, 0, -128, 127, torch.int8)
        xd = dq.dequantize_per_tensor.default(xq, 0.05, 0, -128, 127, torch.int8)
        wd = dq.dequantize_per_tensor.default(self.wq, 0.01, 0, -127, 127, torch.int8)
        return torch.relu(torch.nn.functional.linear(xd, wd)) + 1


X4 = torch.randn(4)
X24 = torch.randn(2, 4)
X28 = torch.randn(2, 8)

ORACLE_CASES: dict[str, tuple[Callable[[], nn.Module], tuple[Any, ...], Callable[[str], bool]]] = {
    "two_adds_one_buffer": (TwoAddsOneBuffer, (X4, X4 + 1), _only("aten.add.Tensor")),
    "attention_but_softmax": (Attention, (torch.randn(2, 3, 8),), _all_but("aten._softmax.default")),
    "shared_weight": (SharedWeight, (X4,), _only("aten.mul.Tensor")),
    "behind_unsupported": (BehindUnsupported, (X24, X24), _only("aten.add.Tensor", "aten.mul.Tensor")),
    "chain_through_unsupported": (ChainThroughUnsupported, (X24,), _only("aten.add.Tensor", "aten.mul.Tensor")),
    "multi_output": (
        MultiOutput,
        (X24,),
        _only("aten.max.dim", "aten.mul.Tensor", "aten.add.Tensor", "aten._to_copy.default"),
    ),
    "islands": (Islands, (X24, X24), _only("aten.add.Tensor", "aten.mul.Tensor", "aten.sub.Tensor")),
    "diamond_unsupported_middle": (DiamondUnsupportedMiddle, (X24,), _only("aten.add.Tensor", "aten.mul.Tensor")),
    "cond_top_level": (CondModel, (X24, X24), _only("aten.add.Tensor", "aten.mul.Tensor")),
}


@pytest.mark.parametrize("case", sorted(ORACLE_CASES))
def test_same_partitions_as_executorch(case: str) -> None:
    factory, args, supported = ORACLE_CASES[case]
    torch.manual_seed(0)
    module = factory().eval()
    lowered = _compare(module, args, _EtCapability(supported), _texir(supported))
    if case == "two_adds_one_buffer":
        assert len(lowered.lowered_modules) == 1
    if case == "attention_but_softmax":
        assert len(lowered.lowered_modules) == 2


def test_shared_weight_is_duplicated_like_executorch() -> None:
    torch.manual_seed(0)
    lowered = _compare(SharedWeight(), (X4,), _EtCapability(_only("aten.mul.Tensor")), _texir(_only("aten.mul.Tensor")))
    subs = [m.original_program for _, m, _ in get_lowered_submodules(lowered)]
    assert [[e.target for e in sub.state] for sub in subs] == [["w"], ["w"]]
    assert lowered.state == ()


def test_shared_weight_policies() -> None:
    torch.manual_seed(0)
    program = export_program(SharedWeight(), (X4,))
    passed = to_backend(program, _texir(_only("aten.mul.Tensor"), shared_constants="pass_in"))
    assert [e.target for e in passed.state] == ["w"]
    assert all(m.original_program.state == () for _, m, _ in get_lowered_submodules(passed))
    with pytest.raises(SharedConstantError, match=r"'p_w' is tagged 'tag0' but is also used by 'mul_1' \(tag 'tag1'\)"):
        to_backend(program, _texir(_only("aten.mul.Tensor"), shared_constants="error"))


class ConstantInList(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x * self.w
        return torch.cat([torch.sin(a), self.w, x]) + torch.stack([self.w, x]).sum()


def test_error_policy_lists_every_user_including_list_arguments() -> None:
    program = export_program(ConstantInList(), (X4,))
    plan = PartitionPlan.build(
        {"p_w": "a", "mul": "a", "cat": "b"},
        {"a": TexirSpec(backend_id=TEST_BACKEND), "b": TexirSpec(backend_id=TEST_BACKEND)},
        shared_constants="error",
    )
    with pytest.raises(SharedConstantError) as info:
        to_backend(program, lambda p: plan)
    message = str(info.value)
    # stack decomposes to a second cat, which reads the weight inside its list argument too.
    assert "'cat' (tag 'b'), 'cat_1' (not delegated)" in message
    assert "\n" not in message


def test_bad_policy_is_refused() -> None:
    with pytest.raises(Exception, match="shared_constants"):
        OpSupportPartitioner(TEST_BACKEND, {"aten::add.Tensor"}, shared_constants="copy")  # type: ignore[arg-type]  # a bad value on purpose


def test_unused_parameter_leaves_the_lowered_program() -> None:
    torch.manual_seed(0)
    lowered = _compare(UnusedParameter(), (X24,), _AllCalls(), WholeProgramPartitioner(TEST_BACKEND, tag_constants=True))
    assert all(e.target != "unused" for e in lowered.state)


def test_keep_together_group_like_executorch_group_partitioner() -> None:
    torch.manual_seed(0)
    module = QuantLinear().eval()
    args = (X28,)
    program = export_program(module, args)
    group_ops = {"quantized_decomposed.dequantize_per_tensor.default", "aten.permute.default", "aten.mm.default"}
    group = [
        n.name for n in program.graph.nodes
        if isinstance(n, CallFunction) and n.target.replace("::", ".", 1) in group_ops
    ]
    assert len(group) == 4
    supported = _only(*group_ops, "aten.add.Tensor")
    lowered = _compare(module, args, _EtCapability(supported, groups=group_ops), _texir(supported, keep_together=[group]))
    (_, module_0, _), *_ = get_lowered_submodules(lowered)
    inside = {n.name for n in module_0.original_program.graph.nodes}
    assert set(group) <= inside


def test_keep_together_group_lands_whole_or_not_at_all() -> None:
    program = export_program(QuantLinear(), (X28,))
    calls = [n.name for n in program.graph.nodes if isinstance(n, CallFunction)]
    dequants = [n for n in calls if n.startswith("dequantize")]
    # relu is unsupported, so a group holding it is dropped entirely.
    relu = next(n for n in calls if n.startswith("relu"))
    partitioner = _texir(_only("quantized_decomposed.dequantize_per_tensor.default"), keep_together=[[*dequants, relu]])
    assert partitioner(program).tags == ()


def test_node_filter_sees_provenance() -> None:
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = nn.Linear(4, 4)
            self.second = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.second(torch.sin(self.first(x)))

    # Strict export records source functions; the module stack is there either way.
    program = export_program(Two(), (X24,), strict=True)
    seen: list[NodeContext] = []

    def only_second(ctx: NodeContext) -> bool:
        seen.append(ctx)
        return "second" in ctx.module_stack

    plan = OpSupportPartitioner(TEST_BACKEND, lambda n, m: True, node_filter=only_second)(program)
    assert sorted(name for name, _ in plan.tags) == ["addmm_1", "permute_1"]
    assert {ctx.node.name: ctx.source_fn for ctx in seen}["sin"] == "torch._VariableFunctionsClass.sin"
    assert all(ctx.module_types[0].endswith("Two") for ctx in seen)

    def not_linear(ctx: NodeContext) -> bool:
        return ctx.source_fn != "torch.nn.modules.linear.Linear"

    plan = OpSupportPartitioner(TEST_BACKEND, lambda n, m: True, node_filter=not_linear)(program)
    assert [name for name, _ in plan.tags] == ["sin"]
