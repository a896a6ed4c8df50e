"""Safetensors checkpoints as memory-mapped tensors: each tensor's storage is a copy-on-write mapping
of its file (safetensors' own `safe_open(..., framework="pt")`), so its pages
are file-backed: the kernel reads them on first touch and may drop them again under pressure, and
no copy lands in anonymous memory. texir hashes, preprocesses and writes weights through views of
their storage, so a checkpoint larger than RAM lowers with little more anonymous memory than its
graph needs.

    tensors = mapped_tensors(checkpoint_files(Path("my-llama")))"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from texir.errors import CheckpointError

__all__ = ["INDEX_FILE", "SINGLE_FILE", "checkpoint_files", "mapped_tensors"]

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
"""transformers' names: one file, or shards listed by an index's `weight_map`."""


def checkpoint_files(directory: Path) -> tuple[Path, ...]:
    """The safetensors files of a checkpoint directory: the shards its index names (in name order),
    else `model.safetensors`, else every `*.safetensors` in it. None is a CheckpointError."""
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted({str(name) for name in weight_map.values()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(
                f"{index}: not a safetensors index ({type(exc).__name__}: {exc}); it maps each tensor name to "
                "its shard under 'weight_map', as save_pretrained writes it"
            ) from None
        files = tuple(directory / name for name in names)
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index} names shards that do not exist: {', '.join(missing[:3])}")
        return files
    if (directory / SINGLE_FILE).is_file():
        return (directory / SINGLE_FILE,)
    found = tuple(sorted(directory.glob("*.safetensors")))
    if not found:
        raise CheckpointError(
            f"{directory}: no safetensors weights ({SINGLE_FILE}, or shards listed in {INDEX_FILE}); save the "
            "model with save_pretrained (safetensors is its format) or convert .bin weights to safetensors"
        )
    return found


def mapped_tensors(files: tuple[Path, ...]) -> dict[str, torch.Tensor]:
    """Every tensor of `files` by name, memory-mapped (nothing is read until used). A name in two
    files, or a file safetensors cannot read, is a CheckpointError."""
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as handle:
                for name in handle.keys():
                    if name in tensors:
                        raise CheckpointError(f"tensor {name!r} is in two checkpoint files (the second: {path})")
                    tensors[name] = handle.get_tensor(name)
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
    return tensors
