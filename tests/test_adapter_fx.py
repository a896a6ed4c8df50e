"""The torch.export <-> IR adapter: conversion of every node/argument kind, round trips, errors."""

from __future__ import annotations

from typing import Any, cast

import msgspec
import pytest
import torch
from torch.export import Dim, export

from texir.adapters import from_exported_program, to_exported_program
from texir.errors import ConversionError, UnsupportedError
from texir.adapters.delegate_op import texir_call_delegate
from texir.ir import (
    BufferInput,
    CallFunction,
    CompileSpec,
    DelegateMeta,
    DeviceArg,
    DType,
    DTypeArg,
    FloatArg,
    GetAttr,
    Graph,
    GraphBuilder,
    GraphSignature,
    IntArg,
    Layout,
    LayoutArg,
    LoweredBackendModule,
    MemoryFormat,
    MemoryFormatArg,
    NamedLoweredModule,
    Output,
    Placeholder,
    Program,
    Ref,
    SubgraphMeta,
    SymIntMeta,
    TensorMeta,
    TupleMeta,
    UserInput,
    UserOutput,
    canonicalize,
    value_metas,
    verify,
)


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc2(torch.relu(self.fc1(x)))
        return out


class Stateful(torch.nn.Module):
    """Persistent and non-persistent buffers, in-place mutation, a lifted constant."""

    count: torch.Tensor
    scale: torch.Tensor

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
    persistent = {s.target: s.persistent for s in program.signature.inputs if isinstance(s, BufferInput)}
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
    assert all(isinstance(program.graph.meta(g), SubgraphMeta) for g in getattrs)
    assert [s.name for s in program.graph.subgraphs] == ["true_graph_0", "false_graph_0"]
    true_graph = program.graph.subgraphs[0].graph
    assert isinstance(true_graph.nodes[0], Placeholder)
    rebuilt = to_exported_program(program).module()
    for x in (torch.ones(3), -torch.ones(3)):
        _same_outputs(rebuilt(x), CondModel()(x))
    # Debug handles: top-level nodes first, then branches; placeholders and outputs have none.
    top = [(n, p) for n, _, p in program.graph.entries()]
    handles = [p.debug_handle for n, p in top if not isinstance(n, Placeholder) and p is not None]
    assert handles and handles[0] == 1
    assert all(p is None or p.debug_handle is None for n, p in top if isinstance(n, Placeholder))
    top_max = max(h for h in handles if h is not None)
    sub_handles = [p.debug_handle for n, _, p in true_graph.entries()
                   if isinstance(n, CallFunction) and p is not None]
    assert sub_handles and all(h is not None and h > top_max for h in sub_handles)


def test_multi_output_ops_and_scalar_none_list_args() -> None:
    model = MultiOut()
    x = torch.randn(2, 4)
    program = _roundtrip(_export(model, (x,)))
    max_node = next(n for n in program.graph.nodes if isinstance(n, CallFunction) and n.target == "aten::max.dim")
    max_meta = program.graph.meta(max_node)
    assert isinstance(max_meta, TupleMeta) and len(max_meta.items) == 2
    split = next(n for n in program.graph.nodes if isinstance(n, CallFunction) and "split" in n.target)
    split_meta = program.graph.meta(split)
    assert isinstance(split_meta, TupleMeta) and split_meta.is_list
    _same_outputs(to_exported_program(program).module()(x), model(x))


def test_dynamic_shapes_symbolic_meta_and_ranges() -> None:
    batch = Dim("batch", min=2, max=64)
    x, y = torch.randn(4, 2), torch.randn(6, 2)
    ep = _export(Dynamic(), (x, y), dynamic_shapes=({0: batch}, {0: Dim("other", min=2, max=32)}))
    program = _roundtrip(ep)
    first = program.graph.nodes[0]
    first_meta = program.graph.meta(first)
    assert isinstance(first, Placeholder) and isinstance(first_meta, TensorMeta)
    assert isinstance(first_meta.shape[0], str)
    assert {(r.min, r.max) for r in program.range_constraints} == {(2, 64), (2, 32)}
    # Each symbol keeps its example value, and IR -> FX gives the fake inputs those sizes again.
    assert sorted(r.hint or 0 for r in program.range_constraints) == [4, 6]
    rebuilt = to_exported_program(program)
    fake_sizes = [
        [d.node.hint for d in n.meta["val"].shape if isinstance(d, torch.SymInt)]
        for n in rebuilt.graph.nodes if n.op == "placeholder"
    ]
    assert fake_sizes == [[4], [6]]
    # A program built by hand has no hints: a value inside each range is chosen.
    no_hints = msgspec.structs.replace(program, range_constraints=tuple(
        msgspec.structs.replace(r, hint=None) for r in program.range_constraints
    ))
    for n in to_exported_program(no_hints).graph.nodes:
        if n.op == "placeholder":
            (d,) = [d for d in n.meta["val"].shape if isinstance(d, torch.SymInt)]
            assert 2 <= d.node.hint <= 32
    # A hint outside its range is a texir error naming the symbol, not an assertion inside torch.
    bad = msgspec.structs.replace(program, range_constraints=tuple(
        msgspec.structs.replace(r, hint=999) for r in program.range_constraints
    ))
    with pytest.raises(ConversionError, match=r"range constraint 's\d+': hint 999 is outside \[2, \d+\]"):
        to_exported_program(bad)
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


