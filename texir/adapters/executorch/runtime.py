"""Running a `.pte`, and checking a `.bpte`'s cases, in ExecuTorch's runtime (the pip package's bindings)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import torch

from texir.adapters.executorch.deps import require_executorch
from texir.errors import TexirError
from texir.serialize import bpte

__all__ = ["CaseResult", "RuntimeRunError", "run_pte", "verify_bpte"]


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


class CaseResult(msgspec.Struct, frozen=True, kw_only=True):
    """How one bundled case fared in ExecuTorch's runtime."""

    method: str
    case: int
    ok: bool
    """The method ran on the case's inputs and its outputs matched the expected ones within tolerance."""
    outputs: int = 0
    """Number of outputs the method returned."""
    error: str = ""
    """Why not, as the runtime said it (empty when ok)."""


def verify_bpte(data: bytes, *, rtol: float = 1e-5, atol: float = 1e-8) -> tuple[CaseResult, ...]:
    """Load the bundled program `data` in ExecuTorch's runtime and check every case: the runtime
    loads the case's inputs, runs its method and compares the outputs with the expected ones
    (|out - expected| <= atol + rtol * |expected|). Each case runs on a fresh load, from the
    program's initial state, as `texir.adapters.bundle.eager_case` computes its outputs (a method
    that updates buffers would otherwise see the state the previous case left). Cases without
    expected outputs are skipped."""
    require_executorch("verifying a .bpte")
    from executorch.extension.pybindings import portable_lib

    bundle = bpte.read_bundle(data)
    raw = bytes(data)

    def load() -> Any:
        try:
            return portable_lib._load_bundled_program_from_buffer(raw)
        except Exception as exc:  # the runtime reports load failures as RuntimeError with an error code
            raise RuntimeRunError(f"ExecuTorch's runtime could not load the bundled program: {exc}") from exc

    load()
    results = []
    for suite in bundle.method_test_suites:
        for k, case in enumerate(suite.test_cases):
            if not case.expected_outputs:
                continue
            try:
                outputs = load().verify_result_with_bundled_expected_output(suite.method_name, k, rtol, atol)
            except RuntimeRunError:
                raise
            except Exception as exc:  # a mismatch or a failed run: RuntimeError with the status
                results.append(CaseResult(method=suite.method_name, case=k, ok=False, error=str(exc)))
                continue
            results.append(CaseResult(method=suite.method_name, case=k, ok=True, outputs=len(outputs)))
    return tuple(results)
