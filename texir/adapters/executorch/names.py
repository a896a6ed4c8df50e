"""Short names for the ExecuTorch partitioners `texir lower --partitioner NAME` knows."""

from __future__ import annotations

import importlib
from typing import Any, Final

from texir.adapters.executorch.deps import require_executorch
from texir.adapters.executorch.partitioner import ExecutorchPartitioner
from texir.lowering.errors import PartitionerError

__all__ = ["PARTITIONERS", "as_executorch_partitioner", "partitioner_by_name"]

PARTITIONERS: Final[dict[str, str]] = {
    "xnnpack": "executorch.backends.xnnpack.partition.xnnpack_partitioner:XnnpackPartitioner",
    "vulkan": "executorch.backends.vulkan.partitioner.vulkan_partitioner:VulkanPartitioner",
    "example": "executorch.backends.example.example_partitioner:ExamplePartitioner",
}
"""Short name -> MODULE:CLASS of an ExecuTorch partitioner built with no arguments."""


def partitioner_by_name(name: str) -> ExecutorchPartitioner:
    """The ExecuTorch partitioner `name` ('xnnpack', ...) with default options, as a texir partitioner."""
    spec = PARTITIONERS.get(name)
    if spec is None:
        raise PartitionerError(
            f"--partitioner {name!r} is not a known ExecuTorch partitioner; known: {', '.join(sorted(PARTITIONERS))} "
            "(or give MODULE:CLASS)"
        )
    require_executorch(f"--partitioner {name}")
    module_name, _, attr = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:  # a backend whose own dependencies are missing
        raise PartitionerError(
            f"--partitioner {name!r}: cannot import {spec} ({type(exc).__name__}: {exc}); "
            "install that backend's dependencies"
        ) from exc
    built = as_executorch_partitioner(cls)
    if built is None:
        raise PartitionerError(f"--partitioner {name!r}: {spec} is not an ExecuTorch Partitioner class")
    return built


def as_executorch_partitioner(obj: Any) -> ExecutorchPartitioner | None:
    """`obj` as a texir partitioner when it is an ExecuTorch `Partitioner` class (built with no
    arguments) or instance; None for anything else (executorch not needed to say so)."""
    try:
        from executorch.exir.backend.partitioner import Partitioner
    except ImportError:
        return None
    if isinstance(obj, type) and issubclass(obj, Partitioner):
        try:
            obj = obj()
        except Exception as exc:  # a class that needs options
            raise PartitionerError(
                f"ExecuTorch partitioner {obj.__name__}() failed: {type(exc).__name__}: {exc}; "
                "give a MODULE:NAME that is an instance (or a function returning one) built with the options it needs"
            ) from exc
    if isinstance(obj, Partitioner):
        return ExecutorchPartitioner(obj)
    return None
