"""The edge passes: each is pure and idempotent, keeps the program valid, and turns a small program
into its golden after-form (tests/golden/edge/<pass>/before.txt and after.txt, written here from
torch exports; tests/test_edge_goldens.py replays them text in, text out, without torch)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
import torch

from texir.adapters import from_exported_program, to_exported_program
from texir.edge import (
    EMIT_TO_EDGE,
    TO_EXECUTORCH,
    EDGE_DIALECT,
    EdgeError,
    cast_mixed_operands,
    compact_debug_handles,
    inline_mixed_scalars,
    insert_write_back,
    prune_empty_tensors,
    remove_graph_asserts,
    reduce_zero_dim_sums,
    remove_noop_ops,
    remove_unused_state,
    replace_view_copies_with_views,
    replace_view_ops,
    sym_operands_to_tensors,
    to_dim_order_ops,
    to_edge_program,
)
from texir.ir import (
    CallFunction,
    DType,
    DTypeArg,
    ListArg,
    MemoryFormat,
    MemoryFormatArg,
    NoneArg,
    Program,
    Ref,
    format_program,
    verify,
)
from texir.ir.analysis import call_nodes
from texir.ir.names import MEMORY_VIEW
from texir.edge.view_copy import VIEW_COPY
from texir.executorch.runtime import load_method
from texir.ir.canonical import drop_stack_traces
from texir.emit import emit
from texir.serialize.pte import dumps
from texir.testing.golden import Golden


class Casts(torch.nn.Module):
    def forward(self, x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float16).to(torch.float32) * i + i


class Views(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(3, 2).t().contiguous() + x.reshape(2, 3).permute(1, 0).reshape(2, 3)


class Reshapes(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x.view(3, 2) * 2
        return y.view(6), y.view(2, 3) + 1  # the first reshape is an output: a copy, never a view


class FullSlice(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.narrow(x, 1, 0, 3).relu() + x[:, 1:].sum()


class CatEmpty(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        empty = x[:, 3:]  # (2, 0), as Phi-3's q[..., rotary_dim:] with a full rotary
        return torch.cat([x.relu(), empty.neg()], -1), torch.cat([empty, empty * 2], -1)


class Counter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(3))
        self.register_buffer("total", torch.zeros(3))
        self.unused = torch.nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(1)
        self.total.add_(x.sum(0))
        return x + self.count


class SymOperand(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(0) + x.shape[0]  # traced as add.Tensor(tensor, SymInt)


class Scalars(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 2 + 0.5).relu() - 1  # int literals cast to float; 0.5 is float32 already


class Formats(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x.clone(memory_format=torch.channels_last), x.clone(), torch.empty_like(x).fill_(1.0))


ARGS: dict[str, tuple[Callable[[], torch.nn.Module], tuple[Any, ...]]] = {
    "casts": (Casts, (torch.randn(2, 3), torch.ones(2, 3, dtype=torch.int64))),
    "views": (Views, (torch.randn(2, 3),)),
    "reshapes": (Reshapes, (torch.randn(2, 3),)),
    "full_slice": (FullSlice, (torch.randn(2, 3),)),
    "cat_empty": (CatEmpty, (torch.randn(2, 3),)),
    "counter": (Counter, (torch.randn(2, 3),)),
    "formats": (Formats, (torch.randn(1, 2, 3, 4),)),
    "sym_operand": (SymOperand, (torch.randn(4, 3),)),
    "scalars": (Scalars, (torch.randn(2, 3),)),
}
DYNAMIC: dict[str, Any] = {"sym_operand": ({0: torch.export.Dim("n", min=2, max=8)},)}


@functools.cache
def program(name: str, decompose: bool = True) -> Program:
    if name == "full_slice_without_noops":  # remove_noop_ops leaves a gap in the debug handles
        return remove_noop_ops(program("full_slice", decompose))
    if name == "reshapes_edge":  # to_executorch's view pass reads the edge form's view_copy nodes
        return replace_view_ops(program("reshapes", decompose))
    build, args = ARGS[name]
    ep = torch.export.export(build().eval(), args, strict=False, dynamic_shapes=DYNAMIC.get(name))
    # ("formats" decomposes empty_like to empty_permuted, outside core ATen: ExecuTorch's to_edge refuses it)
    return from_exported_program(ep, decompose=decompose, allow_non_core=True)


CASES = [
    ("remove_graph_asserts", remove_graph_asserts, "casts", False),
    ("cast_mixed_operands", cast_mixed_operands, "casts", True),
    ("remove_noop_ops", remove_noop_ops, "full_slice", True),
    ("prune_empty_tensors", prune_empty_tensors, "cat_empty", True),
    ("replace_view_ops", replace_view_ops, "views", True),
    ("to_dim_order_ops", to_dim_order_ops, "formats", True),
    ("insert_write_back", insert_write_back, "counter", True),
    ("remove_unused_state", remove_unused_state, "counter", True),
    ("sym_operands_to_tensors", sym_operands_to_tensors, "sym_operand", True),
    ("compact_debug_handles", compact_debug_handles, "full_slice_without_noops", True),
    ("replace_view_copies_with_views", replace_view_copies_with_views, "reshapes_edge", True),
    ("inline_mixed_scalars", inline_mixed_scalars, "scalars", True),
]


def _targets(p: Program) -> list[str]:
    return [n.target for n in call_nodes(p.graph)]


def golden_form(p: Program) -> Program:
    """What a golden's text holds: no stack traces, no tensor bytes (state by hash only)."""
    state = tuple(msgspec.structs.replace(e, value=msgspec.structs.replace(e.value, data=None)) for e in p.state)
    return msgspec.structs.replace(drop_stack_traces(p), state=state)


