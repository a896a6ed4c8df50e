"""The torch.export <-> IR adapter: conversion of every node/argument kind, round trips, errors."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import torch
from torch.export import Dim, export

from texir.adapters import from_exported_program, to_exported_program
from texir.errors import ConversionError, UnsupportedError
from texir.ir import (
    CallFunction,
    GetAttr,
    Placeholder,
    Program,
    SubgraphMeta,
    TensorMeta,
    TupleMeta,
    canonicalize,
    verify,
)


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class Stateful(torch.nn.Module):
    """Persistent and non-persistent buffers, in-place mutation, a lifted constant."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(3))
        self.register_buffer("scale", torch.full((3,), 2.0), persistent=False)
        self.const = torch.arange(3, dtype=torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(1)
        return x * self.scale + self.const + self.count


class CondModel(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def true_fn(x: torch.Tensor) -> torch.Tensor:
            return x.sin() + 1

        def false_fn(x: torch.Tensor) -> torch.Tensor:
            return x.cos() * 2

        out: torch.Tensor = torch.cond(x.sum() > 0, true_fn, false_fn, (x,))
        return out


class MultiOut(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values, indices = x.max(dim=1)
        a, b = torch.split(x, [1, 3], dim=1)
        return values, indices, a.clamp(min=None, max=0.5), b.sum(dim=[0, 1], keepdim=True)


class Dynamic(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = torch.cat([x, y], dim=0)
        return z.reshape(-1, 2).float().softmax(dim=-1) * z.shape[0]


def _export(model: torch.nn.Module, args: tuple[Any, ...], **kw: Any) -> torch.export.ExportedProgram:
    return export(model.eval(), args, **kw)


def _roundtrip(ep: torch.export.ExportedProgram, *, decompose: bool = True) -> Program:
    program = from_exported_program(ep, decompose=decompose)
    verify(program)
    rebuilt = to_exported_program(program)
    again = from_exported_program(rebuilt)
    assert again == program
    return program


def _same_outputs(a: Any, b: Any) -> None:
    fa, _ = torch.utils._pytree.tree_flatten(a)
    fb, _ = torch.utils._pytree.tree_flatten(b)
    assert len(fa) == len(fb)
    for x, y in zip(fa, fb):
        assert torch.equal(x, y)


def test_mlp_roundtrip_outputs_equal_eager() -> None:
    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(2, 4)
    program = _roundtrip(_export(model, (x,)))
    targets = [n.target for n in program.graph.nodes if isinstance(n, CallFunction)]
    assert "aten::relu.default" in targets and "aten::addmm.default" in targets
    names = [n.name for n in program.graph.nodes]
    assert names[:5] == ["p_fc1_weight", "p_fc1_bias", "p_fc2_weight", "p_fc2_bias", "x"]
    rebuilt = to_exported_program(program)
    _same_outputs(rebuilt.module()(x), model(x))
    assert [s.target for s in program.state] == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    # Same ops, same node names after the round trip.
    assert [n.name for n in rebuilt.graph.nodes] == names


def test_state_payload_is_zero_copy_and_hashed() -> None:
    model = MLP()
    program = from_exported_program(_export(model, (torch.randn(2, 4),)))
    entry = next(e for e in program.state if e.target == "fc1.weight")
    assert entry.value.data is not None
    view = entry.value.data.view()
    assert view.readonly and view.nbytes == 8 * 4 * 4
    import hashlib

    assert entry.value.sha256 == hashlib.sha256(model.fc1.weight.detach().numpy().tobytes()).hexdigest()
    # Zero-copy: the payload aliases the parameter's storage.
    import numpy as np

    arr = np.frombuffer(view, dtype=np.uint8)
    assert arr.ctypes.data == model.fc1.weight.data_ptr()


def test_buffers_mutation_and_constants() -> None:
    model = Stateful()
    x = torch.randn(3)
    ep = _export(Stateful(), (x,))
    program = _roundtrip(ep)
    kinds = [type(s).__name__ for s in program.signature.inputs]
    assert kinds == ["BufferInput", "BufferInput", "ConstantTensorInput", "UserInput"]
    persistent = {s.target: s.persistent for s in program.signature.inputs if type(s).__name__ == "BufferInput"}
    assert persistent == {"count": True, "scale": False}
    assert type(program.signature.outputs[0]).__name__ == "BufferMutation"
    rebuilt = to_exported_program(program).module()
    for _ in range(3):
        _same_outputs(rebuilt(x), model(x))
    # Running the rebuilt program never writes into the IR's payloads.
    assert from_exported_program(to_exported_program(program)) == program


def test_cond_subgraphs_and_debug_handles() -> None:
    ep = _export(CondModel(), (torch.randn(3),))
    program = _roundtrip(ep)
    getattrs = [n for n in program.graph.nodes if isinstance(n, GetAttr)]
    assert [g.target for g in getattrs] == ["true_graph_0", "false_graph_0"]
    assert all(isinstance(g.meta, SubgraphMeta) for g in getattrs)
    assert [s.name for s in program.graph.subgraphs] == ["true_graph_0", "false_graph_0"]
    true_graph = program.graph.subgraphs[0].graph
    assert isinstance(true_graph.nodes[0], Placeholder)
    rebuilt = to_exported_program(program).module()
    for x in (torch.ones(3), -torch.ones(3)):
        _same_outputs(rebuilt(x), CondModel()(x))
    # Debug handles: top-level nodes first, then branches; placeholders and outputs have none.
    handles = [n.prov.debug_handle for n in program.graph.nodes if not isinstance(n, Placeholder)
               and n.prov is not None]
    assert handles and handles[0] == 1
    assert all(n.prov is None or n.prov.debug_handle is None for n in program.graph.nodes
               if isinstance(n, Placeholder))
    top_max = max(h for h in handles if h is not None)
    sub_handles = [n.prov.debug_handle for n in true_graph.nodes
                   if isinstance(n, CallFunction) and n.prov is not None]
    assert sub_handles and all(h is not None and h > top_max for h in sub_handles)


def test_multi_output_ops_and_scalar_none_list_args() -> None:
    model = MultiOut()
    x = torch.randn(2, 4)
    program = _roundtrip(_export(model, (x,)))
    max_node = next(n for n in program.graph.nodes if isinstance(n, CallFunction) and n.target == "aten::max.dim")
    assert isinstance(max_node.meta, TupleMeta) and len(max_node.meta.items) == 2
    split = next(n for n in program.graph.nodes if isinstance(n, CallFunction) and "split" in n.target)
    assert isinstance(split.meta, TupleMeta) and split.meta.is_list
    _same_outputs(to_exported_program(program).module()(x), model(x))


def test_dynamic_shapes_symbolic_meta_and_ranges() -> None:
    batch = Dim("batch", min=2, max=64)
    x, y = torch.randn(4, 2), torch.randn(6, 2)
    ep = _export(Dynamic(), (x, y), dynamic_shapes=({0: batch}, {0: Dim("other", min=2, max=32)}))
    program = _roundtrip(ep)
    first = program.graph.nodes[0]
    assert isinstance(first, Placeholder) and isinstance(first.meta, TensorMeta)
    assert isinstance(first.meta.shape[0], str)
    assert {(r.min, r.max) for r in program.range_constraints} == {(2, 64), (2, 32)}
    rebuilt = to_exported_program(program)
    for n in (3, 9):
        a, b = torch.randn(n, 2), torch.randn(n + 1, 2)
        _same_outputs(rebuilt.module()(a, b), Dynamic()(a, b))
    # The rebuilt program can be decomposed again (fake tensors and ShapeEnv are consistent).
    # (torch renames one node while retracing, so compare canonical forms.)
    assert canonicalize(from_exported_program(rebuilt.run_decompositions())) == canonicalize(program)


def test_unsupported_target_names_node_and_fix() -> None:
    program = from_exported_program(_export(MLP(), (torch.randn(2, 4),)))
    nodes = list(program.graph.nodes)
    i = next(i for i, n in enumerate(nodes) if isinstance(n, CallFunction))
    node = nodes[i]
    assert isinstance(node, CallFunction)
    nodes[i] = msgspec.structs.replace(node, target="nosuchns::nosuchop.default")
    bad = msgspec.structs.replace(program, graph=msgspec.structs.replace(program.graph, nodes=tuple(nodes)))
    with pytest.raises(UnsupportedError, match="nosuchns::nosuchop.default"):
        to_exported_program(bad)


def test_unsupported_fx_target() -> None:
    ep = _export(MLP(), (torch.randn(2, 4),))
    gm = ep.graph_module
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    node.target = print  # not an op texir can name
    with pytest.raises(UnsupportedError, match=f"node {node.name!r}.*run_decompositions"):
        from_exported_program(ep)


def test_wrong_input_types() -> None:
    with pytest.raises(ConversionError):
        from_exported_program("not a program")  # type: ignore[arg-type]
    with pytest.raises(ConversionError):
        to_exported_program("not a program")  # type: ignore[arg-type]
