"""torchvision importable beside the CPU torch wheel, with nothing for the user to call: `import
texir` (or the `.pth` file the Makefile puts in the project's `.venv`) arms a one-shot import hook
that patches torch's operator registry just before torchvision first imports."""

from __future__ import annotations

import glob
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["PTH_LINE", "PTH_NAME", "install_import_hook", "make_torchvision_importable", "write_pth"]

PTH_NAME = "texir-torchvision.pth"
"""The file `make` writes into the `.venv`'s site-packages (sorted after setuptools' `__editable__`
one, which makes texir importable first)."""
PTH_LINE = "import importlib.util; importlib.util.find_spec('texir') and __import__('texir')\n"
"""Its one line: at interpreter start, `import texir` (arming the hook) if texir is installed."""

_TORCHVISION_KEEP: list[Any] = []
"""What keeps torchvision's operator schemas registered (a loaded library path or a Library)."""


def make_torchvision_importable() -> None:
    # torchvision's import registers fake kernels for its operators torchvision::nms and ::qnms,
    # which its native library (_C.so) defines. A torchvision wheel built against another torch
    # (PyPI's 0.28.0 next to the 2.13.0 CPU torch links CUDA libraries: libtorch_cuda.so, ...)
    # cannot load that library, torchvision carries on without its ops, and then the import dies
    # with "operator torchvision::nms does not exist" (transformers imports torchvision when
    # present, so that fails too). Load the library when it loads; otherwise declare the two
    # schemas the import needs. torchvision's detection ops (nms, roi_align) then raise
    # torchvision's own "Couldn't load custom C++ ops" when called; its models (mobilenet, resnet,
    # vit, ...) do not call them. Idempotent; does nothing when torchvision is absent, already
    # imported or importable.
    if _TORCHVISION_KEEP or "torchvision" in sys.modules:
        return
    try:
        spec = importlib.util.find_spec("torchvision")
    except (ImportError, ValueError):
        return
    if spec is None or spec.origin is None:
        return
    import torch  # torchvision imports torch first anyway; `import texir` alone must not load it

    if hasattr(torch.ops.torchvision, "nms"):
        return
    ops: Any = torch.ops  # torch's registry functions are untyped
    library: Any = torch.library
    for path in sorted(glob.glob(os.path.join(os.path.dirname(spec.origin), "_C*.so"))):
        try:
            ops.load_library(path)
        except (OSError, RuntimeError):
            continue
        _TORCHVISION_KEEP.append(path)
        return
    lib = library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _TORCHVISION_KEEP.append(lib)


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    """Runs `make_torchvision_importable` when `torchvision` is first imported, then steps aside
    (finds nothing itself: the usual finders import torchvision)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torchvision":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # one shot, and find_spec("torchvision") below must not recurse
        try:
            make_torchvision_importable()
        except Exception:  # noqa: BLE001 - a hook must never break an import: torchvision's own error then shows
            pass
        return None


def install_import_hook() -> None:
    """Arm the hook (idempotent; nothing to do once torchvision is imported or the patch applied)."""
    if "torchvision" in sys.modules or _TORCHVISION_KEEP:
        return
    if not any(isinstance(f, _BeforeTorchvision) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeTorchvision())


def write_pth(directory: str | os.PathLike[str]) -> str:
    """Write `PTH_NAME` into `directory` (a site-packages folder); returns its path."""
    path = os.path.join(directory, PTH_NAME)
    with open(path, "w", encoding="utf-8") as f:
        f.write(PTH_LINE)
    return path


if __name__ == "__main__":  # `python -m texir._torchvision`: the Makefile's install step
    import sysconfig

    print(write_pth(sysconfig.get_paths()["purelib"]))
