"""tests/test_executorch_backends.py's comparison (texir through ExecuTorch's XNNPACK, and texir's
native XNNPACK, against ExecuTorch 1.5.1's own .pte) on ten torchvision and seven transformers
architectures (random weights from small configs: LR-ASPP, Phi-3 and a Whisper encoder with sdpa
among them) and a hand-written attention block."""

from __future__ import annotations

import pytest

from tests.real_models import QUANTIZED, REAL_MODELS
from tests.xnnpack_conformance import REAL_NAMES, _check_same, _lowered
from tests.xnnpack_oracle import pte_view


@pytest.mark.parametrize("name", REAL_NAMES)
def test_real_model_matches_executorch_xnnpack(name: str) -> None:
    _check_same(name)


@pytest.mark.parametrize("name", REAL_NAMES)
def test_native_xnnpack_matches_executorch_xnnpack(name: str) -> None:
    _check_same(name, native=True)


def test_real_model_zoo_is_wide_enough() -> None:
    families = [m.family for m in REAL_MODELS]
    assert families.count("torchvision") >= 8 and families.count("transformers") >= 5 and len(QUANTIZED) >= 3
    delegated = [name for name in REAL_NAMES if len(pte_view(_lowered(name)[2].pte or b"").delegates) > 0]
    assert delegated == REAL_NAMES
