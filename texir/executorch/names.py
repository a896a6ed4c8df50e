"""Short names for the ExecuTorch partitioners `texir lower --partitioner NAME` knows."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any, Final

from texir.executorch.deps import require_executorch
from texir.executorch.partitioner import ExecutorchPartitioner
from texir.lowering.errors import PartitionerError

__all__ = ["PARTITIONERS", "as_executorch_partitioner", "partitioner_by_name"]

PARTITIONERS: Final[dict[str, str]] = {
    "xnnpack": "executorch.backends.xnnpack.partition.xnnpack_partitioner:XnnpackPartitioner",
    "vulkan": "executorch.backends.vulkan.partitioner.vulkan_partitioner:VulkanPartitioner",
    "webgpu": "executorch.backends.webgpu.partitioner.partitioner:WebGPUPartitioner",
    "example": "executorch.backends.example.example_partitioner:ExamplePartitioner",
    "openvino": "texir.executorch.names:openvino_partitioner",
    "tosa": "texir.executorch.names:tosa_partitioner",
    "ethos-u": "texir.executorch.names:ethos_u_partitioner",
    "coreml": "executorch.backends.apple.coreml.partition:CoreMLPartitioner",
}
"""Short name -> MODULE:NAME of an ExecuTorch partitioner class built with no arguments, or of a
function returning one built with default options."""


def openvino_partitioner() -> Any:
    """ExecuTorch's OpenvinoPartitioner for the CPU device. Its package __init__ also imports its
    quantizer (nncf); the partitioner and backend need only openvino, so they are imported without it."""
    name = "executorch.backends.openvino"
    if name not in sys.modules:
        try:
            importlib.import_module(name)
        except ImportError:
            sys.modules.pop(name, None)
            spec = importlib.util.find_spec(name)
            if spec is None or spec.submodule_search_locations is None:
                raise
            package = types.ModuleType(name)
            package.__path__ = list(spec.submodule_search_locations)
            sys.modules[name] = package
    # executorch is an optional extra (and its backends' own dependencies too): imported on use
    from executorch.backends.openvino.partitioner import OpenvinoPartitioner
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    return OpenvinoPartitioner([CompileSpec("device", b"CPU")])


def tosa_partitioner() -> Any:
    """Arm's TOSAPartitioner for TOSA-1.0+FP (a float program; quantize with Arm's TOSAQuantizer and
    give TOSA-1.0+INT through the Python API for integer programs)."""
    # executorch is an optional extra (and its backends' own dependencies too): imported on use
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
    from executorch.backends.arm.tosa.partitioner import TOSAPartitioner

    return TOSAPartitioner(TosaCompileSpec("TOSA-1.0+FP"))


def ethos_u_partitioner() -> Any:
    """Arm's EthosUPartitioner for an Ethos-U55 with 128 MACs (the program must be quantized with
    Arm's EthosUQuantizer)."""
    # executorch is an optional extra (and its backends' own dependencies too): imported on use
    from executorch.backends.arm.ethosu.compile_spec import EthosUCompileSpec
    from executorch.backends.arm.ethosu.partitioner import EthosUPartitioner

    return EthosUPartitioner(EthosUCompileSpec("ethos-u55-128"))


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
    if not isinstance(cls, type) and callable(cls):
        try:
            cls = cls()
        except Exception as exc:  # a backend whose own dependencies are missing
            raise PartitionerError(
                f"--partitioner {name!r}: {spec}() failed ({type(exc).__name__}: {exc}); install that backend's dependencies"
            ) from exc
    built = as_executorch_partitioner(cls)
    if built is None:
        raise PartitionerError(f"--partitioner {name!r}: {spec} is not an ExecuTorch Partitioner class")
    return built


def as_executorch_partitioner(obj: Any) -> ExecutorchPartitioner | None:
    """`obj` as a texir partitioner when it is an ExecuTorch `Partitioner` class (built with no
    arguments) or instance; None for anything else (executorch not needed to say so)."""
    try:  # executorch is an optional extra: without it nothing is an ExecuTorch partitioner
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
