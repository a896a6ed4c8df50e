"""Shared helpers of the lowering tests: the scenario checks (the test backends: tests/lowering_backends.py)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from texir.adapters import from_exported_program, to_exported_program
from texir.ir import Program, format_program, verify
from texir.lowering import to_backend
from texir.lowering.plan import PartitionPlan
from texir.serialize import snapshot
from texir.testing.golden import Golden
from tests.lowering_backends import TEST_BACKEND  # noqa: F401  (re-exported; importing registers the test backends)


def export_program(module: torch.nn.Module, args: tuple[Any, ...], **kwargs: Any) -> Program:
    ep = torch.export.export(module, args, **kwargs)
    return from_exported_program(ep, decompose=True)


def _flat(value: Any) -> list[torch.Tensor]:
    leaves, _ = torch.utils._pytree.tree_flatten(value)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def assert_same_outputs(module: torch.nn.Module, program: Program, args: tuple[Any, ...], calls: int = 2) -> None:
    """The lowered program, run through the adapter, matches eager over `calls` calls (state included)."""
    eager = copy.deepcopy(module)
    runnable = to_exported_program(program).module()
    for _ in range(calls):
        expected = _flat(eager(*copy.deepcopy(args)))
        actual = _flat(runnable(*copy.deepcopy(args)))
        assert len(expected) == len(actual)
        for e, a in zip(expected, actual):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


def lower_scenario(
    golden: Golden,
    name: str,
    module: torch.nn.Module,
    args: tuple[Any, ...],
    partitioner: Callable[[Program], PartitionPlan],
    *,
    program: Program | None = None,
    run: bool = True,
) -> Program:
    """Lower, then check: golden before/after text, verify, input snapshot bytes unchanged, eager outputs."""
    if program is None:
        program = export_program(module, args)
    before = snapshot.dumps(program, format="msgpack", include_data=True)
    lowered = to_backend(program, partitioner)
    verify(lowered)
    assert snapshot.dumps(program, format="msgpack", include_data=True) == before
    golden(
        f"lowering/{name}.txt",
        "# before\n" + format_program(program) + "# after\n" + format_program(lowered),
    )
    if run:
        assert_same_outputs(module, lowered, args)
    return lowered
