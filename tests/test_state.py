"""State beyond buffers, against ExecuTorch 1.5.1: a mutated user input is written back and
returned where the signature lists it (the method's outputs, kernels and results equal ExecuTorch's)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from texir.adapters import from_exported_program
from texir.emit import emit
from texir.serialize.pte import dumps
from texir.executorch.runtime import load_method

pytest.importorskip("executorch", reason="the executorch test extra (pip install -e '.[test]')")


class _MutatesInput(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x * y


class _MutatesTwo(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b.mul_(2)
        a.sub_(b)
        return a.sum(0), b


def _plan(data: bytes) -> Any:
    from executorch.exir._serialize._program import deserialize_pte_binary

    return deserialize_pte_binary(data).program.execution_plan[0]


def _kernels(plan: Any) -> list[str]:
    return [plan.operators[i.instr_args.op_index].name for i in plan.chains[0].instructions
            if hasattr(i.instr_args, "op_index")]


@pytest.mark.parametrize(
    ("module", "args"),
    [
        (_MutatesInput, (torch.ones(2, 3), torch.full((2, 3), 2.0))),
        (_MutatesTwo, (torch.arange(6.0).reshape(2, 3), torch.ones(2, 3))),
    ],
    ids=["one", "two"],
)
def test_mutated_user_inputs_are_written_back_and_returned_like_executorch(module: type, args: tuple[Any, ...]) -> None:
    from executorch.exir import to_edge
    from executorch.runtime import Runtime

    def export() -> torch.export.ExportedProgram:
        return torch.export.export(module(), tuple(a.clone() for a in args))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = bytes(to_edge(export()).to_executorch().buffer)
    ours = dumps(emit(from_exported_program(export(), decompose=True)))
    mine, their = _plan(ours), _plan(theirs)
    assert len(mine.outputs) == len(their.outputs) and len(mine.inputs) == len(their.inputs)
    assert _kernels(mine) == _kernels(their) and _kernels(mine)[-1] == "aten::copy_"
    # the outputs that are inputs are the same inputs
    assert [mine.inputs.index(o) if o in mine.inputs else None for o in mine.outputs] == \
        [their.inputs.index(o) if o in their.inputs else None for o in their.outputs]
    runtime = Runtime.get()
    got = load_method(ours).execute([a.clone() for a in args])
    want = load_method(theirs).execute([a.clone() for a in args])
    eager_args = tuple(a.clone() for a in args)
    eager = module()(*eager_args)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    # ExecuTorch returns the new values of the mutated inputs first, then the user outputs
    user = list(eager) if isinstance(eager, tuple) else [eager]
    mutated = [a for a, before in zip(eager_args, args) if not torch.equal(a, before)]
    for g, e in zip(got, [*mutated, *user]):
        torch.testing.assert_close(g, e)


class _Stateful(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(3))
        self.register_buffer("other", torch.zeros(5))


class _Inc(_Stateful):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(x)
        self.other.add_(1)
        return self.count * 2


class _Get(_Stateful):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.count + x


def _two_methods() -> dict[str, torch.export.ExportedProgram]:
    return {"inc": torch.export.export(_Inc(), (torch.ones(3),)), "get": torch.export.export(_Get(), (torch.ones(3),))}


def _state_values(plan: Any) -> list[tuple[str, int, int, int]]:
    """(name, memory id, offset) of every named planned tensor, and the arena sizes."""
    out = []
    for v in plan.values:
        info = getattr(v.val, "extra_tensor_info", None)
        alloc = getattr(v.val, "allocation_info", None)
        if info is not None and alloc is not None:
            out.append((info.fully_qualified_name, alloc.memory_id, alloc.memory_offset_low, alloc.memory_offset_high))
    return out


def test_shared_mutable_buffers_are_one_state_for_all_methods_like_executorch() -> None:
    from executorch.exir import ExecutorchBackendConfig, to_edge
    from executorch.exir.passes import MemoryPlanningPass
    from executorch.runtime import Runtime

    from texir.emit import EmitOptions

    planning = MemoryPlanningPass(share_mutable_buffers=True, alloc_mutable_buffers=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = bytes(to_edge(_two_methods()).to_executorch(
            ExecutorchBackendConfig(memory_planning_pass=planning, emit_mutable_buffer_names=True)
        ).buffer)
    options = EmitOptions(share_mutable_buffers=True, emit_mutable_buffer_names=True)
    ours = dumps(emit({name: from_exported_program(ep, decompose=True) for name, ep in _two_methods().items()}, options))

    from executorch.exir._serialize._program import deserialize_pte_binary

    mine, their = (deserialize_pte_binary(f).program.execution_plan for f in (ours, theirs))
    assert [p.name for p in mine] == [p.name for p in their] == ["get", "inc"]
    for m, t in zip(mine, their):
        assert _state_values(m) == _state_values(t) == [("count", 2, 0, 0), ("other", 2, 16, 0)], m.name
        assert m.non_const_buffer_sizes[2] == t.non_const_buffer_sizes[2] == 48  # the shared arena
    program = Runtime.get().load_program(ours)
    inc, get = program.load_method("inc"), program.load_method("get")
    first = inc.execute([torch.ones(3)])[0] / 2  # the state's initial value is undefined, as in ExecuTorch
    assert torch.equal(get.execute([torch.zeros(3)])[0], first)  # get reads what inc wrote
    inc.execute([torch.ones(3)])
    assert torch.equal(get.execute([torch.zeros(3)])[0], first + 1)


def test_shared_buffers_cannot_also_take_initial_values() -> None:
    from texir.emit import EmitError, EmitOptions

    options = EmitOptions(share_mutable_buffers=True, init_mutable_buffers=True)
    with pytest.raises(EmitError, match=r"mutable buffer 'count' is shared between methods.*drop one of the two options"):
        emit({name: from_exported_program(ep, decompose=True) for name, ep in _two_methods().items()}, options)
