"""Typed errors of the native XNNPACK backend."""

from __future__ import annotations

from texir.lowering.errors import BackendPreprocessError

__all__ = ["XnnpackCheckError", "XnnpackCompileSpecError", "XnnpackPassError", "XnnpackUnsupportedError"]


class XnnpackUnsupportedError(BackendPreprocessError):
    """A node the native XNNPACK backend cannot serialize; raised before any bytes are written."""

    def __init__(self, message: str, *, node: str | None = None, op: str | None = None) -> None:
        super().__init__(message)
        self.node = node
        self.op = op
        self.pass_name: str | None = None
        """The backend pass that raised it (`passes.run_passes` sets it), or None (a visitor did)."""

    def __str__(self) -> str:
        message = super().__str__()
        return message if self.pass_name is None else f"{message} [XNNPACK backend pass {self.pass_name}]"


class XnnpackCheckError(XnnpackUnsupportedError):
    """A graph that ExecuTorch 1.5.1's XNNPACK preprocess refuses with an error (an assert or raise in
    its visitors), refused natively with the same meaning before any bytes are written. `check` is
    ExecuTorch's check (`texir.backends.xnnpack.checks.CHECKS` key; docs/xnnpack-checks.md)."""

    def __init__(self, message: str, *, check: str, node: str | None = None, op: str | None = None) -> None:
        super().__init__(message, node=node, op=op)
        self.check = check


class XnnpackCompileSpecError(BackendPreprocessError):
    """A compile spec the native XNNPACK backend does not know."""


class XnnpackPassError(XnnpackUnsupportedError):
    """A backend pass failed other than by refusing a node, or (TEXIR_VERIFY=1) left a working graph
    that is not well formed: a texir bug, named by its pass."""

    def __init__(self, message: str, *, pass_name: str) -> None:
        super().__init__(message)
        self.pass_name = pass_name
