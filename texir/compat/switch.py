"""`install()` / `uninstall()` / `installed()`: ExecuTorch's public lowering names rebound to texir's
in the ExecuTorch modules that hold them, so an unchanged script runs on texir after one line."""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
from collections.abc import Iterator
from typing import Any

from texir.compat import program as facade
from texir.executorch import require_executorch

__all__ = ["install", "installed", "is_installed", "uninstall"]

NAMES = ("to_edge", "to_edge_transform_and_lower")
"""The entry points rebound. ExecuTorch's manager classes are not: its own backends (e.g. the
ExecutorBackend demo) build `EdgeProgramManager(edge_programs=...)` inside `preprocess`, so the
classes must stay ExecuTorch's; the entry points return texir's managers."""
MODULES = (
    "executorch.exir",
    "executorch.exir.program",
    "executorch.exir.backend.backend_api",
    "executorch.export.stages",
)
"""The modules whose global names ExecuTorch's callers (and its recipe pipeline) read; ExecuTorch's
internal `executorch.exir.program._program` keeps its own."""

_saved: dict[tuple[str, str], Any] = {}

FACADE_CALLERS = ("executorch.export.",)
"""ExecuTorch modules that get texir's entry points like a user's code (the recipe pipeline); the
rest of ExecuTorch (e.g. XNNPACK's preprocess, which runs its own `to_edge` with options texir
refuses) keeps ExecuTorch's own."""


def _is_executorch_internal(module_name: str) -> bool:
    if not module_name.startswith("executorch.") or module_name.startswith(FACADE_CALLERS):
        return False
    return not any(part in ("test", "tests") or part.startswith("test_") for part in module_name.split("."))


def _routed(name: str, original: Any) -> Any:
    """texir's `name` for every caller but ExecuTorch's own internals, which get `original`."""
    texir_version = getattr(facade, name)

    @functools.wraps(texir_version)
    def entry(*args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        return (original if _is_executorch_internal(caller) else texir_version)(*args, **kwargs)

    entry.__texir_facade__ = texir_version  # type: ignore[attr-defined]  # marks the routed entry point
    return entry


def is_installed() -> bool:
    return bool(_saved)


def install() -> None:
    """Rebind ExecuTorch's `to_edge` and `to_edge_transform_and_lower` to texir's, in every module listed in `MODULES` that binds them
    (idempotent; `uninstall()` puts ExecuTorch's back)."""
    require_executorch("texir.compat.install")
    if _saved:
        return
    for module_name in MODULES:
        try:  # executorch.export (the recipes) is absent from some executorch builds
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name in NAMES:
            if name in vars(module):
                original = _saved[(module_name, name)] = vars(module)[name]
                setattr(module, name, _routed(name, original))


def uninstall() -> None:
    """Put back every name `install()` rebound."""
    for (module_name, name), value in _saved.items():
        setattr(importlib.import_module(module_name), name, value)
    _saved.clear()


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """`install()` for a `with` block; ExecuTorch's names are back afterwards (unless the facade
    was already installed before the block)."""
    was = is_installed()
    install()
    try:
        yield
    finally:
        if not was:
            uninstall()
