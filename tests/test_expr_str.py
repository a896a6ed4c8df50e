"""Symbolic sizes are printed once per distinct sympy expression (`texir.adapters.tensors.expr_str`):
the memo gives what `str` gives, tells apart expressions that print differently, and a program
with dynamic shapes converts to the same IR (and the same snapshot bytes) with it as without it."""

from __future__ import annotations

import pytest
import sympy  # type: ignore[import-untyped]  # sympy ships no type information
import torch
from torch import nn

from texir.adapters import fx_import, tensors
from texir.adapters.fx_import import from_exported_program
from texir.adapters.tensors import expr_str
from texir.serialize import snapshot


class _Dynamic(nn.Module):
    """Sizes that are symbols, sums and products of symbols (a concat, a flatten, a view)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = torch.cat([self.lin(x), self.lin(y)], dim=0)
        flat = z.reshape(-1)
        return torch.relu(flat[: x.shape[0] * 4]).view(x.shape[0], 4) + x


@pytest.fixture(scope="module")
def exported() -> torch.export.ExportedProgram:
    n, m = torch.export.Dim("n", min=2, max=64), torch.export.Dim("m", min=2, max=64)
    return torch.export.export(
        _Dynamic(), (torch.randn(3, 4), torch.randn(5, 4)), dynamic_shapes=({0: n}, {0: m}), strict=False
    )


def test_expr_str_is_str_and_separates_what_prints_differently() -> None:
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    s1 = sympy.Symbol("s1", integer=True, positive=True)
    plain = sympy.Symbol("s0")
    exprs = [s0, s0 + 1, s0 + sympy.Float(1.0), 4 * s0 * s1, s0 + s1, plain, sympy.floor(s0 / 2), sympy.Max(s0, 2)]
    for e in exprs:
        assert expr_str(e) == str(e)
    # Equal hashes, unequal values: each keeps its own text however often it is asked for.
    assert hash(sympy.Float(2.0)) == hash(sympy.Integer(2))
    assert expr_str(s0 + sympy.Float(2.0)) == str(s0 + sympy.Float(2.0)) != expr_str(s0 + 2)
    assert expr_str(sympy.Float(2.0)) == "2.00000000000000" and expr_str(sympy.Integer(2)) == "2"


def _reference(ep: torch.export.ExportedProgram, decompose: bool) -> bytes:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tensors, "expr_str", str)
        mp.setattr(fx_import, "expr_str", str)
        return snapshot.dumps(from_exported_program(ep, decompose=decompose))


@pytest.mark.parametrize("decompose", [False, True])
def test_dynamic_program_converts_as_without_the_memo(exported: torch.export.ExportedProgram, decompose: bool) -> None:
    reference = _reference(exported, decompose)
    memoized = from_exported_program(exported, decompose=decompose)
    again = from_exported_program(exported, decompose=decompose)  # the memo warm this time
    assert snapshot.dumps(memoized) == reference
    assert memoized == again == from_exported_program(exported, decompose=decompose)
    symbolic = [d for m in memoized.graph.metas for d in getattr(m, "shape", ()) if isinstance(d, str)]
    assert symbolic, "the program has symbolic sizes: the comparison above covers printed expressions"

