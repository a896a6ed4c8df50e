"""A language model's decomposition without torch's retrace (issue 42): the static-KV-cache Llama
that `texir.lower` has made functional (its cache writes are buffer-update outputs; its sequence
length symbolic, or fixed) is decomposed node by node, and lowers to the same `.pte` and `.ptd`
bytes as through torch's retrace; the report names the step the retrace still does."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import texir.adapters.fx_import as fx_import
from tests.real_models import export_static_cache_llama, static_cache_llama
from texir.adapters import from_exported_program
from texir.adapters.decompositions import edge_decomposition_table
from texir.adapters.local_decompose import decompose_locally
from texir.backends import xnnpack
from texir.emit import DEFAULT_EXTERNAL_TAG, EmitOptions, emit
from texir.ir.canonical import canonicalize
from texir.orchestrate import lower
from texir.serialize import pte

MAX_CACHE = 16
PROMPT = [3, 7, 11, 5]
KEEP = ("aten::linear.default",)


@pytest.fixture(scope="module")
def exported() -> dict[str, torch.export.ExportedProgram]:
    exportable = static_cache_llama(
        dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64),
        MAX_CACHE,
    )
    fixed = exportable.export(input_ids=torch.tensor([PROMPT]), cache_position=torch.arange(len(PROMPT)), strict=True)
    return {"dynamic": export_static_cache_llama(exportable, PROMPT, MAX_CACHE), "fixed": fixed}


def _files(ep: torch.export.ExportedProgram) -> tuple[bytes, bytes, Any]:
    lowered = lower(ep, [xnnpack.partitioner()], cache=None)
    emitted = emit(lowered.program, EmitOptions(external_constants=True, external_named_data=DEFAULT_EXTERNAL_TAG))
    (data,) = emitted.external
    return pte.dumps(emitted), pte.dumps_ptd(data), lowered.report


def _retraced_files(ep: torch.export.ExportedProgram) -> tuple[bytes, bytes, Any]:
    """`_files` with the decomposition through torch's retrace, as before issue 42."""
    def refuse(*args: Any, why: list[str] | None = None, **kwargs: Any) -> None:
        if why is not None:
            why.append("this test asks for the retrace")
        return None

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fx_import, "decompose_locally", refuse)
        return _files(ep)


@pytest.mark.parametrize("shape", ["dynamic", "fixed"])
def test_llm_lowers_without_the_decomposition_retrace_to_the_same_bytes(
    exported: dict[str, torch.export.ExportedProgram], shape: str
) -> None:
    ep = exported[shape]
    program, data, report = _files(ep)
    want_program, want_data, want_report = _retraced_files(ep)
    assert program == want_program and data == want_data
    # Only the first step (making the exported program functional) is still torch's retrace, and
    # the report says why; the forced retrace of the decomposition is named too.
    assert [r.step for r in report.retraced] == ["functionalize"]
    # (the rotary embedding's no-grad region is a nested graph; the functional program keeps the
    # retrace's names, so a dynamic one is the retrace's first)
    assert ("dynamic shapes" if shape == "dynamic" else "nested graphs") in report.retraced[0].reason
    assert [r.step for r in want_report.retraced] == ["functionalize", "decompose"]
    assert want_report.retraced[1].reason == "this test asks for the retrace"


def test_functional_llm_decomposes_locally_as_the_retrace_does(exported: dict[str, torch.export.ExportedProgram]) -> None:
    """The fixed-length program equals the retrace's to the name; the dynamic one to the name where
    the retrace does not number symbolic-size arithmetic it drops, so only when names may differ."""
    for shape in ("fixed", "dynamic"):
        functional = exported[shape].run_decompositions({})
        assert any(s.kind.name == "BUFFER_MUTATION" for s in functional.graph_signature.output_specs)
        expected = from_exported_program(functional.run_decompositions(edge_decomposition_table(KEEP)))
        why: list[str] = []
        exact = decompose_locally(functional, KEEP, why=why)
        local = decompose_locally(functional, KEEP, exact_names=False)
        assert local is not None
        got = from_exported_program(local)
        assert canonicalize(got) == canonicalize(expected)
        if shape == "fixed":
            assert exact is not None and from_exported_program(exact) == expected and why == []
        else:
            assert exact is None and len(why) == 1 and "dynamic shapes" in why[0]
            assert got.range_constraints == expected.range_constraints
