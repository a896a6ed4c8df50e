"""torch.scan emitted as ExecuTorch emits it (a loop: sym_size, copy_ of the inits into the carries,
select_copy of every xs, the body, copy_ of the new carries, et_copy_index of every stacked result and
a JumpFalse back): the same kernels in the same order and the same operator table as ExecuTorch
1.5.1's `.pte`, results equal to eager and to ExecuTorch's program call after call; delegation inside
and around a scan; malformed scans refused with a typed error naming the node."""

from __future__ import annotations

import copy
import functools
import warnings
from typing import Any

import msgspec
import pytest
import torch
from torch._higher_order_ops.scan import scan
from torch.export import Dim
from torch.utils import _pytree as pytree

from tests.lowering_helpers import TEST_BACKEND, assert_same_outputs, export_program
from texir.adapters import from_exported_program
from texir.emit import EmitError, EmitOptions, emit
from texir.ir import CallFunction, ListArg, Program, Ref, verify
from texir.lowering import to_backend
from texir.lowering.partitioners import OpSupportPartitioner, WholeProgramPartitioner
from texir.serialize.pte import dumps
from texir.executorch.runtime import load_method

pytest.importorskip("executorch", reason="the executorch test extra (pip install -e '.[test]')")

Carry = tuple[torch.Tensor, torch.Tensor]


class CumSum(torch.nn.Module):
    def forward(self, xs: torch.Tensor) -> Carry:
        def step(total: torch.Tensor, x: torch.Tensor) -> Carry:
            total = total + x
            return total, total.clone()

        return scan(step, torch.zeros_like(xs[0]), xs)


