"""Shared helpers of the lowering tests: a tiny test backend and the scenario checks."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch

from texir.adapters import from_exported_program, to_exported_program
from texir.ir import CallFunction, CompileSpec, DebugHandleEntry, Program, format_program, verify
from texir.lowering import PreprocessResult, register_backend, to_backend
from texir.lowering.plan import PartitionPlan
from texir.serialize import snapshot
from texir.testing.golden import Golden

TEST_BACKEND = "texir-test"


class _TestBackend:
    """Processed bytes list the delegated ops and compile specs; one debug entry per call node."""

    def preprocess(self, program: Program, compile_specs: Sequence[CompileSpec]) -> PreprocessResult:
        graph = program.graph
        calls = [(n, graph.prov(i)) for i, n in enumerate(graph.nodes) if isinstance(n, CallFunction)]
        text = ",".join(n.target for n, _ in calls) + "|" + ",".join(f"{s.key}={s.value.hex()}" for s in compile_specs)
        entries = tuple(
            DebugHandleEntry(identifier=n.name, debug_handles=(prov.debug_handle,))
            for n, prov in calls
            if prov is not None and prov.debug_handle is not None
        )
        return PreprocessResult(processed_bytes=text.encode(), debug_handle_map=entries)


class FailingBackend:
    def preprocess(self, program: Program, compile_specs: Sequence[CompileSpec]) -> PreprocessResult:
        raise RuntimeError("this backend always fails")


register_backend(TEST_BACKEND, _TestBackend(), replace=True)
register_backend("texir-failing", FailingBackend(), replace=True)


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
