"""torch.map emitted as ExecuTorch emits it (a loop of select_copy, the body, et_copy_index and a
JumpFalse back): the same kernels in the same order as ExecuTorch 1.5.1's `.pte`, results equal to
eager and to ExecuTorch's program call after call, and the cases the runtime's loop cannot express
refused with a typed error naming the node."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch._higher_order_ops.map import map as torch_map

from texir.adapters import from_exported_program
from texir.emit import EmitError, EmitOptions, emit
from texir.serialize.pte import dumps
from texir.executorch.runtime import load_method

pytest.importorskip("executorch", reason="the executorch test extra (pip install -e '.[test]')")


class _MapWithClosure(torch.nn.Module):
    """The body uses an extra operand and a parameter, and the result feeds more ops."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 3))

    def forward(self, xs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        def body(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return (x * y + self.w).sin()

        out: torch.Tensor = torch_map(body, xs, y)  # type: ignore[arg-type]  # torch's map stub is too narrow
        return out + 1


class _MapMatmul(torch.nn.Module):
    def forward(self, xs: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        def body(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
            return (x @ m).relu()

        out: torch.Tensor = torch_map(body, xs, m)  # type: ignore[arg-type]  # torch's map stub is too narrow
        return out.sum(0)


class _MapTwoResults(torch.nn.Module):
    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        def body(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x + 1, x * 2

        a, b = torch_map(body, xs)  # type: ignore[arg-type]  # torch's map stub is too narrow
        return a + b


CASES: dict[str, tuple[type[torch.nn.Module], tuple[torch.Tensor, ...]]] = {
    "closure": (_MapWithClosure, (torch.linspace(-2.0, 2.0, 12).reshape(4, 3), torch.tensor([0.5, -1.0, 2.0]))),
    "matmul": (_MapMatmul, (torch.linspace(-1.0, 1.0, 30).reshape(5, 2, 3), torch.linspace(0.0, 1.0, 12).reshape(3, 4))),
}


def _program(data: bytes) -> Any:
    from executorch.exir._serialize._program import deserialize_pte_binary

    plan = deserialize_pte_binary(data).program.execution_plan[0]
    steps = []
    for instruction in plan.chains[0].instructions:
        a = instruction.instr_args
        if hasattr(a, "op_index"):
            op = plan.operators[a.op_index]
            steps.append(f"{op.name}.{op.overload}")
        else:
            steps.append(f"{type(a).__name__}->{getattr(a, 'destination_instruction', '')}")
    return steps


@pytest.mark.parametrize("case", sorted(CASES))
def test_map_is_the_same_loop_as_executorchs_and_runs_like_eager(case: str) -> None:
    from executorch.exir import to_edge
    from executorch.runtime import Runtime

    cls, args = CASES[case]
    torch.manual_seed(0)
    module = cls().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = bytes(to_edge(torch.export.export(module, args)).to_executorch().buffer)
    ours = dumps(emit(from_exported_program(torch.export.export(module, args), decompose=True),
                      EmitOptions(check_plan=True)))
    steps = _program(ours)
    assert steps == _program(theirs)
    assert "executorch_prim::et_copy_index.tensor" in steps and any(s.startswith("JumpFalseCall") for s in steps)
    runtime = Runtime.get()
    mine = load_method(ours)
    reference = load_method(theirs)
    with torch.no_grad():
        expected = module(*args)
    for _ in range(3):  # the loop counter is reset at the end of every call
        (got,) = mine.execute(list(args))
        (their,) = reference.execute(list(args))
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got, their, rtol=0, atol=0)


def test_a_map_with_two_results_is_refused_naming_the_node() -> None:
    from executorch.exir import to_edge

    args = (torch.ones(3, 2),)
    with pytest.raises(Exception, match="This node map_impl"):  # ExecuTorch refuses it too (an internal error)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            to_edge(torch.export.export(_MapTwoResults(), args)).to_executorch()
    program = from_exported_program(torch.export.export(_MapTwoResults(), args), decompose=True)
    with pytest.raises(EmitError, match=r"node 'map_impl'.*torch.map with 2 results.*concatenate the results"):
        emit(program)


def test_a_map_result_with_another_dynamic_dim_is_refused_naming_the_node() -> None:
    # et_copy_index keeps the other dims at their bound: ExecuTorch's `.pte` fails below it
    class Double(torch.nn.Module):
        def forward(self, xs: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = torch_map(lambda x: x * 2, xs)  # type: ignore[arg-type]  # torch's map stub is too narrow
            return out

    shapes = ({0: torch.export.Dim("steps", min=2, max=6), 1: torch.export.Dim("rows", min=2, max=7)},)
    ep = torch.export.export(Double(), (torch.ones(4, 5, 3),), dynamic_shapes=shapes)
    with pytest.raises(EmitError, match=r"node 'map_impl'.*the map's result has dynamic dims .* besides the loop's"):
        emit(from_exported_program(ep, decompose=True))
