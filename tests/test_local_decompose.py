"""Decomposition without torch's retrace (`texir.adapters.local_decompose`): wherever it applies, the
program it gives, converted to texir's IR, must equal what torch's `run_decompositions` gives
(names, targets, arguments, values, provenance, debug handles, signature, state); where it does not
apply it must say why and leave the program to the retrace; and it must not touch its input."""

from __future__ import annotations

import pytest
import torch

from tests.real_models import QUANTIZED, REAL_MODELS, zoo_or_real_export
from tests.zoo import DYNAMIC_SHAPES, NESTED_GRAPHS, ZOO, cached_export
from texir.adapters import from_exported_program
from texir.adapters.decompositions import edge_decomposition_table
from texir.adapters.local_decompose import decompose_locally
from texir.ir import Program
from texir.ir.canonical import canonicalize

XNNPACK_KEEP = ("aten::linear.default",)
"""What ExecuTorch 1.5.1's XnnpackPartitioner asks to keep on these models."""

NEEDS_RETRACE = {
    # buffer updates: made functional in a step of their own (functional_only, tested below)
    "running_stats": "aten.mul_.Tensor writes buffer 'running_mean' (made functional in a step of its own)",
    "accumulate": "aten.add_.Tensor writes buffer 'acc' (made functional in a step of its own)",
    **{name: "dynamic shapes" for name in DYNAMIC_SHAPES},
    **{name: "nested graphs" for name in NESTED_GRAPHS},
    "convnext_tiny_config": "aten.permute.default views a value an in-place op wrote",  # layer scale's add_
    "llama": "nested graphs",  # transformers runs its rotary embedding in a no-grad region (a nested graph)
    "phi3": "nested graphs",
    "q_mlp_8da4w": "tensor-subclass weights",
}
"""The models that still need torch's retrace, and the reason given; every other model of the zoo
(the benchmarks' mobilenet_v2, MLP and GPT-2 among them) decomposes directly."""

ZOO_NAMES = tuple(m.name for m in ZOO)
REAL_NAMES = tuple(m.name for m in (*REAL_MODELS, *QUANTIZED))


_export = zoo_or_real_export


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
            assert name in NEEDS_RETRACE, f"{name} (keep {keep}) needed the retrace: {why}"
            assert len(why) == 1 and NEEDS_RETRACE[name] in why[0], why
            continue
        assert name not in NEEDS_RETRACE, f"{name} now decomposes directly: take it out of NEEDS_RETRACE"
        assert why == []
        if keep == () and name in ZOO_NAMES:
            retraced = cached_export(name, decompose=True)  # shared with the other tests
        else:
            retraced = ep.run_decompositions(edge_decomposition_table(keep))
        expected, got = _converted(retraced), _converted(local)
        assert got == expected, f"{name} (keep {keep}): the direct rewrite differs from torch's retrace"


@pytest.mark.parametrize(
    "name", ["transformer_block", "resnet_tiny", "whisper_encoder", "attention_block", "dtypes", "bert", "running_stats",
             "accumulate"],
)
def test_local_functionalization_equals_torchs_empty_table_retrace(name: str) -> None:
    """ExecuTorch's to_edge_transform_and_lower first runs `run_decompositions({})`; texir's `lower`
    does the same without the retrace: functional composites kept (linear, sdpa), `contiguous` and
    `reshape` through their kernels (a copy where the value is not contiguous yet), export's
    keyword `_assert_tensor_metadata` calls in the dispatcher's form (dtypes), BERT's in-place
    `detach_` of its mask constant leaving no node (its `detach` became an `alias_copy` kernel),
    in-place buffer updates made functional (a buffer overwritten whole by `copy_` taking the copied
    value, as torch's `_remove_unnecessary_copy_op_pass` leaves it)."""
    ep = _export(name)
    before = _fingerprint(ep)
    local = decompose_locally(ep, functional_only=True)
    assert local is not None and _fingerprint(ep) == before
    assert _converted(local) == _converted(ep.run_decompositions({}))
    targets = {str(n.target) for n in local.graph.nodes}
    assert "aten.contiguous.default" not in targets and "aten.reshape.default" not in targets
    if name in ("whisper_encoder", "attention_block"):
        assert "aten.scaled_dot_product_attention.default" in targets


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


def test_a_functional_program_updating_buffers_decomposes_locally_and_equally() -> None:
    """A program already functional (its buffer writes are outputs, as `run_decompositions({})`
    leaves a static-KV-cache Llama) needs no retrace: the update outputs follow their nodes."""
    ep = cached_export("running_stats", decompose=True)  # functionalized: its writes are outputs
    assert any(s.kind.name == "BUFFER_MUTATION" for s in ep.graph_signature.output_specs)
    why: list[str] = []
    local = decompose_locally(ep, why=why)
    assert local is not None and why == []
    assert _converted(local) == _converted(ep.run_decompositions(edge_decomposition_table(())))


@pytest.mark.parametrize("name", ["dynamic_mlp", "dynamic_conv"])
def test_dynamic_shapes_decompose_locally_when_names_may_differ(name: str) -> None:
    """With symbolic sizes the program is the retrace's but for names (the retrace numbers the
    symbolic-size arithmetic it then drops: its `mul_2` is `mul` here); asked for the retrace's
    names, it steps aside."""
    ep = cached_export(name, decompose=False)
    local = decompose_locally(ep, exact_names=False)
    assert local is not None
    expected = _converted(ep.run_decompositions(edge_decomposition_table(())))
    assert canonicalize(_converted(local)) == canonicalize(expected)


def test_symbolic_size_arithmetic_is_left_to_the_retrace() -> None:
    why: list[str] = []
    assert decompose_locally(cached_export("dynamic_seq", decompose=False), exact_names=False, why=why) is None
    assert len(why) == 1 and "is not an ATen op" in why[0], why  # operator.mul on the sequence length


class _DetachInPlace(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + 1
        y.detach_()  # functionalization drops it; its twin `detach` would stay (as `alias` later)
        return y * 2


class _ViewOfWritten(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + 1
        y.add_(1)
        return y.permute(1, 0) * 2  # the retrace replays the permute where mul reads it


@pytest.mark.parametrize("functional_only", [True, False])
def test_in_place_detach_leaves_no_node(functional_only: bool) -> None:
    ep = torch.export.export(_DetachInPlace(), (torch.randn(2, 3),), strict=False)
    local = decompose_locally(ep, functional_only=functional_only)
    assert local is not None
    assert [str(n.target) for n in local.graph.nodes if n.op == "call_function"] == ["aten.add.Tensor", "aten.mul.Tensor"]
    table = {} if functional_only else edge_decomposition_table()
    assert _converted(local) == _converted(ep.run_decompositions(table))


@pytest.mark.parametrize("functional_only", [True, False])
def test_a_view_of_a_value_written_in_place_is_left_to_the_retrace(functional_only: bool) -> None:
    """The retrace's view replay names the permute after its reader (other names and debug
    handles: ConvNeXt's delegates differed from ExecuTorch's by their handles)."""
    ep = torch.export.export(_ViewOfWritten(), (torch.randn(2, 3),), strict=False)
    why: list[str] = []
    assert decompose_locally(ep, functional_only=functional_only, why=why) is None
    assert why == ["node 'permute': aten.permute.default views a value an in-place op wrote"]
