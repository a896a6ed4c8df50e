"""texir: a typed, immutable reimplementation of ExecuTorch's backend-delegation pipeline.

`texir.lower(program_or_exported_program, partitioners)` is `texir.orchestrate.lower`, loaded on
first use: importing texir (or any layer below the adapters) loads no torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from texir._torchvision import install_import_hook
from texir.errors import TexirError

if TYPE_CHECKING:
    from texir.orchestrate import lower as lower

install_import_hook()  # torchvision beside the CPU torch wheel imports (see texir._torchvision): no torch loaded here

__version__ = "0.1.0"
__all__ = ["TexirError", "__version__", "lower"]


def __getattr__(name: str) -> Any:
    if name == "lower":
        # the orchestration layer imports torch (~2 s): only a caller of texir.lower pays for it
        from texir.orchestrate import lower

        return lower
    raise AttributeError(f"module 'texir' has no attribute {name!r}")
