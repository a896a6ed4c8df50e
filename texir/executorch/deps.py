"""The executorch extra: one check, one error."""

from __future__ import annotations

import importlib
import importlib.metadata

from texir.errors import UnsupportedError

__all__ = ["EXPECTED_VERSION", "ExecutorchUnavailableError", "require_executorch"]

EXPECTED_VERSION = "1.5.1"


class ExecutorchUnavailableError(UnsupportedError):
    """ExecuTorch (the `executorch` extra) is not installed or cannot be imported."""


def require_executorch(feature: str) -> None:
    """Raise `ExecutorchUnavailableError` naming `feature` unless executorch imports."""
    try:
        importlib.import_module("executorch.exir")
    except ImportError as exc:
        raise ExecutorchUnavailableError(
            f"{feature} needs ExecuTorch, which is not importable ({exc}); install the extra: "
            f"pip install 'texir[executorch]' (executorch=={EXPECTED_VERSION})"
        ) from None


def installed_version() -> str | None:
    try:
        return importlib.metadata.version("executorch")
    except importlib.metadata.PackageNotFoundError:
        return None
