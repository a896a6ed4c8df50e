"""ExecuTorch 1.5.1 as oracle: the same partition lowered by `to_edge(...).to_backend(...)` and by
texir gives the same delegates (sub-program signatures, delegated op counts) and the same parent
signature and remaining op count."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from executorch.exir import to_edge
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.canonical_partitioners.pattern_op_partitioner import generate_partitions_from_list_of_nodes
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.backend.utils import tag_constant_data, tag_mutated_buffer
from executorch.exir.lowered_backend_module import get_lowered_submodules as et_get_lowered_submodules
from torch import nn
from torch.fx.passes.operator_support import OperatorSupportBase

from tests.lowering_helpers import TEST_BACKEND, export_program
from tests.test_lowering_scenarios import (
    MLP,
    AddMul,
    Buffers,
    Counter,
    Diamond,
    LiftedConstant,
    MultiOut,
    Residual,
    SharedParam,
    TwoCounters,
    TwoIslands,
    _seed,
)
from texir.ir import (
    BufferInput,
    BufferMutation,
    CallFunction,
    ConstantTensorInput,
    ParameterInput,
    Program,
    TupleMeta,
    UserInput,
    UserOutput,
)
from texir.lowering import OpSupportPartitioner, WholeProgramPartitioner, get_lowered_submodules, to_backend


class _EtBackend(BackendDetails):
    @staticmethod
    def preprocess(edge_program: Any, compile_specs: Any) -> PreprocessResult:
        return PreprocessResult(processed_bytes=b"oracle")


_EtBackend.__name__ = "TexirOracleBackend"


def _op_name(target: Any) -> str:
    match = re.search(r"aten\.[\w]+\.[\w]+", str(target))
    return match.group(0).replace("_copy", "") if match else str(target)


class _Support(OperatorSupportBase):
    def __init__(self, ops: set[str] | None) -> None:
        self.ops = ops

    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        if node.op != "call_function":
            return False
        return self.ops is None or _op_name(node.target) in self.ops


class _EtPartitioner(Partitioner):
    def __init__(self, ops: set[str] | None, tag_constants: bool, tag_mutated: bool) -> None:
        super().__init__()
        self.ops = ops
        self.tag_constants = tag_constants
        self.tag_mutated = tag_mutated
        self.delegation_spec = DelegationSpec("TexirOracleBackend", [])

    def partition(self, ep: Any) -> PartitionResult:
        tags = {}
        if self.ops is None:
            for node in ep.graph_module.graph.nodes:
                if node.op == "call_function":
                    node.meta["delegation_tag"] = "tag0"
            tags["tag0"] = self.delegation_spec
        else:
            partitions = generate_partitions_from_list_of_nodes(ep.graph_module, op_support=_Support(self.ops))
            for partition in partitions:
                tag = f"tag{partition.id}"
                for node in partition.nodes:
                    node.meta["delegation_tag"] = tag
                tags[tag] = self.delegation_spec
        if self.tag_constants:
            tag_constant_data(ep)
        if self.tag_mutated:
            tag_mutated_buffer(ep)
        return PartitionResult(tagged_exported_program=ep, partition_tags=tags)


def _et_signature(sig: Any) -> tuple[list[str], list[str]]:
    ins = [
        f"{s.kind.name}:{s.target}" if s.target else
        f"{s.kind.name}:{s.arg.name}" if s.arg.name.startswith("_lifted_tensor_constant") else s.kind.name
        for s in sig.input_specs
    ]
    outs = [f"{s.kind.name}:{s.target}" if s.target else s.kind.name for s in sig.output_specs]
    return ins, outs


_IN_KIND = {UserInput: "USER_INPUT", ParameterInput: "PARAMETER", BufferInput: "BUFFER", ConstantTensorInput: "CONSTANT_TENSOR"}


def _texir_signature(program: Program) -> tuple[list[str], list[str]]:
    ins = []
    for s in program.signature.inputs:
        kind = _IN_KIND[type(s)]
        ins.append(kind if isinstance(s, UserInput) else f"{kind}:{getattr(s, 'target')}")
    outs = []
    for o in program.signature.outputs:
        if isinstance(o, UserOutput):
            outs.append("USER_OUTPUT")
        elif isinstance(o, BufferMutation):
            outs.append(f"BUFFER_MUTATION:{o.target}")
        else:
            outs.append(type(o).__name__)
    return ins, outs


def _texir_ops(program: Program) -> int:
    return sum(
        isinstance(n, CallFunction) and n.target not in ("_operator::getitem", "texir::call_delegate")
        for n in program.graph.nodes
    )


def _et_ops(graph: Any) -> int:
    return sum(
        n.op == "call_function" and "getitem" not in str(n.target) and "executorch_call_delegate" not in str(n.target)
        for n in graph.nodes
    )


def _normalize(kinds: list[str]) -> list[str]:
    # ExecuTorch's edge dialect lifts scalar constants such as `add_(1.0)` into buffers named
    # `_lifted_tensor_constant*`; drop those so the comparison is about the model's own state.
    return [k for k in kinds if "_lifted_tensor_constant" not in k]


CASES = {
    "whole_mlp_tag_constants": (lambda: _seed(MLP()), (torch.randn(2, 4),), None, True, False),
    "add_mul_mlp": (lambda: _seed(MLP()), (torch.randn(2, 4),), {"aten.addmm.default", "aten.permute.default"}, True, False),
    "param_shared": (lambda: _seed(SharedParam()), (torch.randn(4),), {"aten.mul.Tensor"}, True, False),
    "buffers_consumed": (Buffers, (torch.randn(2, 4),), {"aten.add.Tensor", "aten.mul.Tensor"}, True, False),
    "lifted_constant": (LiftedConstant, (torch.randn(4),), None, True, False),
    "mutation_consumed": (Counter, (torch.randn(4),), None, False, True),
    "two_counters": (TwoCounters, (torch.randn(4),), {"aten.add.Tensor", "aten.mul.Tensor"}, False, True),
    "add_mul": (AddMul, (torch.randn(2, 4), torch.randn(2, 4)), {"aten.add.Tensor", "aten.mul.Tensor"}, False, False),
    "two_islands": (TwoIslands, (torch.randn(2, 4), torch.randn(2, 4)), {"aten.add.Tensor", "aten.mul.Tensor"}, False, False),
    "diamond": (Diamond, (torch.randn(2, 4),), {"aten.add.Tensor", "aten.mul.Tensor"}, False, False),
    "multi_out": (MultiOut, (torch.randn(2, 4), torch.randn(2, 4)), {"aten.add.Tensor", "aten.mul.Tensor"}, False, False),
    "residual": (
        lambda: _seed(Residual()),
        (torch.randn(2, 4),),
        {"aten.add.Tensor", "aten.mul.Tensor", "aten.relu.default"},
        True,
        False,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_partition_as_executorch(case: str) -> None:
    factory, args, ops, tag_consts, tag_mut = CASES[case]
    module: nn.Module = factory()
    et = to_edge(torch.export.export(module, args)).to_backend(_EtPartitioner(ops, tag_consts, tag_mut)).exported_program()
    program = export_program(module, args)
    if ops is None:
        partitioner: Any = WholeProgramPartitioner(TEST_BACKEND, tag_constants=tag_consts, tag_mutated_buffers=tag_mut)
    else:
        canonical = {op.replace("aten.", "aten::", 1) for op in ops}
        partitioner = OpSupportPartitioner(TEST_BACKEND, canonical, tag_constants=tag_consts, tag_mutated_buffers=tag_mut)
    lowered = to_backend(program, partitioner)

    et_delegates = et_get_lowered_submodules(et.graph_module)
    ours = get_lowered_submodules(lowered)
    prov = {n.name: lowered.graph.prov(i) for i, n in enumerate(lowered.graph.nodes)}
    assert len(ours) == len(et_delegates)
    assert [name for name, _, _ in ours] == [name for name, _, _ in et_delegates]
    for (_, ours_module, ours_call), (_, et_module, et_call) in zip(ours, et_delegates):
        sub = ours_module.original_program
        et_sub = et_module.original_module
        ins, outs = _texir_signature(sub)
        et_ins, et_outs = _et_signature(et_sub.graph_signature)
        assert (_normalize(ins), outs) == (_normalize(et_ins), et_outs)
        assert _texir_ops(sub) == _et_ops(et_sub.graph)
        call_meta, call_prov = lowered.graph.meta(ours_call), prov[ours_call.name]
        assert isinstance(call_meta, TupleMeta)
        assert len(call_meta.items) == len(et_call.meta["val"])
        assert call_prov is not None and call_prov.debug_handle == et_call.meta["debug_handle"]
    ins, outs = _texir_signature(lowered)
    et_ins, et_outs = _et_signature(et.graph_signature)
    assert (_normalize(ins), outs) == (_normalize(et_ins), et_outs)
    assert _texir_ops(lowered) == _et_ops(et.graph)
