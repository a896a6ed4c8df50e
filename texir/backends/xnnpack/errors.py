"""Typed errors of the native XNNPACK backend."""

from __future__ import annotations

from texir.lowering.errors import BackendPreprocessError

__all__ = ["XnnpackCompileSpecError", "XnnpackUnsupportedError"]


class XnnpackUnsupportedError(BackendPreprocessError):
    """A node the native XNNPACK backend cannot serialize; raised before any bytes are written."""

    def __init__(self, message: str, *, node: str | None = None, op: str | None = None) -> None:
        super().__init__(message)
        self.node = node
        self.op = op


class XnnpackCompileSpecError(BackendPreprocessError):
    """A compile spec the native XNNPACK backend does not know."""