class Scalars(torch.nn.Module):
    """SymInt arithmetic, inf/nan floats, dtype/device/layout/memory_format arguments and an
    unbacked symbol (whose range is unbounded)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = x.shape[0]
        y = x.view(n * 2, -1).clamp(min=float("-inf"), max=float("inf"))
        z = torch.full((2,), float("nan"))
        w = torch.ones(3, dtype=torch.float16, device="cpu")
        c = x.unsqueeze(0).unsqueeze(0).clone(memory_format=torch.channels_last)
        u = cast(int, x.sum().to(torch.int64).item())
        torch._check(u >= 0)  # type: ignore[no-untyped-call]  # unannotated in torch
        return y, z, w, c, torch.zeros(u)


def test_symbolic_scalars_special_floats_and_enum_args() -> None:
    ep = _export(Scalars(), (torch.rand(4, 6),), dynamic_shapes=({0: Dim("n", min=2, max=100)},))
    program = _roundtrip(ep)
    calls = {n.name: n for n in program.graph.nodes if isinstance(n, CallFunction)}
    metas = value_metas(program.graph)
    targets = {n.target for n in calls.values()}
    assert {"aten::sym_size.int", "_operator::mul", "_operator::ge", "aten::full.default"} <= targets
    assert isinstance(metas["sym_size_int_1"], SymIntMeta)
    full = calls["full"]
    assert full.args[1] == FloatArg(value="nan")
    assert FloatArg(value="-inf") in calls["clamp"].args
    assert ("dtype", DTypeArg(value=DType.float16)) in calls["full_1"].kwargs
    assert ("layout", LayoutArg(value=Layout.strided)) in calls["full_1"].kwargs
    assert ("device", DeviceArg(value="cpu")) in calls["full_1"].kwargs
    assert ("memory_format", MemoryFormatArg(value=MemoryFormat.channels_last)) in calls["clone"].kwargs
    clone_meta = metas["clone"]
    assert isinstance(clone_meta, TensorMeta) and clone_meta.strides[1] == 1  # channels_last kept
    unbounded = {r.symbol: r for r in program.range_constraints}["u0"]
    assert unbounded.min == 0 and unbounded.max is None
    x = torch.rand(6, 6)
    got = to_exported_program(program).module()(x)
    want = Scalars()(x)
    for a, b in zip(got, want):
        assert torch.equal(a, b) or (a.isnan().all() and b.isnan().all())


class MapModel(torch.nn.Module):
    def forward(self, xs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        from torch._higher_order_ops.map import map as torch_map

        def body(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x.sin() + y

        out: torch.Tensor = torch_map(body, xs, y)  # type: ignore[arg-type]  # torch's map stub is too narrow
        return out


def test_map_subgraph_roundtrip() -> None:
    xs, y = torch.randn(3, 4), torch.randn(4)
    program = _roundtrip(_export(MapModel(), (xs, y)))
    call = next(n for n in program.graph.nodes if isinstance(n, CallFunction) and n.target.startswith("higher_order::"))
    assert call.target == "higher_order::map_impl"
    body = program.graph.subgraphs[0].graph
    assert [type(n).__name__ for n in body.nodes][:2] == ["Placeholder", "Placeholder"]
    _same_outputs(to_exported_program(program).module()(xs, y), MapModel()(xs, y))


class Sub(torch.nn.Module):
    w: torch.Tensor
    n: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(-1, 1, 4))
        self.register_buffer("n", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.n.add_(1)
        return (x * self.w).sin() + self.n, x.relu()


def _lowered_parent() -> Program:
    """A parent program calling one hand-built lowered module (parameter and buffer consumed)."""
    original = from_exported_program(_export(Sub(), (torch.randn(4),)), decompose=True)
    tm = TensorMeta(dtype=DType.float32, shape=(4,), strides=(1,))
    lowered = LoweredBackendModule(
        backend_id="demo", processed_bytes=b"blob", compile_specs=(CompileSpec(key="k", value=b"v"),),
        original_program=original,
    )
    b = GraphBuilder()
    b.add(Placeholder(name="x"), tm)
    b.add(GetAttr(name="lowered_module_0", target="lowered_module_0"), DelegateMeta(module="lowered_module_0"))
    b.add(CallFunction(name="call_delegate", target="texir::call_delegate",
                       args=(Ref(name="lowered_module_0"), Ref(name="x"))), TupleMeta(items=(tm, tm)))
    b.add(CallFunction(name="getitem", target="_operator::getitem",
                       args=(Ref(name="call_delegate"), IntArg(value=0))), tm)
    b.add(CallFunction(name="getitem_1", target="_operator::getitem",
                       args=(Ref(name="call_delegate"), IntArg(value=1))), tm)
    b.add(CallFunction(name="add", target="aten::add.Tensor", args=(Ref(name="getitem"), Ref(name="getitem_1"))), tm)
    b.add(Output(args=(Ref(name="add"),)))
    return Program(
        graph=b.build(),
        signature=GraphSignature(inputs=(UserInput(arg=Ref(name="x")),), outputs=(UserOutput(arg=Ref(name="add")),)),
        lowered_modules=(NamedLoweredModule(name="lowered_module_0", module=lowered),),
    )


def test_lowered_program_runs_like_executorch_call_delegate() -> None:
    parent = _lowered_parent()
    verify(parent)
    ep = to_exported_program(parent)
    call = next(n for n in ep.graph.nodes if n.name == "call_delegate")
    assert call.target is texir_call_delegate
    holder = getattr(ep.graph_module, "lowered_module_0")
    assert type(holder).__name__ == "LoweredBackendModule" and holder.backend_id == "demo"
    x = torch.randn(4)
    eager = Sub()
    want_a, want_b = eager(x)
    _same_outputs(ep.module()(x), want_a + want_b)
    # The delegate's own buffer advances with each call, as the original module's does.
    want_a, want_b = eager(x)
    _same_outputs(ep.module()(x), want_a + want_b)
    # Back to the IR: the lowered module comes back as the same IR object; a hand-built program
    # gains provenance and a module call graph on the first trip and is a fixed point after.
    once = from_exported_program(to_exported_program(parent))
    assert once.lowered_modules == parent.lowered_modules
    assert [n.name for n in once.graph.nodes] == [n.name for n in parent.graph.nodes]
    assert from_exported_program(to_exported_program(once)) == once
    # Torch can retrace through the delegate call (fake and functional implementations).
    retraced = ep.run_decompositions()
    assert any(n.target is texir_call_delegate for n in retraced.graph.nodes)
    want_a, want_b = eager(x)  # (retracing ran on fake tensors: no state was written)
    _same_outputs(retraced.module()(x), want_a + want_b)


class ConvReLU(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def t(x: torch.Tensor) -> torch.Tensor:
            return x.tan()

        def f(x: torch.Tensor) -> torch.Tensor:
            return x.relu() * 2

        y = torch.relu(self.conv(x))
        out: torch.Tensor = torch.cond(y.mean() > 0, t, f, (y,))
        return out + 1


def _refuses_edge_ops_without_the_bridge(edge: torch.export.ExportedProgram) -> None:
    """The adapters know no ExecuTorch operator themselves: with no namer registered (the bridge,
    texir.executorch, registers one when imported) an edge program is refused, saying what to do."""
    import texir.adapters.foreign as foreign
    import texir.adapters.targets as targets

    mp = pytest.MonkeyPatch()
    with mp.context() as patched:
        patched.setattr(foreign, "_TARGET_NAMERS", [])
        patched.setattr(targets, "_TARGET_NAME_CACHE", {})
        with pytest.raises(UnsupportedError, match="edge-dialect op; import texir.executorch"):
            from_exported_program(edge)


def test_debug_handles_match_executorch_and_rebuilt_program_feeds_to_edge() -> None:
    from executorch.exir import EdgeCompileConfig, to_edge
    from executorch.exir.graph_module import bfs_trace_with_node_process

    model, args = ConvReLU().eval(), (torch.randn(1, 3, 8, 8),)
    program = from_exported_program(_export(model, args), decompose=True)

    ours: list[tuple[str, int | None]] = []

    def walk(graph: Graph) -> None:
        for i, n in enumerate(graph.nodes):
            if isinstance(n, CallFunction) and n.target.startswith("aten::"):
                prov = graph.prov(i)
                ours.append((n.target, prov.debug_handle if prov else None))
        for s in graph.subgraphs:
            walk(s.graph)

    walk(program.graph)

    def edge_handles(ep: torch.export.ExportedProgram) -> list[tuple[str, int | None]]:
        edge = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False))
        seen: list[tuple[str, int | None]] = []

        def visit(node: torch.fx.Node) -> None:
            op = getattr(node.target, "_op", None)
            if node.op == "call_function" and op is not None and op.namespace == "aten":
                seen.append((f"{op._schema.name}.{op._overloadname}", node.meta.get("debug_handle")))

        bfs_trace_with_node_process(edge.exported_program().graph_module, visit)
        return seen

    edge = to_edge(_export(model, args), compile_config=EdgeCompileConfig(_check_ir_validity=False))
    _refuses_edge_ops_without_the_bridge(edge.exported_program())
    expected = edge_handles(_export(model, args))
    assert ours == expected
    # The rebuilt program goes through to_edge too, with the same handles.
    assert edge_handles(to_exported_program(program)) == expected


def test_get_attr_of_tensor_is_unsupported() -> None:
    ep = _export(MLP(), (torch.randn(2, 4),))
    gm = ep.graph_module
    gm.register_buffer("stray", torch.zeros(1))
    first = next(n for n in gm.graph.nodes if n.op == "call_function")
    with gm.graph.inserting_before(first):
        gm.graph.get_attr("stray")
    with pytest.raises(UnsupportedError, match="get_attr of Tensor 'stray'.*lifted"):
        from_exported_program(ep)


def test_bf16_state_payload_zero_copy() -> None:
    class Half(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3, 2).to(torch.bfloat16))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.w

    model = Half()
    x = torch.randn(3, 2).to(torch.bfloat16)
    program = _roundtrip(_export(model, (x,)))
    (entry,) = program.state
    assert entry.value.meta.dtype is DType.bfloat16 and entry.value.nbytes == 12
    _same_outputs(to_exported_program(program).module()(x), model(x))


def test_missing_tensor_data_is_a_conversion_error() -> None:
    program = from_exported_program(_export(MLP(), (torch.randn(2, 4),)))
    stripped = msgspec.structs.replace(program, state=tuple(
        msgspec.structs.replace(e, value=msgspec.structs.replace(e.value, data=None)) for e in program.state
    ))
    with pytest.raises(ConversionError, match="include_data=True"):
        to_exported_program(stripped)


def test_duplicate_node_name_is_a_conversion_error() -> None:
    program = from_exported_program(_export(MLP(), (torch.randn(2, 4),)))
    nodes = list(program.graph.nodes)
    i = next(i for i, n in enumerate(nodes) if isinstance(n, CallFunction) and n.target == "aten::relu.default")
    node = nodes[i]
    assert isinstance(node, CallFunction)
    nodes[i] = msgspec.structs.replace(node, name="x")
    bad = msgspec.structs.replace(program, graph=msgspec.structs.replace(program.graph, nodes=tuple(nodes)))
    with pytest.raises(ConversionError, match="'x' is used twice"):
        to_exported_program(bad)


def test_strided_and_offset_parameters_keep_their_layout() -> None:
    class Strided(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.t = torch.nn.Parameter(torch.arange(12.0).reshape(3, 4).t())  # strides (1, 4)
            self.s = torch.nn.Parameter(torch.arange(10.0)[3:7])  # storage offset 3

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x @ self.t).sum() + self.s

    model = Strided()
    x = torch.ones(2, 4)
    program = _roundtrip(_export(model, (x,)))
    metas = {e.target: e.value.meta for e in program.state}
    assert metas["t"].strides == (1, 4) and metas["s"].storage_offset == 3
    _same_outputs(to_exported_program(program).module()(x), model(x))
