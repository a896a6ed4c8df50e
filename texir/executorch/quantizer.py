"""ExecuTorch's pt2e quantizer for XNNPACK, configured as ExecuTorch 1.5.1's XNNPACK recipes configure it
(`XNNPACKRecipeProvider._build_quantized_recipe`): the one piece of a recipe that lives in executorch."""

from __future__ import annotations

from typing import Any

from texir.executorch.deps import require_executorch

__all__ = ["xnnpack_quantizer"]


def xnnpack_quantizer(*, per_channel: bool, dynamic: bool) -> Any:
    """`XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=per_channel,
    is_dynamic=dynamic))`, as ExecuTorch's PT2E_INT8_* recipes build it."""
    require_executorch("the pt2e int8 recipes (ExecuTorch's XNNPACKQuantizer)")
    # executorch is this layer's optional extra: imported where it is needed
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    config = get_symmetric_quantization_config(is_per_channel=per_channel, is_dynamic=dynamic)
    return XNNPACKQuantizer().set_global(config)
