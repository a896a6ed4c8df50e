"""Decomposition without torch's retrace (`texir.adapters.local_decompose`): wherever it applies, the
program it gives, converted to texir's IR, must equal what torch's `run_decompositions` gives
(names, targets, arguments, values, provenance, debug handles, signature, state); where it does not
apply it must say why and leave the program to the retrace; and it must not touch its input."""

from __future__ import annotations

import pytest
import torch

from tests.real_models import REAL_MODELS, ensure_torchvision_ops, real_export
from tests.zoo import ZOO, cached_export
from texir.adapters import from_exported_program
from texir.adapters.decompositions import edge_decomposition_table
from texir.adapters.local_decompose import decompose_locally
from texir.ir import Program

XNNPACK_KEEP = ("aten::linear.default",)
"""What ExecuTorch 1.5.1's XnnpackPartitioner asks to keep on these models."""

APPLIES = frozenset({
    "mlp", "deep_mlp", "conv_bn", "convnet", "conv_relu_tan", "attention", "transformer_block", "direct_params",
    "buffers", "lifted_constant", "tuple_inputs", "dict_io", "nested_io", "multi_output", "max_dim",
    "split_chunk", "topk", "scalars", "int_lists", "cat_stack", "index_gather", "embedding", "resnet_tiny",
    "residual_mlp", "dtypes", "pad_slice", "matmul_variants", "norms",
    "resnet18", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0", "squeezenet1_1", "shufflenet_v2_x0_5",
    "mnasnet0_5",
})
"""Models the direct rewrite covers today (the benchmarks' mobilenet_v2 and MLP among them). The
others need the retrace: mutated buffers, dynamic shapes, cond, and decompositions whose result
functionalization rewrites (factories' `alias`, tensor constants, in-place `as_strided_`)."""

ZOO_NAMES = tuple(m.name for m in ZOO)
REAL_NAMES = tuple(m.name for m in REAL_MODELS)


def _export(name: str) -> torch.export.ExportedProgram:
    if name in ZOO_NAMES:
        return cached_export(name, decompose=False)
    ensure_torchvision_ops()
    return real_export(name)[0]


def _converted(ep: torch.export.ExportedProgram) -> Program:
    return from_exported_program(ep, decompose=False)


def _fingerprint(ep: torch.export.ExportedProgram) -> tuple[object, ...]:
    return (
        tuple((n.name, n.op, str(n.target), str(n.args), str(n.kwargs), tuple(sorted(n.meta))) for n in ep.graph.nodes),
        str(ep.graph_signature),
    )


@pytest.mark.parametrize("name", ZOO_NAMES + REAL_NAMES)
def test_local_decomposition_equals_torchs_retrace(name: str) -> None:
    ep = _export(name)
    before = _fingerprint(ep)
    keeps: tuple[tuple[str, ...], ...] = ((), XNNPACK_KEEP) if name in ZOO_NAMES else (XNNPACK_KEEP,)
    for keep in keeps:
        why: list[str] = []
        local = decompose_locally(ep, keep, why=why)
        assert _fingerprint(ep) == before, f"{name}: decompose_locally changed its input"
        if local is None:
            assert name not in APPLIES, f"{name} (keep {keep}) needed the retrace: {why}"
            assert len(why) == 1 and why[0], "a fallback says why"
            continue
        assert name in APPLIES, f"{name} now decomposes locally: add it to APPLIES"
        assert why == []
        if keep == () and name in ZOO_NAMES:
            retraced = cached_export(name, decompose=True)  # shared with the other tests
        else:
            retraced = ep.run_decompositions(edge_decomposition_table(keep))
        expected, got = _converted(retraced), _converted(local)
        assert got == expected, f"{name} (keep {keep}): the direct rewrite differs from torch's retrace"


def test_from_exported_program_decomposes_locally_and_equally() -> None:
    """The entry point lowering uses takes the direct rewrite (and gives torch's program)."""
    ep = _export("resnet_tiny")
    assert decompose_locally(ep, XNNPACK_KEEP) is not None
    expected = _converted(ep.run_decompositions(edge_decomposition_table(XNNPACK_KEEP)))
    assert from_exported_program(ep, decompose=True, keep=XNNPACK_KEEP) == expected


class _ReadAfterInPlace(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        z = y.relu_()  # (the traced program reads the relu_ result for y from here on)
        return y + z + 1


class _ReluOfAddInPlace(torch.nn.Module):
    def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y += r
        return y.relu_()


class _InPlaceOnView(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y[0].relu_()  # writes into y through a view: only functionalization gets this right
        return y + 1


class _MutatesInput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x * 2


@pytest.mark.parametrize(("module", "reason"), [
    (_InPlaceOnView(), "node 'relu_': aten.relu_.default mutates a value something else can see"),
    (_MutatesInput(), "node 'add_': aten.add_.Tensor mutates a value something else can see"),
])
def test_fallback_says_why_and_the_retrace_answers(module: torch.nn.Module, reason: str) -> None:
    x = torch.randn(2, 3)
    ep = torch.export.export(module, (x,), strict=False)
    why: list[str] = []
    assert decompose_locally(ep, why=why) is None
    assert why == [reason]
    program = from_exported_program(ep, decompose=True)  # the retrace, as before
    assert program == _converted(ep.run_decompositions(edge_decomposition_table()))


@pytest.mark.parametrize("module", [_ReadAfterInPlace(), _ReluOfAddInPlace()])
def test_in_place_ops_nothing_else_sees_become_functional(module: torch.nn.Module) -> None:
    args = (torch.randn(2, 3), torch.randn(2, 3))[: 2 if isinstance(module, _ReluOfAddInPlace) else 1]
    ep = torch.export.export(module, args, strict=False)
    local = decompose_locally(ep)
    assert local is not None
    targets = [str(n.target) for n in local.graph.nodes if n.op == "call_function"]
    assert "aten.relu.default" in targets and not any(t.endswith("_.default") or t.endswith("_.Tensor") for t in targets)
    assert _converted(local) == _converted(ep.run_decompositions(edge_decomposition_table()))
    fresh = [a.clone() for a in args]
    torch.testing.assert_close(local.module()(*args), module(*fresh))


def test_a_program_with_buffer_mutations_is_left_to_the_retrace() -> None:
    ep = cached_export("running_stats", decompose=True)  # functionalized: its writes are outputs
    why: list[str] = []
    assert decompose_locally(ep, why=why) is None
    assert why == ["the program mutates an input or buffer"]
