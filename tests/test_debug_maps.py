"""Debug maps of `emit_with_debug` against ExecuTorch 1.5.1's `ExecutorchProgramManager`:
`debug_handle_map` (instruction -> debug handle(s)), `delegate_map` (delegate instruction -> backend
and its identifier -> handles map) and instruction -> number of delegate outputs, for every zoo
model (no delegation, and XNNPACK through texir) and the demo backend with its debug identifiers."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.zoo import ZOO, ZooModel
from texir.adapters import from_exported_program
from texir.emit import Emitted, emit_with_debug

pytest.importorskip("executorch", reason="the executorch test extra (pip install -e '.[test]')")

# ExecuTorch itself fails on these (the zoo tests assert its failures); nothing to compare.
ET_FAILS_PLAIN = {"accumulate", "topk"}
ET_FAILS_XNNPACK = ET_FAILS_PLAIN | {"norms", "cond_closure_nested"}

# After each partition ExecuTorch re-sorts the whole graph with torch.fx's legalize_graph, a
# breadth-first topological sort that its own docs call unstable; texir keeps the program's order.
# Where the two orders differ, the same instructions (and so the same handles, delegate entries and
# output counts) sit at other indices, and a delegate lists its nodes' handles in another order:
# compared as multisets; the outputs are equal (tests/test_executorch_backends.py).
REORDERED_BY_LEGALIZE = {
    "attention", "transformer_block", "running_stats", "dict_io", "split_chunk", "scalars",
    "int_lists", "cat_stack", "index_gather", "where_mask", "dtypes", "pad_slice",
}


def _maps(manager_or_emitted: Any) -> tuple[Any, Any, Any]:
    if isinstance(manager_or_emitted, Emitted):
        e = manager_or_emitted
        return e.debug_handle_map(), e.delegate_map(), e.instruction_id_to_num_outs_map()
    m = manager_or_emitted
    return m.debug_handle_map, m.delegate_map, m._emitter_output.instruction_id_to_num_outs_map


def _unordered(maps: tuple[Any, Any, Any]) -> list[list[str]]:
    # A delegate's handle list follows its sub-graph's node order, which legalize_graph sorts too.
    def norm(v: Any) -> str:
        return repr(sorted(v)) if isinstance(v, list) else repr(v)

    return [sorted(norm(v) for method in m.values() for v in method.values()) for m in maps]


def _export(model: ZooModel) -> tuple[torch.export.ExportedProgram, Any]:
    module, args = model.build()
    # each side gets its own export: ExecuTorch's pipeline mutates the program it is given
    return torch.export.export(module, args, strict=False), (module, args)


@pytest.mark.parametrize("model", [m for m in ZOO if m.name not in ET_FAILS_PLAIN], ids=lambda m: m.name)
def test_undelegated_programs_map_every_instruction_like_executorch(model: ZooModel) -> None:
    from executorch.exir import EdgeCompileConfig, to_edge

    theirs = to_edge(_export(model)[0], compile_config=EdgeCompileConfig(_check_ir_validity=False)).to_executorch()
    ours = emit_with_debug(from_exported_program(_export(model)[0], decompose=True))
    assert _maps(ours) == _maps(theirs)
    assert ours.debug_handle_map()["forward"]  # every model runs at least one handled instruction


@pytest.mark.parametrize("model", [m for m in ZOO if m.name not in ET_FAILS_XNNPACK], ids=lambda m: m.name)
def test_xnnpack_programs_map_instructions_and_delegates_like_executorch(model: ZooModel) -> None:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from texir.adapters.executorch import executorch_partitioner
    from texir.lowering import lower

    theirs = _maps(to_edge_transform_and_lower(_export(model)[0], partitioner=[XnnpackPartitioner()]).to_executorch())
    ours = _maps(emit_with_debug(lower(_export(model)[0], [executorch_partitioner(XnnpackPartitioner())])))
    if model.name in REORDERED_BY_LEGALIZE:
        assert ours != theirs, f"{model.name} now matches ExecuTorch exactly: drop it from REORDERED_BY_LEGALIZE"
        assert _unordered(ours) == _unordered(theirs)
    else:
        assert ours == theirs
    delegates = ours[1]["forward"]
    assert all(d["name"] == "XnnpackBackend" for d in delegates.values())
    assert set(ours[2]["forward"]) == set(delegates)  # every delegate call has an output count


def test_demo_backend_debug_identifiers_reach_the_delegate_map() -> None:
    from tests.test_pte_conformance import _demo_model, _executorch_tail, _texir_tail
    from executorch import exir

    from texir.lowering import to_backend

    module, args = _demo_model()
    edge = exir.to_edge(torch.export.export(module, args, strict=True),
                        compile_config=exir.EdgeCompileConfig(_check_ir_validity=False))
    theirs = _maps(edge.to_backend(_executorch_tail()).to_executorch())
    ours = _maps(emit_with_debug(to_backend(
        from_exported_program(torch.export.export(module, args, strict=True), decompose=True), _texir_tail,
    )))
    assert ours == theirs
    ((index, entry),) = ours[1]["forward"].items()
    assert entry["name"] == "BackendWithDelegateMappingDemo" and entry["delegate_map"]  # the backend's own map
    assert isinstance(ours[0]["forward"][index], list)  # a delegate call maps to all its nodes' handles
