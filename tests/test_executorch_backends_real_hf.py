"""tests/test_executorch_backends.py's comparison (texir through ExecuTorch's XNNPACK, and texir's
native XNNPACK, against ExecuTorch 1.5.1's own .pte) on seven transformers architectures (Phi-3 and a
Whisper encoder with sdpa among them) and a hand-written attention block. The bridge's comparison
leaves out the models of `BRIDGE_UNCHECKED_REAL` unless TEXIR_BRIDGE_ALL=1 (each says why); the
native one takes every model. tests/test_executorch_backends_real.py has the torchvision models, so
both xdist workers share the real models."""

from __future__ import annotations

import pytest

from tests.real_models import REAL_MODELS
from tests.xnnpack_conformance import BRIDGE_REAL_NAMES, _check_same

LANGUAGE = [m.name for m in REAL_MODELS if m.family != "torchvision"]


@pytest.mark.parametrize("name", [n for n in BRIDGE_REAL_NAMES if n in LANGUAGE])
def test_real_model_matches_executorch_xnnpack(name: str) -> None:
    _check_same(name)


@pytest.mark.parametrize("name", LANGUAGE)
def test_native_xnnpack_matches_executorch_xnnpack(name: str) -> None:
    _check_same(name, native=True)
