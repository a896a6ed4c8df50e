"""Ahead-of-time checks of two more ExecuTorch backends through texir, without running them:
Vulkan and ExecuTorch's example backend must produce the blobs (and named data) ExecuTorch 1.5.1's
own `to_edge_transform_and_lower` produces for the same model.

Each side gets its own export: ExecuTorch's lowering changes the ExportedProgram it is given
(it drops constants it consumed), so the same object cannot be lowered twice."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from tests.vulkan_patterns import vulkan_pattern_graphs_once  # noqa: F401  (a fixture)
from tests.zoo import zoo_model
from texir.executorch import executorch_partitioner
from texir.ir import GetAttr, Program
from texir.orchestrate import lower

VULKAN_MODELS = ("mlp", "conv_bn", "attention", "resnet_tiny", "cond_simple", "embedding", "scalars", "cat_stack",
                 "where_mask", "dynamic_seq")
"""A spread of the zoo (linear, conv + batch norm, attention, residual convs, cond, embedding,
scalar operands, two partitions fused out of program order, a where with a scalar operand, symbolic
sizes that Vulkan takes as ATen `sym_size` ops); Vulkan's partitioner exports its fusion patterns on
every call (built once per module here: tests/vulkan_patterns.py), so not all."""


def test_ops_executorch_keeps_as_aten_are_the_ones_texir_names_bare() -> None:
    from executorch.exir.passes.executorch_prim_ops_registry import _EXECUTORCH_SYM_OPS
    from executorch.exir.passes.replace_aten_with_edge_pass import DISALLOW_LIST, should_lower_to_edge

    from texir.adapters.targets import canonical_target, resolve_target
    from texir.edge.names import NON_EDGE_OPS, edge_name_base

    kept = {canonical_target(op) for op in (*_EXECUTORCH_SYM_OPS, *DISALLOW_LIST)
            if isinstance(op, torch._ops.OpOverload) and op.namespace == "aten"}
    assert kept == NON_EDGE_OPS
    for name in NON_EDGE_OPS:
        op = resolve_target(name)
        assert isinstance(op, torch._ops.OpOverload) and not should_lower_to_edge(op)
    assert edge_name_base("aten::sym_size.int") == "sym_size"
    assert edge_name_base("aten::scalar_tensor.default") == "scalar_tensor"
    assert edge_name_base("aten::add.Tensor") == "aten_add_tensor"


def _blobs_executorch(ep: torch.export.ExportedProgram, partitioner: Any) -> list[tuple[str, bytes, dict[str, bytes]]]:
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir.lowered_backend_module import LoweredBackendModule

    gm = to_edge_transform_and_lower(ep, partitioner=[partitioner]).exported_program().graph_module
    found = []
    for node in gm.graph.nodes:
        module = getattr(gm, str(node.target), None) if node.op == "get_attr" else None
        if isinstance(module, LoweredBackendModule):
            store = module.named_data_store_output
            named = {} if store is None else {k: bytes(store.buffers[e.buffer_index]) for k, e in store.pte_data.items()}
            found.append((module.backend_id, bytes(module.processed_bytes), named))
    return found


def _blobs_texir(program: Program) -> list[tuple[str, bytes, dict[str, bytes]]]:
    modules = {m.name: m.module for m in program.lowered_modules}
    found = []
    for node in program.graph.nodes:  # in graph order, as ExecuTorch's get_attr nodes
        module = modules.get(node.target) if isinstance(node, GetAttr) else None
        if module is not None:
            named = {e.key: e.data.tobytes() if e.data is not None else b"" for e in module.named_data}
            found.append((module.backend_id, module.processed_bytes, named))
    return found


def _export(name: str) -> Callable[[], torch.export.ExportedProgram]:
    model = zoo_model(name)

    def make() -> torch.export.ExportedProgram:
        module, args = model.build()
        return torch.export.export(module, args, dynamic_shapes=model.dynamic_shapes, strict=False)

    return make


@pytest.mark.usefixtures("vulkan_pattern_graphs_once")
@pytest.mark.parametrize("name", VULKAN_MODELS)
def test_vulkan_blobs_equal_executorch(name: str) -> None:
    from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

    make = _export(name)
    ours = _blobs_texir(lower(make(), [executorch_partitioner(VulkanPartitioner())], cache=None).program)
    theirs = _blobs_executorch(make(), VulkanPartitioner())
    assert ours and [b[0] for b in ours] == ["VulkanBackend"] * len(ours)
    assert [b[0] for b in ours] == [b[0] for b in theirs]
    for i, (mine, other) in enumerate(zip(ours, theirs)):
        assert mine[1] == other[1], f"{name}: Vulkan blob {i} differs"
        assert mine[2] == other[2], f"{name}: Vulkan named data of delegate {i} differ"


class _SmallQuantizedNet(nn.Module):
    """Convolutions, pooling and a linear layer: the patterns the example backend takes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3)
        self.conv2 = nn.Conv2d(8, 8, 3)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(x))
        x = self.conv2(x)
        return self.fc(torch.flatten(self.pool(x), 1))


def _example_quantized() -> torch.export.ExportedProgram:
    from executorch.backends.example.example_quantizer import ExampleQuantizer
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(0)
    args = (torch.rand(1, 3, 16, 16),)
    module = torch.export.export(_SmallQuantizedNet().eval(), args, strict=False).module()
    prepared = prepare_pt2e(module, ExampleQuantizer())  # type: ignore[arg-type]  # torchao accepts the unlifted module
    prepared(*args)
    return torch.export.export(convert_pt2e(prepared), args, strict=False)


_INSERTED = re.compile(rb"dim_order_ops__to_dim_order_copy_default(_\d+)?")


def test_example_backend_blobs_equal_executorch() -> None:
    """The example backend's blob is the printed FX graph of its sub-program after its own passes,
    node names included, so it checks that texir hands backends ExecuTorch's edge names, order,
    arguments and output form. One part of it is not deterministic under ExecuTorch either: the
    backend names the layout copies it inserts in the order of a Python set of FX nodes (hashed by
    address), so their numeric suffixes vary from run to run; those suffixes are masked."""
    from executorch.backends.example.example_partitioner import ExamplePartitioner

    ours = _blobs_texir(lower(_example_quantized(), [executorch_partitioner(ExamplePartitioner())], cache=None).program)
    theirs = _blobs_executorch(_example_quantized(), ExamplePartitioner())
    assert len(ours) == len(theirs) >= 2
    assert {b[0] for b in ours} == {b[0] for b in theirs} == {"ExampleBackend"}
    mine = sorted(_INSERTED.sub(b"COPY", b[1]) for b in ours)  # delegates compared as a multiset
    other = sorted(_INSERTED.sub(b"COPY", b[1]) for b in theirs)
    assert all(b"quantized_decomposed_dequantize_per_tensor_default" in m for m in mine)  # ExecuTorch's names
    assert mine == other
    assert sorted(len(_INSERTED.findall(b[1])) for b in ours) == sorted(len(_INSERTED.findall(b[1])) for b in theirs)
