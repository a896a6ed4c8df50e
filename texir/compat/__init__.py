"""ExecuTorch's public lowering API on texir: one line switches an ExecuTorch script over.

    import texir.compat; texir.compat.install()
    # unchanged ExecuTorch code:
    from executorch.exir import to_edge_transform_and_lower
    to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().write_to_file(f)

`to_edge`, `to_edge_transform_and_lower`, `EdgeProgramManager` and `ExecutorchProgramManager` take
ExecuTorch's arguments and are backed by `texir.lower` and texir's emitter; a default
`XnnpackPartitioner()` runs as texir's native XNNPACK backend, everything else through the bridge
(`texir.executorch`). See docs/compat.md."""

from __future__ import annotations

from texir.compat.config import UnsupportedOptionError, emit_options
from texir.compat.switch import install, installed, is_installed, uninstall
from texir.compat.program import (
    EdgeProgramManager,
    ExecutorchProgramManager,
    to_edge,
    to_edge_transform_and_lower,
)

__all__ = [
    "EdgeProgramManager",
    "ExecutorchProgramManager",
    "UnsupportedOptionError",
    "emit_options",
    "install",
    "installed",
    "is_installed",
    "to_edge",
    "to_edge_transform_and_lower",
    "uninstall",
]
