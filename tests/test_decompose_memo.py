"""Re-lowering after a weights-only change reuses the decomposition (`texir.lowering.decompose_memo`):
the result must be exactly the program a fresh decomposition gives, a structural change must miss,
and a decomposition whose state is not the program's own must not be reused."""

from __future__ import annotations

import msgspec
import pytest
import torch

import tests.lowering_helpers as h
from tests.zoo import ZOO, ZooModel, zoo_model
from texir.adapters import from_exported_program
from texir.ir import Program, StateEntry, canonicalize
from texir.lowering import OpSupportPartitioner, PreprocessCache
from texir.orchestrate import lower
from texir.ir.analysis import walk_keyed_graphs
from texir.lowering.decompose_memo import decomposition_key, rebind_state, template_of

MODELS = ("mlp", "conv_bn", "attention", "running_stats", "lifted_constant", "embedding", "dynamic_seq",
          "cond_simple", "scalars", "split_chunk")
"""Linear, conv + batch norm, attention, mutated buffers, lifted constants, embedding, a dynamic
dimension, cond branches, scalar operands, multi-output ops."""


GENERATED_FRAMES = {"cond_simple"}


def _names(program: Program) -> list[str]:
    return [n.name for _, g in walk_keyed_graphs(program.graph) for n in g.nodes]


def _export(model: ZooModel, scale: float = 1.0) -> torch.export.ExportedProgram:
    module, args = model.build()
    if scale != 1.0:
        with torch.no_grad():
            for p in module.parameters():
                p.mul_(scale)  # the same structure, other weights
    return torch.export.export(module, args, dynamic_shapes=model.dynamic_shapes, strict=False)


def _partitioner() -> OpSupportPartitioner:
    ops = {"aten::addmm.default", "aten::mm.default", "aten::relu.default", "aten::add.Tensor", "aten::mul.Tensor",
           "aten::convolution.default", "aten::embedding.default"}
    return OpSupportPartitioner(h.TEST_BACKEND, ops, tag_constants=True)


@pytest.mark.parametrize("name", MODELS)
def test_reused_decomposition_equals_a_fresh_one(name: str) -> None:
    model = zoo_model(name)
    assert model in ZOO
    cache = PreprocessCache()
    lower(_export(model), [_partitioner()], cache=cache)
    assert cache.decompositions_reused == 0
    changed = lower(_export(model, scale=1.5), [_partitioner()], cache=cache).program
    assert cache.decompositions_reused == 1, f"{name}: the decomposition was not reused"
    fresh = lower(_export(model, scale=1.5), [_partitioner()], cache=None).program
    if name in GENERATED_FRAMES:
        # Stack traces of nodes a retrace makes in cond branches name torch's generated code by a
        # process-wide counter ('<eval_with_key>.135'): every fresh decomposition differs there too.
        assert changed != fresh and canonicalize(changed) == canonicalize(fresh)
        assert _names(changed) == _names(fresh)
    else:
        assert changed == fresh
    assert [e.value.sha256 for e in changed.state] == [e.value.sha256 for e in fresh.state]


def test_a_structural_change_is_not_reused() -> None:
    cache = PreprocessCache()
    lower(_export(zoo_model("mlp")), [_partitioner()], cache=cache)
    lower(_export(zoo_model("deep_mlp")), [_partitioner()], cache=cache)
    assert cache.decompositions_reused == 0


def test_templates_hold_no_weights_and_the_cache_keeps_a_bounded_number() -> None:
    cache = PreprocessCache(decompositions_kept=2)
    for name in ("mlp", "conv_bn", "attention"):
        lower(_export(zoo_model(name)), [_partitioner()], cache=cache)
    templates = list(cache._decompositions.values())
    assert len(templates) == 2
    assert all(e.value.data is None and e.value.sha256 == "" for t in templates for e in t.state)
    lower(_export(zoo_model("mlp")), [_partitioner()], cache=cache)  # the oldest was dropped
    assert cache.decompositions_reused == 0


def _programs(name: str) -> tuple[Program, Program]:
    ep = _export(zoo_model(name))
    return from_exported_program(ep), from_exported_program(ep, decompose=True)


def test_the_key_ignores_state_values_only() -> None:
    aten, _ = _programs("conv_bn")
    other = from_exported_program(_export(zoo_model("conv_bn"), scale=2.0))
    assert decomposition_key(aten, []) == decomposition_key(other, [])
    assert decomposition_key(aten, []) != decomposition_key(aten, ["aten::linear.default"])
    renamed = msgspec.structs.replace(aten, state=tuple(
        msgspec.structs.replace(e, target=e.target + "_x") for e in aten.state
    ))
    assert decomposition_key(renamed, []) != decomposition_key(aten, [])


def test_state_the_decomposition_made_is_not_reused() -> None:
    aten, decomposed = _programs("mlp")
    template = template_of(decomposed, aten)
    assert template is not None and rebind_state(template, aten) == decomposed
    # a state entry the undecomposed program does not have (or holds other bytes in)
    extra = StateEntry(target="made_here", value=aten.state[0].value)
    grown = msgspec.structs.replace(decomposed, state=(*decomposed.state, extra))
    assert template_of(grown, aten) is None
    first = aten.state[0]
    changed_value = msgspec.structs.replace(first, value=msgspec.structs.replace(first.value, sha256="0" * 64))
    altered = msgspec.structs.replace(decomposed, state=(changed_value, *decomposed.state[1:]))
    assert template_of(altered, aten) is None
