"""Debug maps of `emit_with_debug` against ExecuTorch 1.5.1's `ExecutorchProgramManager`:
`debug_handle_map` (instruction -> debug handle(s)), `delegate_map` (delegate instruction -> backend
and its identifier -> handles map) and instruction -> number of delegate outputs, for every zoo
model without delegation and the demo backend with its debug identifiers. Through XNNPACK, the same
maps are compared in tests/test_executorch_backends.py, on the oracle's own lowerings."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.zoo import ZOO, ZooModel
import texir.backends  # noqa: F401  (registers the demo and reference backends)
from texir.adapters import from_exported_program
from texir.emit import Emitted, emit_with_debug

pytest.importorskip("executorch", reason="the executorch test extra (pip install -e '.[test]')")

# ExecuTorch itself fails on these (the zoo tests assert its failures); nothing to compare.
ET_FAILS_PLAIN = {"accumulate", "topk"}

def _maps(manager_or_emitted: Any) -> tuple[Any, Any, Any]:
    if isinstance(manager_or_emitted, Emitted):
        e = manager_or_emitted
        return e.debug_handle_map(), e.delegate_map(), e.instruction_id_to_num_outs_map()
    m = manager_or_emitted
    return m.debug_handle_map, m.delegate_map, m._emitter_output.instruction_id_to_num_outs_map


def _export(model: ZooModel) -> tuple[torch.export.ExportedProgram, Any]:
    module, args = model.build()
    # each side gets its own export: ExecuTorch's pipeline mutates the program it is given
    return torch.export.export(module, args, strict=False), (module, args)


@pytest.mark.parametrize("model", [m for m in ZOO if m.name not in ET_FAILS_PLAIN], ids=lambda m: m.name)
def test_undelegated_programs_map_every_instruction_like_executorch(model: ZooModel) -> None:
    from executorch.exir import EdgeCompileConfig, to_edge

    theirs = to_edge(_export(model)[0], compile_config=EdgeCompileConfig(_check_ir_validity=False)).to_executorch()
    # (both without the core-ATen check: norms' var_mean is outside core ATen)
    ours = emit_with_debug(from_exported_program(_export(model)[0], decompose=True, allow_non_core=True))
    assert _maps(ours) == _maps(theirs)
    assert ours.debug_handle_map()["forward"]  # every model runs at least one handled instruction


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