@pytest.mark.parametrize(("pass_name", "edge_pass", "model", "decompose"), CASES, ids=[c[0] for c in CASES])
def test_pass_golden_pure_and_idempotent(
    pass_name: str, edge_pass: Callable[[Program], Program], model: str, decompose: bool, golden: Golden
) -> None:
    before = golden_form(program(model, decompose))
    verify(before)
    snapshot = format_program(before)
    after = edge_pass(before)
    verify(after)
    assert format_program(before) == snapshot, "the pass changed its input"
    assert after != before, f"{pass_name} did nothing on {model!r}: the case no longer exercises it"
    assert edge_pass(after) == after, f"{pass_name} is not idempotent"
    golden(f"edge/{pass_name}/before.txt", snapshot)
    golden(f"edge/{pass_name}/after.txt", format_program(after))


def test_each_pass_does_what_its_exir_counterpart_does() -> None:
    views = replace_view_copies_with_views(program("reshapes_edge"))
    returned = {a.name for a in views.graph.nodes[-1].args if isinstance(a, Ref)}
    reshapes = [n for n in call_nodes(views.graph) if n.target in (VIEW_COPY, MEMORY_VIEW)]
    assert [(n.target, n.name in returned) for n in reshapes] == [(MEMORY_VIEW, False), (VIEW_COPY, True), (MEMORY_VIEW, False)]
    assert not any(t.startswith("aten::_assert") for t in _targets(remove_graph_asserts(program("casts", False))))
    casts = cast_mixed_operands(program("casts"))
    metas = {n.name: casts.graph.meta(n) for n in casts.graph.nodes}
    for node in call_nodes(casts.graph):
        if node.target in ("aten::add.Tensor", "aten::mul.Tensor"):
            dtypes = {getattr(metas[a.name], "dtype", None) for a in node.args if hasattr(a, "name")}
            assert dtypes == {getattr(metas[node.name], "dtype", None)}, node
    slices = [t for t in _targets(program("full_slice")) if t == "aten::slice.Tensor"]
    kept = [t for t in _targets(remove_noop_ops(program("full_slice"))) if t == "aten::slice.Tensor"]
    assert len(slices) == 2 and len(kept) == 1  # the whole-tensor slice goes, the partial one stays
    pruned = prune_empty_tensors(program("cat_empty"))
    cats = [n for n in call_nodes(pruned.graph) if n.target == "aten::cat.default"]
    assert [len(getattr(c.args[0], "items")) for c in cats] == [1]  # the empty operand left out
    (full,) = [n for n in call_nodes(pruned.graph) if n.target == "aten::full.default"]  # all-empty cat: zeros
    assert [getattr(d, "value") for d in getattr(full.args[0], "items")] == [2, 0]
    assert not {"aten::neg.default", "aten::mul.Tensor", "aten::slice.Tensor"} & set(_targets(pruned))
    x = torch.randn(2, 3)
    got = to_exported_program(pruned).module()(x)
    torch.testing.assert_close(got, CatEmpty()(x))
    views = _targets(replace_view_ops(program("views")))
    assert "aten::view_copy.default" in views and "aten::permute_copy.default" in views
    assert not {"aten::view.default", "aten::permute.default"} & set(views)
    formats = to_dim_order_ops(program("formats"))
    orders = [dict(n.kwargs).get("dim_order") for n in call_nodes(formats.graph) if n.target.startswith("dim_order_ops::")]
    assert len(orders) == 2 and all(isinstance(o, ListArg) for o in orders)
    values = [[getattr(i, "value") for i in o.items] for o in orders if isinstance(o, ListArg)]
    assert values == [[0, 2, 3, 1], [0, 1, 2, 3]]  # channels_last; preserve_format: the input's (contiguous) order
    written = insert_write_back(program("counter"))
    copies = [n for n in call_nodes(written.graph) if n.target == "aten::copy_.default"]
    assert len(copies) == 2 and written.graph.nodes[-2] is copies[-1]
    unused = remove_unused_state(program("counter"))
    assert [s.target for s in unused.state] == ["count", "total"]
    assert len(unused.signature.inputs) == len(program("counter").signature.inputs) - 1
    coerced = sym_operands_to_tensors(program("sym_operand"))
    (made,) = [n for n in call_nodes(coerced.graph) if n.target == "aten::scalar_tensor.default"]
    assert dict(made.kwargs)["dtype"] == DTypeArg(value=DType.int32)  # a SymInt becomes an int32 0-dim tensor
    (add,) = [n for n in call_nodes(coerced.graph) if n.target == "aten::add.Tensor"]
    assert Ref(name=made.name) in add.args
    gappy = program("full_slice_without_noops").graph.debug_handles()
    compact = compact_debug_handles(program("full_slice_without_noops")).graph.debug_handles()
    present = sorted({h for h in gappy if h is not None})
    assert present != list(range(1, len(present) + 1))  # the removed slice left a gap
    assert sorted({h for h in compact if h is not None}) == list(range(1, len(present) + 1))


