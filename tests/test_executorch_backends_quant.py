"""tests/test_executorch_backends.py's comparison (texir through ExecuTorch's XNNPACK, and texir's
native XNNPACK, against ExecuTorch 1.5.1's own .pte) on five pt2e int8 models (static and dynamic,
torchvision's mobilenet_v2 among them) and torchao's 8da4w; and, native vs ExecuTorch only, more
torchvision models quantized with XNNPACK's quantizer (tests/real_models.py's QUANTIZED_NATIVE)."""

from __future__ import annotations

import pytest

from tests.xnnpack_conformance import QUANT_NAMES, QUANT_NATIVE_NAMES, _check_same


@pytest.mark.parametrize("name", QUANT_NAMES)
def test_pt2e_int8_model_matches_executorch_xnnpack(name: str) -> None:
    _check_same(name, quantized=True)


@pytest.mark.parametrize("name", QUANT_NATIVE_NAMES)
def test_native_xnnpack_matches_executorch_xnnpack_quantized(name: str) -> None:
    # issue #30: pt2e static and dynamic int8 and torchao 8da4w through texir's native XNNPACK
    _check_same(name, quantized=True, native=True)
