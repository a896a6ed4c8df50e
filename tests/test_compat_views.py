"""`texir.compat`'s `exported_program()` as ExecuTorch's own types: each texir delegate call is
ExecuTorch's `executorch_call_delegate` on an ExecuTorch `LoweredBackendModule` (control-flow
branches and every method too), so ExecuTorch's utilities read it; `_edge_programs` and
`_named_data_store` are what ExecuTorch's manager keeps; and a view fed back into texir gives the
same bytes."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

pytest.importorskip("executorch")

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner  # noqa: E402
from executorch.exir.backend.backend_details import BackendDetails  # noqa: E402
from executorch.exir.backend.backend_details import PreprocessResult as EtPreprocessResult  # noqa: E402
from executorch.exir.backend.canonical_partitioners.all_node_partitioner import AllNodePartitioner  # noqa: E402
from executorch.exir.backend.compile_spec_schema import CompileSpec  # noqa: E402
from executorch.exir.backend.test.op_partitioner_demo import AddMulPartitionerDemo  # noqa: E402
from executorch.exir.backend.utils import (  # noqa: E402
    format_delegated_graph,
    get_delegates,
    get_non_lowered_nodes,
)
from executorch.exir.delegate import executorch_call_delegate  # noqa: E402
from executorch.exir.lowered_backend_module import (  # noqa: E402
    LoweredBackendModule,
    get_lowered_submodules,
)

import texir.compat  # noqa: E402  (after the importorskip: the facade needs executorch)
from texir.errors import ConversionError  # noqa: E402
from texir.executorch import import_executorch_program  # noqa: E402
from texir.lowering import BackendPreprocessError  # noqa: E402


class LinearSin(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.linear(x)) * 2


class AddMul(torch.nn.Module):
    def forward(self, a: torch.Tensor, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        z = torch.mm(a, x) + b
        return torch.mm(z - a, x) + b


class CondAddMul(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        def true_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return (x - y) + y

        def false_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.mm(x - y, y)

        x = x + y
        return torch.cond(x[0][0] == 1, true_fn, false_fn, [x, y]) - y


@pytest.fixture(scope="module")
def xnnpack_edge() -> texir.compat.EdgeProgramManager:
    torch.manual_seed(0)
    ep = torch.export.export(LinearSin(), (torch.randn(2, 4),), strict=True)
    return texir.compat.to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])


@pytest.fixture(scope="module")
def addmul_inputs() -> tuple[torch.Tensor, ...]:
    torch.manual_seed(1)
    return (torch.randn(2, 2), torch.randn(2, 2), torch.randn(2, 2))


@pytest.fixture(scope="module")
def addmul_edge(addmul_inputs: tuple[torch.Tensor, ...]) -> texir.compat.EdgeProgramManager:
    ep = torch.export.export(AddMul(), addmul_inputs, strict=True)
    return texir.compat.to_edge(ep).to_backend(AddMulPartitionerDemo())


def _lowered(gm: torch.fx.GraphModule) -> list[Any]:
    return [module for _, module, _ in get_lowered_submodules(gm)]


def test_the_view_holds_executorchs_delegate_call_and_lowered_module(
    xnnpack_edge: texir.compat.EdgeProgramManager,
) -> None:
    view = xnnpack_edge.exported_program()
    assert xnnpack_edge.exported_program() is view and xnnpack_edge._edge_programs["forward"] is view
    calls = [n for n in view.graph.nodes if n.op == "call_function" and n.target is executorch_call_delegate]
    assert len(calls) == 1 and isinstance(calls[0].meta["val"], list)
    (module,) = _lowered(view.graph_module)
    assert type(module) is LoweredBackendModule
    ours = xnnpack_edge.program().lowered_modules[0].module
    assert module.backend_id == ours.backend_id == "XnnpackBackend"
    assert module.processed_bytes == ours.processed_bytes
    assert all(isinstance(spec, CompileSpec) for spec in module.compile_specs)
    assert [(s.key, s.value) for s in module.compile_specs] == [(s.key, s.value) for s in ours.compile_specs]
    assert isinstance(module.original_module, torch.export.ExportedProgram)
    assert module.original_module.dialect == "EDGE"
    assert "debug_handle_map" in module.meta
    store = module.named_data_store_output
    assert sorted(store.pte_data) == sorted(e.key for e in ours.named_data)
    for entry in ours.named_data:
        assert entry.data is not None
        assert store.buffers[store.pte_data[entry.key].buffer_index] == entry.data.tobytes()


def test_executorchs_utilities_see_the_delegates(xnnpack_edge: texir.compat.EdgeProgramManager) -> None:
    view = xnnpack_edge.exported_program()
    assert len(get_delegates(view.graph)) == 1
    text = format_delegated_graph(view.graph_module)
    assert "backend_id: XnnpackBackend" in text and "aten.linear.default" in text
    assert not [n for n in get_non_lowered_nodes(view.graph) if "linear" in str(n.target)]


def test_the_view_runs_and_traces_as_executorchs(
    addmul_edge: texir.compat.EdgeProgramManager, addmul_inputs: tuple[torch.Tensor, ...]
) -> None:
    view = addmul_edge.exported_program()
    torch.testing.assert_close(view.module()(*addmul_inputs), AddMul()(*addmul_inputs))
    modules = _lowered(view.graph_module)
    assert len(modules) == 2 and all(type(m) is LoweredBackendModule for m in modules)
    assert all(len(m.meta["debug_handle_map"]) == 2 for m in modules)  # as test_debug_handle_map reads it
    assert all(m.original_module.dialect == "EDGE" for m in modules)

    class Holder(torch.nn.Module):
        def __init__(self, lowered: Any) -> None:
            super().__init__()
            self.lowered = lowered

        def forward(self, a: torch.Tensor, x: torch.Tensor, b: torch.Tensor) -> Any:
            return executorch_call_delegate(self.lowered, a, x, b)

    traced = torch.export.export(Holder(modules[0]), addmul_inputs, strict=False)
    assert any(n.target is executorch_call_delegate for n in traced.graph.nodes)
    # the lowered module also emits as ExecuTorch's own does
    assert len(modules[0].buffer()) > 0


def test_delegates_in_cond_branches_are_executorchs() -> None:
    inputs = (torch.ones(2, 2), torch.ones(2, 2))
    edge = texir.compat.to_edge(torch.export.export(CondAddMul(), inputs, strict=True))
    view = edge.to_backend(AddMulPartitionerDemo()).exported_program()
    branches = [getattr(view.graph_module, str(n.target)) for n in view.graph.nodes
                if n.op == "get_attr" and isinstance(getattr(view.graph_module, str(n.target)), torch.fx.GraphModule)]
    assert len(branches) == 2
    for branch in branches:
        modules = _lowered(branch)
        assert modules and all(type(m) is LoweredBackendModule for m in modules)
        assert any(n.target is executorch_call_delegate for n in branch.graph.nodes)
    torch.testing.assert_close(view.module()(*inputs), CondAddMul()(*inputs))


def test_every_method_has_its_own_view() -> None:
    inputs = (torch.randn(2, 2),) * 3
    ep = torch.export.export(AddMul(), inputs, strict=True)
    edge = texir.compat.to_edge({"forward": ep, "other": copy.deepcopy(ep)}).to_backend(AddMulPartitionerDemo())
    views = edge._edge_programs
    assert sorted(views) == ["forward", "other"] and edge._edge_programs is views
    for method, view in views.items():
        assert edge.exported_program(method) is view
        assert len(get_delegates(view.graph)) == 2


def test_named_data_store_holds_every_delegates_named_data(xnnpack_edge: texir.compat.EdgeProgramManager) -> None:
    store = xnnpack_edge._named_data_store
    assert xnnpack_edge._named_data_store is store
    keys = {e.key for e in xnnpack_edge.program().lowered_modules[0].module.named_data}
    assert keys and set(store.get_named_data_store_output().pte_data) == keys


def test_a_view_fed_back_gives_the_same_bytes(xnnpack_edge: texir.compat.EdgeProgramManager) -> None:
    before = xnnpack_edge.to_executorch().buffer
    edge = texir.compat.EdgeProgramManager({"forward": xnnpack_edge.program()})
    edge._edge_programs["forward"] = copy.deepcopy(edge.exported_program())  # ExecuTorch's tests put programs here
    assert edge.to_executorch().buffer == before
    assert edge.transform([lambda gm: None]).to_executorch().buffer == before


def test_a_caller_replacing_a_method_with_executorchs_to_backend_changes_it(
    addmul_inputs: tuple[torch.Tensor, ...],
) -> None:
    from executorch.exir.backend.backend_api import to_backend

    ep = torch.export.export(AddMul(), addmul_inputs, strict=True)
    edge = texir.compat.to_edge(ep)
    assert not edge.program().lowered_modules
    edge._edge_programs["forward"] = to_backend(edge.exported_program(), AddMulPartitionerDemo())
    program = edge.program()
    assert {m.module.backend_id for m in program.lowered_modules} == {"BackendWithCompilerDemo"}
    assert len(get_delegates(edge.exported_program().graph)) == 2
    assert edge.to_executorch().buffer == texir.compat.to_edge(ep).to_backend(AddMulPartitionerDemo()).to_executorch().buffer


def test_a_view_that_is_not_a_program_is_a_typed_error(xnnpack_edge: texir.compat.EdgeProgramManager) -> None:
    edge = texir.compat.EdgeProgramManager({"forward": xnnpack_edge.program()})
    edge._edge_programs["forward"] = "not a program"  # type: ignore[assignment]  # the bad input under test
    with pytest.raises(ConversionError, match=r"_edge_programs\['forward'\] is a str"):
        edge.to_executorch()


class Counter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(1)
        return x + self.count


def test_after_to_executorch_the_view_writes_mutated_buffers_back() -> None:
    ep = torch.export.export(Counter(), (torch.zeros(1),), strict=True)
    edge = texir.compat.to_edge(ep)
    copies = [n for n in edge.exported_program().graph.nodes if n.target is torch.ops.aten.copy_.default]
    assert not copies  # the edge view has none, as ExecuTorch's edge program
    et = edge.to_executorch()
    view = et.exported_program()
    assert et.exported_program() is view
    (copy_node,) = [n for n in view.graph.nodes if n.target is torch.ops.aten.copy_.default]
    assert copy_node.args[0].name == "b_count"
    assert et.buffer == edge.to_executorch().buffer  # the view changes no byte


_INFO = {"kind": "demo", "sizes": (1, 2), "nested": {"b": 1.5, "a": None}}


class DelegateInfoDemo(BackendDetails):  # type: ignore[misc]  # ExecuTorch's class is untyped
    """An ExecuTorch backend attaching `_delegate_info_meta` (a JSON value) to its result."""

    @staticmethod
    def preprocess(edge_program: Any, compile_specs: list[Any]) -> Any:
        return EtPreprocessResult(processed_bytes=b"info", _delegate_info_meta=_INFO)


class OpaqueInfoDemo(BackendDetails):  # type: ignore[misc]  # ExecuTorch's class is untyped
    """An ExecuTorch backend attaching a Python object texir's IR cannot hold."""

    @staticmethod
    def preprocess(edge_program: Any, compile_specs: list[Any]) -> Any:
        return EtPreprocessResult(processed_bytes=b"opaque", _delegate_info_meta={"handle": object()})


