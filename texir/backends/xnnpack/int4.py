"""4-bit group-wise weights (torchao's 8da4w) as ExecuTorch 1.5.1 stores them for XNNPACK: int8
values in [-8, 7] packed two to a byte, and per-group scales in bfloat16."""

from __future__ import annotations

from typing import Any

import numpy as np

from texir.backends.xnnpack.errors import XnnpackUnsupportedError

__all__ = ["bf16_bytes", "check_groups", "pack_int4"]

_BLOCK_BYTES = 1 << 22
"""Input values per block of rows `pack_int4` packs at once (4 Mi: temporaries of a few MiB)."""


def pack_int4(arr: np.ndarray[Any, Any], name: str) -> np.ndarray[Any, Any]:
    """A 2-D int8 matrix of values in [-8, 7] as XNNPACK's 4-bit weights: each value plus 8, two per
    byte along a row (the even column in the low nibble), a row of odd length padded with a zero.
    Packed a block of rows at a time: besides the packed result (half the input), the temporaries
    are a few MiB whatever the weight's size (a 1 GiB output projection is not copied)."""
    if arr.size and (int(arr.min()) < -8 or int(arr.max()) > 7):
        raise XnnpackUnsupportedError(
            f"'{name}': 4-bit weight values must be in [-8, 7], got [{int(arr.min())}, {int(arr.max())}]", node=name)
    if arr.ndim != 2:
        arr = arr.squeeze()
    if arr.ndim != 2:
        raise XnnpackUnsupportedError(f"'{name}': a 4-bit weight must be 2-D, got shape {arr.shape}", node=name)
    rows, cols = arr.shape
    packed: np.ndarray[Any, Any] = np.empty((rows, (cols + 1) // 2), dtype=np.uint8)
    step = max(1, _BLOCK_BYTES // max(cols, 1))
    for top in range(0, rows, step):
        block = arr[top : top + step].astype(np.int16)
        if cols % 2:
            block = np.pad(block, ((0, 0), (0, 1)))  # a zero value, stored as 8 like the others
        block += 8  # [-8, 7] + 8: a nibble in [0, 15]
        low = block[:, ::2].astype(np.uint8)
        low |= (block[:, 1::2] << 4).astype(np.uint8)
        packed[top : top + step] = low
    return packed


def bf16_bytes(arr: np.ndarray[Any, Any], name: str) -> bytes:
    """float32 scales rounded to bfloat16 (nearest, ties to even), as torch's `.to(bfloat16)`. A NaN
    scale is refused (torch's kernels do not agree on its bits, and no quantization has one)."""
    values = np.ascontiguousarray(arr, dtype=np.float32)
    if np.isnan(values).any():
        raise XnnpackUnsupportedError(f"'{name}': a group-wise weight has NaN scales", node=name)
    bits = values.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")
    return rounded.tobytes()


def check_groups(name: str, dims: list[int], scale_shape: tuple[int, ...], group_size: int, axis: int) -> None:
    """ExecuTorch's checks on a group-wise weight: 2-D, channel axis 0, groups of a multiple of 32
    that tile each row, one scale per group."""
    problem = None
    if axis != 0 or len(dims) != 2 or len(scale_shape) != 2:
        problem = f"a 2-D weight quantized along axis 0 with 2-D scales (dims {dims}, scales {list(scale_shape)})"
    elif group_size <= 0 or group_size % 32:
        problem = f"a group size that is a multiple of 32 (got {group_size})"
    elif dims[0] != scale_shape[0] or dims[1] % group_size or dims[1] // group_size != scale_shape[1]:
        problem = f"one scale per group of {group_size} (dims {dims}, scales {list(scale_shape)})"
    if problem is not None:
        raise XnnpackUnsupportedError(f"'{name}': XNNPACK's group-wise weights need {problem}", node=name)
