"""The operators the target ExecuTorch runtime registers: a `.pte` calling any other fails to load
(OperatorMissing) on the device, so the emitter refuses it up front, naming the node."""

from __future__ import annotations

import functools
import json
from importlib import resources

from texir.emit.common import EmitError

__all__ = ["MissingKernelError", "RUNTIME", "operator_name", "runtime_operators"]

RUNTIME = "executorch==1.5.1"
_TABLE = "executorch_1_5_1_operators.json"


class MissingKernelError(EmitError):
    """The program calls an operator the target ExecuTorch runtime has no kernel for."""


@functools.cache
def runtime_operators() -> frozenset[str]:
    """Registered operator names (``aten::add.out``, ``aten::copy_``), checked in from the
    ExecuTorch 1.5.1 runtime's registry (tests/test_runtime_ops.py keeps the two equal)."""
    text = resources.files("texir.emit").joinpath(_TABLE).read_text(encoding="utf-8")
    return frozenset(json.loads(text)["operators"])


def operator_name(name: str, overload: str) -> str:
    """The registry's spelling of a `.pte` Operator entry."""
    return f"{name}.{overload}" if overload else name