def test_to_edge_program_composes_the_passes_in_order() -> None:
    for name in ARGS:
        p = program(name)
        expected = p
        for named in (*EMIT_TO_EDGE, *TO_EXECUTORCH):  # what emit runs on an ATen program
            expected = named.fn(expected)
        edge = to_edge_program(p, check=True)
        assert edge.dialect == EDGE_DIALECT
        assert edge.graph == expected.graph and edge.signature == expected.signature
        assert to_edge_program(edge) is edge  # an edge program is left alone


def test_bad_memory_format_names_the_node() -> None:
    p = program("formats")
    node = next(n for n in call_nodes(p.graph) if n.target == "aten::clone.default")
    bad_node = msgspec.structs.replace(
        node, kwargs=(("memory_format", MemoryFormatArg(value=MemoryFormat.channels_last_3d)),)
    )
    graph = msgspec.structs.replace(p.graph, nodes=tuple(bad_node if n is node else n for n in p.graph.nodes))
    with pytest.raises(EdgeError, match=f"node '{node.name}'.*channels_last_3d.*rank-4"):
        to_dim_order_ops(msgspec.structs.replace(p, graph=graph))


def test_call_nodes_are_callfunctions() -> None:
    assert all(isinstance(n, CallFunction) for n in call_nodes(program("views").graph))


def test_a_symint_in_a_tensor_position_runs_in_the_runtime() -> None:
    """Without SymToTensorPass the runtime aborts reading the SymInt as a Tensor (evalue.h assert)."""
    pytest.importorskip("executorch")
    from executorch.runtime import Runtime

    from texir.emit import emit
    from texir.serialize.pte import dumps

    method = load_method(dumps(emit(program("sym_operand"))))
    for rows in (4, 6):
        x = torch.randn(rows, 3)
        (got,) = method.execute([x])
        torch.testing.assert_close(got, x.sum(0) + rows)


def test_remove_graph_asserts_drops_what_only_the_asserts_read() -> None:
    """The range checks export puts on nonzero's data-dependent count read a sym_size and two
    comparisons that nothing else reads: exir's RemoveGraphAssertsPass eliminates them with the
    asserts (its .pte has the one nonzero instruction), and so does texir."""

    class NonZero(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nonzero(x)

    program = from_exported_program(torch.export.export(NonZero(), (torch.tensor([[0.0, 1.0], [2.0, 0.0]]),)))
    before = _targets(program)
    assert "aten::_assert_scalar.default" in before and "_operator::ge" in before  # what the case is about
    after = remove_graph_asserts(program)
    assert _targets(after) == ["aten::nonzero.default"]
    verify(after)
    assert [n.target for n in call_nodes(to_edge_program(program).graph)] == ["aten::nonzero.default"]
    x = torch.tensor([[0.0, 3.0], [1.0, 0.0]])
    (got,) = load_method(dumps(emit(program))).execute([x])
    assert torch.equal(got, torch.nonzero(x))


@pytest.mark.parametrize("dims", [[0], [-1]])
def test_a_sum_over_a_zero_dim_tensors_dim_runs_instead_of_aborting(dims: list[int]) -> None:
    """ExecuTorch 1.5.1's portable sum kernel aborts the process on a 0-dim input reduced over dim 0
    (found by the OpInfo differential: logsumexp of a scalar; ExecuTorch's own .pte aborts): texir
    writes it as the sum over all dims, the same value."""

    class Sum(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.logsumexp(x, dims, keepdim=True) + torch.sum(x, dims)

    x = torch.tensor(1.5)
    program = from_exported_program(torch.export.export(Sum(), (x,)), decompose=True)
    sums = [n for n in call_nodes(reduce_zero_dim_sums(program).graph) if n.target == "aten::sum.dim_IntList"]
    assert len(sums) == 2 and all(isinstance(n.args[1], NoneArg) for n in sums)
    (got,) = load_method(dumps(emit(program))).execute([x])  # in-process: an abort would end the test run
    torch.testing.assert_close(got, Sum()(x))
