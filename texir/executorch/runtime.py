"""Running a `.pte`, and checking a `.bpte`'s cases, in ExecuTorch's runtime (the pip package's bindings)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import torch

from texir.backends.external_data import external_data_keys
from texir.executorch.deps import require_executorch
from texir.errors import TexirError
from texir.serialize import bpte
from texir.serialize.pte.codec import loads as loads_pte

__all__ = ["CaseResult", "LoadedMethod", "RuntimeRunError", "load_method", "run_pte", "runtime", "verify_bpte"]


class RuntimeRunError(TexirError):
    """ExecuTorch's runtime could not load or run a .pte."""


class LoadedMethod:
    """A method loaded in ExecuTorch's runtime together with the program it came from.

    The runtime's method does not keep its program alive, and the program owns the memory arenas
    the method runs in: a method whose program was garbage-collected reads freed memory (wrong
    input counts, error 0x12, or a crash). Holding both here makes that impossible."""

    def __init__(self, program: Any, method: Any) -> None:
        self.program = program
        self._method = method

    def execute(self, inputs: Sequence[Any]) -> Any:
        """Run the method once on `inputs`; the runtime's outputs as it returns them."""
        return self._method.execute(inputs)


def runtime() -> Any:
    """ExecuTorch's runtime (`executorch.runtime.Runtime.get()`) with the quantized kernels registered.

    The pip wheel registers the `quantized_decomposed::*.out` kernels only once
    `executorch.kernels.quantized` is imported; before that a quantized program fails to load with
    "missing operator". Importing it first gives every caller the same operator registry, whatever the
    process imported before."""
    require_executorch("running a .pte")
    # executorch is an optional extra: imported on use
    import executorch.kernels.quantized  # noqa: F401  (registers the quantized kernels with the runtime)
    from executorch.runtime import Runtime

    return Runtime.get()


def load_method(
    source: bytes | str | Path, method: str = "forward", *, data_path: str | Path | None = None
) -> LoadedMethod:
    """Load `method` of the `.pte` `source` (bytes or a path; `data_path`: its `.ptd`) in
    ExecuTorch's runtime, kept alive with its program. A `.pte` that keeps weights in a `.ptd` and is
    given none is refused first: ExecuTorch 1.5.1's XNNPACK delegate crashes the process on it."""
    if data_path is None:
        _refuse_missing_data(source, method)
    try:
        program = runtime().load_program(source, data_path=data_path)
        loaded = program.load_method(method)
    except Exception as exc:  # the runtime reports load failures as RuntimeError with an error code
        raise RuntimeRunError(f"ExecuTorch's runtime could not load method {method!r}: {exc}") from exc
    if loaded is None:
        raise RuntimeRunError(f"the program has no method {method!r}")
    return LoadedMethod(program, loaded)


_LARGEST_PRECHECKED = 256 << 20
"""A `.pte` whose weights live in a `.ptd` is small; a larger file holds its weights and is not read
twice just to check (the runtime maps it)."""


def _refuse_missing_data(source: bytes | str | Path, method: str) -> None:
    if isinstance(source, bytes):
        data = source
    else:
        path = Path(source)
        if not path.is_file() or path.stat().st_size > _LARGEST_PRECHECKED:
            return  # the runtime says what is wrong with a missing file
        data = path.read_bytes()
    try:
        keys = external_data_keys(loads_pte(data), method)
    except TexirError:
        return  # a file texir does not read: the runtime says what is wrong with it
    if keys:
        raise RuntimeRunError(
            f"the program keeps {len(keys)} weights outside the .pte (e.g. {keys[0]!r}); pass "
            "data_path= the .ptd written beside it"
        )


def run_pte(data: bytes, inputs: Sequence[torch.Tensor], *, method: str = "forward") -> list[torch.Tensor]:
    """Load `data` in ExecuTorch's runtime and run `method` once on `inputs` (flat tensors)."""
    loaded = load_method(data, method)
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
    from executorch.extension.pybindings import portable_lib  # executorch is an optional extra: imported on use

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
