"""`texir.adapters.symbolic_sizes.unbacked_sizes` answers as torch's `free_unbacked_symbols` does:
plain sizes at once, symbolic ones (backed, unbacked, an unbacked storage offset) by the walk."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv, free_unbacked_symbols

from texir.adapters.symbolic_sizes import unbacked_sizes


@pytest.fixture(scope="module")
def fakes() -> dict[str, torch.Tensor]:
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    plain_mode = FakeTensorMode()
    unbacked = env.create_unbacked_symint()
    with plain_mode:
        plain = torch.empty(4, 6)
    with mode:
        backed = mode.from_tensor(torch.randn(4, 6))  # (sizes are symbols with hints)
        made = torch.empty(unbacked, 3)
        offset = backed.as_strided((2,), (1,), unbacked)
    return {"plain": plain, "real": torch.randn(2, 3), "backed": backed, "unbacked": made, "offset": offset}


@pytest.mark.parametrize("name", ["plain", "real", "backed", "unbacked", "offset"])
def test_same_answer_as_free_unbacked_symbols(fakes: dict[str, torch.Tensor], name: str) -> None:
    value = fakes[name]
    assert unbacked_sizes(value) == bool(free_unbacked_symbols(value))
    assert unbacked_sizes(value) is (name in ("unbacked", "offset"))
