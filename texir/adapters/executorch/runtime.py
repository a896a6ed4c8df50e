"""Running a .pte in ExecuTorch's runtime (the pip `executorch` package's Python bindings)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from texir.adapters.executorch.deps import require_executorch
from texir.errors import TexirError

__all__ = ["RuntimeRunError", "run_pte"]


class RuntimeRunError(TexirError):
    """ExecuTorch's runtime could not load or run a .pte."""


def run_pte(data: bytes, inputs: Sequence[torch.Tensor], *, method: str = "forward") -> list[torch.Tensor]:
    """Load `data` in ExecuTorch's runtime and run `method` once on `inputs` (flat tensors)."""
    require_executorch("running a .pte")
    from executorch.runtime import Runtime

    try:
        loaded = Runtime.get().load_program(data).load_method(method)
    except Exception as exc:  # the runtime reports load failures as RuntimeError with an error code
        raise RuntimeRunError(f"ExecuTorch's runtime could not load method {method!r}: {exc}") from exc
    if loaded is None:
        raise RuntimeRunError(f"the program has no method {method!r}")
    try:
        return [t for t in loaded.execute(list(inputs)) if isinstance(t, torch.Tensor)]
    except Exception as exc:
        raise RuntimeRunError(f"ExecuTorch's runtime failed running {method!r}: {exc}") from exc
