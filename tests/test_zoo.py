"""The zoo itself: it covers what it claims, exports deterministically, and the exported programs
compute what the eager modules do."""

from __future__ import annotations

import pytest
import torch

from tests.zoo import ZOO, cached_export, compare_runs, export_zoo_model, fresh_module, run_model, zoo_model

NAMES = [m.name for m in ZOO]


# ------------------------------------------------------------------------------------------------
# The zoo itself


def test_zoo_covers_the_required_kinds() -> None:
    assert len(ZOO) >= 28
    assert len(set(NAMES)) == len(NAMES)
    tags = [m.tags for m in ZOO]
    assert sum("dynamic" in t for t in tags) >= 3
    assert sum("cond" in t for t in tags) >= 2
    assert any(m.stateful for m in ZOO)
    assert all(m.dynamic_shapes is not None for m in ZOO if "dynamic" in m.tags)
    assert all(m.alt_args is not None for m in ZOO if "dynamic" in m.tags or "cond" in m.tags)


@pytest.mark.parametrize("name", NAMES)
def test_zoo_export_matches_eager(name: str) -> None:
    """The exported program computes what the module does: exactly before decomposition, to
    rounding after it (decompositions such as silu -> x * sigmoid(x) may change the last bit)."""
    m = zoo_model(name)
    eager = run_model(m, lambda: m.build()[0])
    compare_runs(run_model(m, lambda: fresh_module(cached_export(name, False))), eager, exact=True, what="export")
    compare_runs(run_model(m, lambda: fresh_module(cached_export(name, True))), eager, exact=False, what="core aten")


def test_zoo_is_deterministic() -> None:
    for name in ("mlp", "cond_closure_nested", "running_stats"):
        a, b = export_zoo_model(zoo_model(name)), cached_export(name, True)
        assert str(a.graph) == str(b.graph)
        for key, value in b.state_dict.items():
            assert torch.equal(a.state_dict[key], value), key


