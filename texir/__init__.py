"""texir: a typed, immutable reimplementation of ExecuTorch's backend-delegation pipeline."""

from texir.errors import TexirError

__version__ = "0.1.0"
__all__ = ["TexirError", "__version__"]
