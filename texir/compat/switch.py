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
    entry.__texir_original__ = original  # type: ignore[attr-defined]  # what uninstall() puts back
    return entry


def is_installed() -> bool:
    return bool(_saved)


def install() -> None:
    """Rebind ExecuTorch's `to_edge` and `to_edge_transform_and_lower` to texir's, in every module listed in `MODULES` that binds them
    and in every module already imported (outside ExecuTorch's internals) that imported them from
    there: a script or library (optimum-executorch's recipes) that ran `from executorch.exir import
    to_edge_transform_and_lower` before `install()` switches too (idempotent; `uninstall()` puts
    ExecuTorch's back)."""
    require_executorch("texir.compat.install")
    if _saved:
        return
    routed: dict[int, Any] = {}  # id(ExecuTorch's function) -> its routed entry point
    for module_name in MODULES:
        try:  # executorch.export (the recipes) is absent from some executorch builds
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name in NAMES:
            if name in vars(module):
                original = _saved[(module_name, name)] = vars(module)[name]
                entry = routed.setdefault(id(original), _routed(name, original))
                setattr(module, name, entry)
    originals = {id(e.__texir_original__): e for e in routed.values()}
    for module_name, namespace in _importers():
        for name in NAMES:
            entry = originals.get(id(namespace.get(name)))
            if entry is not None:
                _saved[(module_name, name)] = namespace[name]
                namespace[name] = entry


def uninstall() -> None:
    """Put back every name `install()` rebound, and ExecuTorch's own function wherever a module
    imported texir's entry point while it was installed."""
    for (module_name, name), value in _saved.items():
        module = sys.modules.get(module_name)
        if module is not None:
            setattr(module, name, value)
    _saved.clear()
    for _, namespace in _importers():
        for name in NAMES:
            original = getattr(namespace.get(name), "__texir_original__", None)
            if original is not None:
                namespace[name] = original


def _importers() -> list[tuple[str, dict[str, Any]]]:
    """(name, globals) of each imported module outside `MODULES`, ExecuTorch's internals and texir
    that binds one of `NAMES`."""
    found = []
    for module_name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if (module_name in MODULES or _is_executorch_internal(module_name) or module_name.partition(".")[0] == "texir"
                or not isinstance(namespace, dict)
                or not any(name in namespace for name in NAMES)):
            continue
        found.append((module_name, namespace))
    return found


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
