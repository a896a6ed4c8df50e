"""The edge decomposition on the IR (`texir.adapters.ir_decompose`): wherever it applies it must give
the program the FX decomposition gives (`from_exported_program(..., decompose=True)`: names, targets,
arguments, metadata, provenance, debug handles, signature, state), and `lower` the same files; where
it does not apply it says why and `lower` decomposes the FX program as before."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest
import torch

import texir
from tests.real_models import QUANTIZED, REAL_MODELS, zoo_or_real_export
from tests.zoo import DYNAMIC_SHAPES, NESTED_GRAPHS, ZOO
from texir import orchestrate
from texir.adapters import from_exported_program
from texir.adapters.core_aten import NonCoreOperatorError
from texir.adapters.fx_import import state_memo
from texir.adapters.ir_decompose import decompose_functional_ir
from texir.adapters.local_decompose import functional_program
from texir.backends import xnnpack
from texir.emit import emit
from texir.ir import Program
from texir.serialize import pte

DECLINED = {
    **{name: "dynamic shapes" for name in DYNAMIC_SHAPES},
    **{name: "nested graphs" for name in NESTED_GRAPHS},
    "running_stats": "outputs other than user outputs",
    "accumulate": "outputs other than user outputs",
    # its adaptive pooling decomposes through an in-place as_strided_ (the FX path needs torch's retrace too)
    "convnext_tiny_config": "aten.as_strided_.default mutates, or is one functionalization rewrites",
}
"""The models this path leaves to the FX decomposition, and the reason it gives."""

ZOO_NAMES = tuple(m.name for m in ZOO)
REAL_NAMES = tuple(m.name for m in (*REAL_MODELS, *QUANTIZED))


_export = zoo_or_real_export


def _functional(ep: torch.export.ExportedProgram) -> tuple[torch.export.ExportedProgram, Program]:
    functional = functional_program(ep)
    return functional, msgspec.structs.replace(from_exported_program(functional), dialect="ATEN")


@pytest.mark.parametrize("name", ZOO_NAMES + REAL_NAMES)
def test_ir_decomposition_equals_the_fx_decomposition(name: str) -> None:
    functional, program = _functional(_export(name))
    native = tuple(sorted(xnnpack.partitioner().ops_to_not_decompose(program)))
    for keep in ((), native) if name in ZOO_NAMES else (native,):
        why: list[str] = []
        with state_memo():  # (as in lower: the weights converted once)
            got = _outcome(lambda: decompose_functional_ir(functional, program, keep, why=why))
            if got is None:
                assert name in DECLINED, f"{name} (keep {keep}) was declined: {why}"
                assert len(why) == 1 and DECLINED[name] in why[0], why
                continue
            assert name not in DECLINED, f"{name} now decomposes on the IR: take it out of DECLINED"
            expected = _outcome(lambda: from_exported_program(functional, decompose=True, keep=keep, exact_names=False))
        assert got == expected, f"{name} (keep {keep}): the IR decomposition differs from the FX one"


def _outcome(run: Callable[[], Program | None]) -> Program | str | None:
    """The program, or the message of the typed error refusing it (a non-core op: `norms`' var_mean)."""
    try:
        return run()
    except NonCoreOperatorError as exc:
        return f"NonCoreOperatorError: {exc}"


@pytest.mark.parametrize("name", ["mobilenet_v2", "convnet", "transformer_block"])
def test_lower_writes_the_same_files_with_and_without_it(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ep = _export(name)
    with xnnpack.registered():
        via_ir = texir.lower(ep, [xnnpack.partitioner()], cache=None)
        monkeypatch.setattr(orchestrate, "decompose_functional_ir", lambda *a, **k: None)
        via_fx = texir.lower(ep, [xnnpack.partitioner()], cache=None)
    assert via_ir.edge == via_fx.edge
    assert pte.dumps(emit(via_ir.program)) == pte.dumps(emit(via_fx.program))


def test_a_non_core_op_is_refused_naming_its_node() -> None:
    ep = torch.export.export(_Unfold(), (torch.randn(()),))
    functional, program = _functional(ep)
    with pytest.raises(NonCoreOperatorError, match=r"node 'unfold': aten::unfold.default is not a core ATen"):
        decompose_functional_ir(functional, program, ())
    allowed = decompose_functional_ir(functional, program, (), allow_non_core=True)
    assert allowed == from_exported_program(functional, decompose=True, allow_non_core=True, exact_names=False)


def test_a_program_other_than_its_conversion_is_declined() -> None:
    functional, program = _functional(_export("mlp"))
    other, _ = _functional(_export("convnet"))
    why: list[str] = []
    assert decompose_functional_ir(other, program, (), why=why) is None
    assert why == ["the IR is not this program's conversion"]


class _Unfold(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.unfold(0, 1, 1)
