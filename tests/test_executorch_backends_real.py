"""tests/test_executorch_backends.py's comparison (texir through ExecuTorch's XNNPACK, and texir's
native XNNPACK, against ExecuTorch 1.5.1's own .pte) on ten torchvision architectures (random weights
from small configs; LR-ASPP as a user builds it, `lraspp_mobilenet_v3_large`, its input named `input`).
The bridge's comparison leaves out the models of `BRIDGE_UNCHECKED_REAL` unless TEXIR_BRIDGE_ALL=1
(each says why); the native one takes every model, each side on its own deep copy of the export.
tests/test_executorch_backends_real_hf.py has the transformers models, so both xdist workers share
the real models."""

from __future__ import annotations

import pytest

from tests.real_models import QUANTIZED, REAL_MODELS
from tests.xnnpack_conformance import BRIDGE_REAL_NAMES, _check_same, _native
from tests.xnnpack_oracle import pte_view

VISION = [m.name for m in REAL_MODELS if m.family == "torchvision"]


@pytest.mark.parametrize("name", [n for n in BRIDGE_REAL_NAMES if n in VISION])
def test_real_model_matches_executorch_xnnpack(name: str) -> None:
    _check_same(name)


@pytest.mark.parametrize("name", VISION)
def test_native_xnnpack_matches_executorch_xnnpack(name: str) -> None:
    _check_same(name, native=True)


def test_real_model_zoo_is_wide_enough() -> None:
    families = [m.family for m in REAL_MODELS]
    assert families.count("torchvision") >= 8 and families.count("transformers") >= 5 and len(QUANTIZED) >= 3
    delegated = [m.name for m in REAL_MODELS if len(pte_view(_native(m.name).pte or b"").delegates) > 0]
    assert delegated == [m.name for m in REAL_MODELS]
