"""A language model's decomposition without torch's retrace (issue 42): the static-KV-cache Llama
that `texir.lower` has made functional (its cache writes are buffer-update outputs; its sequence
length symbolic, or fixed) is decomposed node by node, and lowers to the same `.pte` and `.ptd`
bytes as through torch's retrace. So is making it functional (the cache's in-place writes, the
rotary embedding's no-grad region): no step is torch's retrace, and a program that needs one gets
it, named in the report with the reason."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import torch

import texir.adapters.fx_import as fx_import
from tests.real_models import export_static_cache_llama, static_cache_llama
from texir.adapters import from_exported_program
from texir.adapters.decompositions import edge_decomposition_table
from texir.adapters import local_decompose
from texir.adapters.local_decompose import decompose_locally, functional_program
from texir.backends import xnnpack
from texir.emit import DEFAULT_EXTERNAL_TAG, EmitOptions, emit
from texir.ir import BufferMutation, Program
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
    """`_files` through torch's retrace, both steps, as before issue 42: making the program
    functional (`run_decompositions({})`) and decomposing it."""
    def refuse(*args: Any, why: list[str] | None = None, **kwargs: Any) -> None:
        if why is not None:
            why.append("this test asks for the retrace")
        return None

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fx_import, "decompose_locally", refuse)
        patch.setattr(local_decompose, "decompose_locally", refuse)
        return _files(ep)


@pytest.mark.parametrize("shape", ["dynamic", "fixed"])
def test_llm_lowers_without_any_retrace_to_the_same_bytes(
    exported: dict[str, torch.export.ExportedProgram], shape: str
) -> None:
    ep = exported[shape]
    program, data, report = _files(ep)
    want_program, want_data, want_report = _retraced_files(ep)
    assert program == want_program and data == want_data
    # Neither step is torch's retrace: the no-grad region is inlined, the cache writes are made
    # functional on the graph; the forced retraces are named in the other report
    assert report.retraced == ()
    assert [r.step for r in want_report.retraced] == ["functionalize", "decompose"]
    assert {r.reason for r in want_report.retraced} == {"this test asks for the retrace"}


def _without_ancestors(program: Program) -> Program:
    """`program` without the provenance's ancestor names: they number graphs in the order first
    seen, and the retrace's own graph comes first in its numbering (its sym_size node has no
    origin), so equal groupings (the debug handles, compared) are spelled with other numbers."""
    table = program.graph.provenance
    assert table is not None
    table = msgspec.structs.replace(table, ancestor=(None,) * len(table.ancestor))
    return msgspec.structs.replace(program, graph=msgspec.structs.replace(program.graph, provenance=table))


@pytest.mark.parametrize("shape", ["dynamic", "fixed"])
def test_llm_functionalizes_locally_as_the_retrace_does(
    exported: dict[str, torch.export.ExportedProgram], shape: str
) -> None:
    """The exported program (in-place cache writes, a no-grad region) made functional on the graph
    equals `run_decompositions({})` but for node names: functionalization numbers views it drops
    before replaying them where they are read, and SymInt arithmetic."""
    ep = exported[shape]
    why: list[str] = []
    local = functional_program(ep, why=why)
    assert why == []
    got, want = from_exported_program(local), from_exported_program(ep.run_decompositions({}))
    assert sum(isinstance(o, BufferMutation) for o in got.signature.outputs) == 6
    assert canonicalize(_without_ancestors(got)) == canonicalize(_without_ancestors(want))
    if shape == "fixed":  # no symbolic size: the ancestors are the same too
        assert canonicalize(got) == canonicalize(want)
    # asked for the retrace's names, it retraces and says why
    assert decompose_locally(ep, functional_only=True, why=why) is None
    assert len(why) == 1 and ("views of buffers written" in why[0] or "dynamic shapes" in why[0])


class _SliceWrite(torch.nn.Module):
    """A cache written through a slice (`cache[:, :n] = x`): functionalization makes it a
    slice_scatter, which texir leaves to the retrace."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(2, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.cache[:, :3].copy_(x)
        return self.cache * 2


class _StaleView(torch.nn.Module):
    """A view of a buffer read after the buffer is written in place: its value changed with it."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.zeros(4, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        row = self.state[0]
        self.state.add_(x)
        return row * 2


@pytest.mark.parametrize(("module", "reason"), [(_SliceWrite, "mutates a value something else can see"),
                                                 (_StaleView, "from before an in-place write")])
def test_functionalizing_falls_back_to_the_retrace_and_says_why(module: type[torch.nn.Module], reason: str) -> None:
    x = torch.ones(2, 3) if module is _SliceWrite else torch.ones(4, 3)
    ep = torch.export.export(module().eval(), (x,), strict=True)
    lowered = lower(ep, [xnnpack.partitioner()], cache=None)
    (step,) = [r for r in lowered.report.retraced if r.step == "functionalize"]
    assert reason in step.reason
    # the retrace's program is what lowering continued with: the buffer update is an output
    assert any(isinstance(o, BufferMutation) for o in lowered.program.signature.outputs)


def test_nodes_with_nothing_to_decompose_take_the_exports_values(exported: dict[str, torch.export.ExportedProgram]) -> None:
    """A core-ATen node with nothing to decompose, reading the program's own values, keeps the value
    export computed (no fake-tensor dispatch): most nodes of the functional step do. Ops that
    decompose, functional twins of in-place writes and their readers get values of their own."""
    ep = exported["dynamic"]
    own = {id(n.meta["val"]) for n in ep.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)}
    calls = [n for n in functional_program(ep).graph.nodes if n.op == "call_function"]
    kept = [n for n in calls if id(n.meta.get("val")) in own]
    assert len(kept) > len(calls) // 2
    assert not any("index_copy" in str(n.target) for n in kept)  # the cache writes: functional twins