def _sin_edge() -> texir.compat.EdgeProgramManager:
    return texir.compat.to_edge(torch.export.export(Sin(), (torch.ones(1),), strict=True))


class Sin(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x)


def test_delegate_info_meta_is_kept_in_the_ir_and_shown_in_the_view() -> None:
    lowered = _sin_edge().to_backend(AllNodePartitioner("DelegateInfoDemo", []))
    ours = lowered.program().lowered_modules[0].module
    assert ours.delegate_info == '{"kind":"demo","nested":{"a":null,"b":1.5},"sizes":[1,2]}'
    (module,) = _lowered(lowered.exported_program().graph_module)
    assert module.meta["_delegate_info_meta"] == {"kind": "demo", "sizes": [1, 2], "nested": {"b": 1.5, "a": None}}
    # a view fed back is imported with it, and the view of that import shows it again
    again = texir.compat.EdgeProgramManager({"forward": lowered.program()})
    again._edge_programs["forward"] = lowered.exported_program()
    reimported = import_executorch_program(lowered.exported_program())
    assert reimported.lowered_modules[0].module.delegate_info == ours.delegate_info
    assert again.to_executorch().buffer == lowered.to_executorch().buffer  # never written to the file


def test_delegate_info_meta_is_set_only_when_the_backend_gives_one(
    addmul_edge: texir.compat.EdgeProgramManager, xnnpack_edge: texir.compat.EdgeProgramManager
) -> None:
    # ExecuTorch's BackendWithCompilerDemo attaches "test" (test_delegate_info_partitioner reads it)
    assert [m.module.delegate_info for m in addmul_edge.program().lowered_modules] == ['"test"', '"test"']
    assert [m.meta["_delegate_info_meta"] for m in _lowered(addmul_edge.exported_program().graph_module)] == ["test"] * 2
    # texir's native XNNPACK backend attaches none: the key is absent, as after ExecuTorch's to_backend
    assert xnnpack_edge.program().lowered_modules[0].module.delegate_info is None
    assert all("_delegate_info_meta" not in m.meta for m in _lowered(xnnpack_edge.exported_program().graph_module))


def test_delegate_info_meta_that_is_not_json_is_a_typed_error() -> None:
    with pytest.raises(BackendPreprocessError, match=r"OpaqueInfoDemo.*\['handle'\] is a builtins.object.*JSON values"):
        _sin_edge().to_backend(AllNodePartitioner("OpaqueInfoDemo", []))