class RnnCell(torch.nn.Module):
    """A tanh RNN cell over a (steps, batch, features) sequence; the state is (batch, hidden)."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.RNNCell(3, 4)

    def forward(self, xs: torch.Tensor, h0: torch.Tensor) -> Carry:
        def step(h: torch.Tensor, x: torch.Tensor) -> Carry:
            h = self.cell(x, h)
            return h, h.clone()

        return scan(step, h0, xs)


class TwoCarries(torch.nn.Module):
    """Two carries over two sequences; the body closes over two inputs and a parameter, which
    export passes to the scan as its additional inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 3))

    def forward(self, xs: torch.Tensor, ys: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> Any:
        def step(carry: Carry, inputs: Carry) -> tuple[Carry, Carry]:
            (a, b), (x, y) = carry, inputs
            a = a * scale + x * self.w
            b = b + y.sum() + bias
            return (a, b), (a + b.sum(), y * 2)

        return scan(step, (torch.zeros(3), torch.ones(2)), (xs, ys))


class CondInBody(torch.nn.Module):
    def forward(self, xs: torch.Tensor) -> Carry:
        def step(c: torch.Tensor, x: torch.Tensor) -> Carry:
            c = torch.cond(x.sum() > 0, lambda a, b: a + b, lambda a, b: a - b, (c, x))
            return c, c.clone()

        return scan(step, torch.zeros_like(xs[0]), xs)


class ScanInBody(torch.nn.Module):
    def forward(self, xs: torch.Tensor) -> Carry:
        def inner(c: torch.Tensor, x: torch.Tensor) -> Carry:
            c = c + x
            return c, c.clone()

        def step(c: torch.Tensor, x: torch.Tensor) -> Carry:
            last, rows = scan(inner, torch.zeros_like(x[0]), x)
            return c + last, rows

        return scan(step, torch.zeros_like(xs[0, 0]), xs)


class VectorRnn(torch.nn.Module):
    """A (hidden,) state through Linear layers: the body reads the carry through a reshape."""

    def __init__(self) -> None:
        super().__init__()
        self.wx = torch.nn.Linear(3, 4)
        self.wh = torch.nn.Linear(4, 4)

    def forward(self, xs: torch.Tensor, h0: torch.Tensor) -> Carry:
        def step(h: torch.Tensor, x: torch.Tensor) -> Carry:
            h = torch.tanh(self.wx(x) + self.wh(h))
            return h, h.clone()

        return scan(step, h0, xs)


CASES: dict[str, tuple[type[torch.nn.Module], tuple[torch.Tensor, ...]]] = {
    "cumsum": (CumSum, (torch.linspace(-2.0, 2.0, 15).reshape(5, 3),)),
    "rnn_cell": (RnnCell, (torch.linspace(-1.0, 1.0, 30).reshape(5, 2, 3), torch.zeros(2, 4))),
    "two_carries": (TwoCarries, (torch.linspace(-1.0, 1.0, 12).reshape(4, 3), torch.linspace(0.0, 1.0, 8).reshape(4, 2),
                                 torch.tensor(0.5), torch.tensor([0.1, 0.2]))),
    "cond_in_body": (CondInBody, (torch.linspace(-1.0, 1.0, 12).reshape(4, 3),)),
    "scan_in_body": (ScanInBody, (torch.linspace(-1.0, 1.0, 24).reshape(4, 2, 3),)),
}


def _module(cls: type[torch.nn.Module]) -> torch.nn.Module:
    torch.manual_seed(0)
    return cls().eval()


def _export(module: torch.nn.Module, args: tuple[torch.Tensor, ...], dynamic_shapes: Any = None) -> tuple[bytes, bytes]:
    """texir's `.pte` and ExecuTorch's for one export (ExecuTorch's pipeline gets its own copy: it
    mutates the program it is given)."""
    from executorch.exir import to_edge

    ep = torch.export.export(module, args, dynamic_shapes=dynamic_shapes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = bytes(to_edge(copy.deepcopy(ep)).to_executorch().buffer)
    ours = dumps(emit(from_exported_program(ep, decompose=True), EmitOptions(check_plan=True)))
    return ours, theirs


def _plan(data: bytes) -> Any:
    from executorch.exir._serialize._program import deserialize_pte_binary

    return deserialize_pte_binary(data).program.execution_plan[0]


def _steps(data: bytes) -> list[str]:
    plan = _plan(data)
    steps = []
    for instruction in plan.chains[0].instructions:
        a = instruction.instr_args
        if hasattr(a, "op_index"):
            op = plan.operators[a.op_index]
            steps.append(f"{op.name}.{op.overload}")
        else:
            steps.append(f"{type(a).__name__}->{getattr(a, 'destination_instruction', '')}")
    return steps


def _operators(data: bytes) -> list[tuple[str, str]]:
    return [(op.name, op.overload) for op in _plan(data).operators]


def _run(data: bytes, args: tuple[torch.Tensor, ...], calls: int = 3) -> list[list[torch.Tensor]]:
    from executorch.runtime import Runtime

    method = load_method(data)
    return [list(method.execute(list(args))) for _ in range(calls)]  # the loop counter resets each call


def _eager(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [t for t in pytree.tree_leaves(module(*args)) if isinstance(t, torch.Tensor)]


@functools.cache
def _both(case: str) -> tuple[bytes, bytes]:
    cls, args = CASES[case]
    return _export(_module(cls), args)


@pytest.mark.parametrize("case", sorted(CASES))
def test_scan_is_the_same_loop_as_executorchs_and_runs_like_eager(case: str) -> None:
    cls, args = CASES[case]
    ours, theirs = _both(case)
    steps = _steps(ours)
    assert steps == _steps(theirs)
    assert _operators(ours) == _operators(theirs)
    assert {"aten::sym_size.int", "aten::copy_.", "executorch_prim::et_copy_index.tensor"} <= set(steps)
    assert any(s.startswith("JumpFalseCall") for s in steps)
    expected = _eager(_module(cls), args)
    for got, their in zip(_run(ours, args), _run(theirs, args)):
        assert len(got) == len(expected) == len(their)
        for g, e, t in zip(got, expected, their):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(g, t, rtol=0, atol=0)


def test_a_two_carry_scan_copies_each_carry_and_stacks_each_result() -> None:
    steps = _steps(_both("two_carries")[0])
    jump = next(i for i, s in enumerate(steps) if s.startswith("JumpFalseCall"))
    loop = steps[int(steps[jump].split("->")[1]):jump]
    assert loop[:2] == ["aten::select_copy.int_out"] * 2  # one slice per sequence
    assert loop.count("aten::copy_.") == 2 and loop.count("executorch_prim::et_copy_index.tensor") == 2
    assert steps[:jump].count("aten::copy_.") == 4  # the two inits before the loop, the two carries in it


def test_a_scan_over_a_dynamic_length_runs_every_length_like_eager_and_executorch() -> None:
    shapes = ({0: Dim("steps", min=2, max=8)},)
    args = CASES["cumsum"][1]
    ours, theirs = _export(CumSum(), args, shapes)
    assert _steps(ours) == _steps(theirs)
    for rows in (2, 7, 4):
        xs = (torch.linspace(-1.0, 1.0, rows * 3).reshape(rows, 3),)
        expected = _eager(CumSum(), xs)
        for got, their in zip(_run(ours, xs, calls=2), _run(theirs, xs, calls=2)):
            assert got[1].shape == (rows, 3)
            for g, e, t in zip(got, expected, their):
                torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(g, t, rtol=0, atol=0)


def test_a_carry_read_through_a_reshape_runs_like_eager_where_executorchs_program_does_not() -> None:
    # Linear on a (hidden,) state reshapes the carry. ExecuTorch 1.5.1 plans that reshape in the
    # body's own memory, not over the carry the loop updates, so its `.pte` reads a stale state
    # from the second step on. texir's reshape aliases the carry itself; the kernels are the same.
    args = (torch.linspace(-1.0, 1.0, 15).reshape(5, 3), torch.zeros(4))
    ours, theirs = _export(_module(VectorRnn), args)
    assert _steps(ours) == _steps(theirs)
    expected = _eager(_module(VectorRnn), args)
    for got in _run(ours, args, calls=2):
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
    their_ys = _run(theirs, args, calls=1)[0][1]
    torch.testing.assert_close(their_ys[0], expected[1][0], rtol=1e-5, atol=1e-6)  # the first step only
    assert not torch.allclose(their_ys, expected[1], atol=1e-3)


@functools.cache
def _cumsum_program() -> Program:
    cls, args = CASES["cumsum"]
    return from_exported_program(torch.export.export(cls(), args), decompose=True)


class _RaggedRows(torch.nn.Module):
    def forward(self, xs: torch.Tensor) -> Carry:
        def step(c: torch.Tensor, x: torch.Tensor) -> Carry:
            c = c + x.sum(0)
            return c, (x * c.sum()).clone()

        return scan(step, torch.zeros(3), xs)


def test_a_stacked_result_with_another_dynamic_dim_is_refused_as_executorchs_runtime_fails_it() -> None:
    from executorch.exir import to_edge

    args = (torch.linspace(-1.0, 1.0, 60).reshape(4, 5, 3),)
    shapes = ({0: Dim("steps", min=2, max=6), 1: Dim("rows", min=2, max=7)},)
    ep = torch.export.export(_RaggedRows(), args, dynamic_shapes=shapes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = bytes(to_edge(copy.deepcopy(ep)).to_executorch().buffer)
    _run(theirs, (torch.ones(2, 7, 3),), calls=1)  # rows at their bound: it runs
    with pytest.raises(RuntimeError):  # below it, et_copy_index's shape check fails the call
        _run(theirs, (torch.ones(2, 5, 3),), calls=1)
    with pytest.raises(EmitError, match=r"node 'scan'.*stacked result 0 has dynamic dims \['s\w+'\] besides the loop's.*static"):
        emit(from_exported_program(ep, decompose=True))


def _with_scan_args(program: Program, edit: Any) -> Program:
    graph = program.graph
    nodes = tuple(
        msgspec.structs.replace(n, args=edit(n.args)) if isinstance(n, CallFunction) and n.target == "higher_order::scan"
        else n
        for n in graph.nodes
    )
    return msgspec.structs.replace(program, graph=msgspec.structs.replace(graph, nodes=nodes))


@pytest.mark.parametrize(("edit", "message"), [
    (lambda a: a[:3], r"node 'scan'.*scan needs \(combine_graph, \[init\], \[xs\], \[additional_inputs\]\)"),
    (lambda a: (a[0], a[1], ListArg(items=()), a[3]), r"node 'scan'.*torch.scan over no tensors.*at least one"),
    (lambda a: (a[0], ListArg(items=a[1].items * 2), a[2], a[3]),
     r"node 'scan'.*the scan body's inputs after the 2 carries are not 1 tensor slices of xs"),
    (lambda a: (a[0], ListArg(items=a[1].items * 3), a[2], a[3]), r"node 'scan'.*scan has 2 results for 3 carries"),
    (lambda a: (a[0], a[1], a[2], ListArg(items=(Ref(name="xs"),))), r"node 'scan'.*body takes 2 inputs, the call passes 3"),
])
def test_malformed_scans_are_refused_naming_the_node(edit: Any, message: str) -> None:
    with pytest.raises(EmitError, match=message):
        emit(_with_scan_args(_cumsum_program(), edit))


class _ScanWithOps(torch.nn.Module):
    def forward(self, xs: torch.Tensor, y: torch.Tensor) -> Carry:
        def step(c: torch.Tensor, x: torch.Tensor) -> Carry:
            c = torch.sin(c + x) * y
            return c, c.clone()

        last, rows = scan(step, torch.zeros_like(xs[0]), xs)
        return last + 1.0, rows


_DELEGATE_ARGS = (torch.linspace(-1.0, 1.0, 12).reshape(4, 3), torch.tensor([0.5, -1.0, 2.0]))


@functools.cache
def _delegate_program() -> Program:
    return export_program(_ScanWithOps(), _DELEGATE_ARGS)


def test_a_scan_inside_a_delegated_region_is_left_to_the_backend() -> None:
    lowered = to_backend(_delegate_program(), WholeProgramPartitioner(TEST_BACKEND))
    verify(lowered)
    assert lowered.graph.subgraphs == ()
    (module,) = lowered.lowered_modules
    inner = module.module.original_program.graph
    assert [n.target for n in inner.nodes if isinstance(n, CallFunction) and n.target.startswith("higher_order::")] \
        == ["higher_order::scan"]
    assert_same_outputs(_ScanWithOps(), lowered, _DELEGATE_ARGS)
    steps = _steps(dumps(emit(lowered)))
    assert [s for s in steps if s.startswith(("DelegateCall", "JumpFalseCall"))] == ["DelegateCall->"]
    assert "executorch_prim::et_copy_index.tensor" not in steps


def test_delegates_in_a_scan_body_run_inside_the_loop() -> None:
    lowered = to_backend(_delegate_program(), OpSupportPartitioner(TEST_BACKEND, {"aten::add.Tensor", "aten::mul.Tensor"}))
    verify(lowered)
    assert len(lowered.lowered_modules) == 3  # the body's add and mul, the add after the scan
    assert_same_outputs(_ScanWithOps(), lowered, _DELEGATE_ARGS)
    steps = _steps(dumps(emit(lowered)))
    jump = next(i for i, s in enumerate(steps) if s.startswith("JumpFalseCall"))
    loop = steps[int(steps[jump].split("->")[1]):jump]
    assert loop.count("DelegateCall->") == 2 and "aten::sin.out" in loop
    assert steps[jump + 1:].count("DelegateCall->") == 1


class _RnnWithLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(3, 3)
        self.cell = torch.nn.RNNCell(3, 4)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, xs: torch.Tensor, h0: torch.Tensor) -> Carry:
        def step(h: torch.Tensor, x: torch.Tensor) -> Carry:
            h = self.cell(x, h)
            return h, h.clone()

        h, rows = scan(step, h0, self.inp(xs))
        return self.head(h), rows


def test_xnnpack_around_a_scan_matches_executorch() -> None:
    from tests.xnnpack_oracle import executorch_xnnpack, pte_view, run_pte, texir_xnnpack

    module = _module(_RnnWithLayers)
    args = (torch.linspace(-1.0, 1.0, 30).reshape(5, 2, 3), torch.zeros(2, 4))
    ep = torch.export.export(module, args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = executorch_xnnpack(copy.deepcopy(ep))
    ours = texir_xnnpack(ep)
    assert theirs.pte is not None and ours.pte is not None, (theirs.error, ours.error)
    assert ours.partitions == theirs.partitions and len(ours.partitions) == 2  # the two Linears; the body stays
    assert pte_view(ours.pte) == pte_view(theirs.pte)
    assert _steps(ours.pte) == _steps(theirs.pte)
    expected = _eager(module, args)
    for got, their in zip(run_pte(ours.pte, args, 2), run_pte(theirs.pte, args, 2)):
        for g, e, t in zip(got, expected, their):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(g, t, rtol=0, atol=0)
