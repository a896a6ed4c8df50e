"""Backend protocol and the process-wide registry of backends, looked up by backend id."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

import msgspec

from texir.ir import Blob, CompileSpec, DebugHandleEntry, NamedDataEntry, Program
from texir.lowering.errors import BackendPreprocessError, BackendRegistrationError, UnknownBackendError

__all__ = [
    "Backend",
    "PreprocessResult",
    "backend_registered",
    "get_backend",
    "check_result",
    "named_data_entry",
    "register_backend",
    "registered_implicitly",
    "registered_backends",
]

_SHA256 = re.compile(r"[0-9a-f]{64}")


class PreprocessResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a backend returns for one partition: its compiled blob and, optionally, which
    backend identifiers implement which debug handles."""

    processed_bytes: bytes
    debug_handle_map: tuple[DebugHandleEntry, ...] | None = None
    named_data: tuple[NamedDataEntry, ...] = ()
    """Payloads stored by key next to the blob (`named_data_entry`); keys unique."""
    delegate_info: str | None = None
    """Anything else for tools, as JSON text (`LoweredBackendModule.delegate_info`); not in the .pte."""


def named_data_entry(key: str, data: bytes | Blob, *, alignment: int = 1) -> NamedDataEntry:
    """A named-data entry for `PreprocessResult.named_data` (hashes the payload once)."""
    blob = data if isinstance(data, Blob) else Blob(data)
    if alignment < 1:
        raise BackendPreprocessError(f"named data {key!r}: alignment must be a positive integer, got {alignment}")
    return NamedDataEntry(key=key, sha256=blob.digest(), nbytes=blob.nbytes, alignment=alignment, data=blob)


@runtime_checkable
class Backend(Protocol):
    """A backend compiles a delegated sub-program into opaque bytes. `preprocess` must be pure."""

    def preprocess(self, program: Program, compile_specs: Sequence[CompileSpec], /) -> PreprocessResult: ...


_REGISTRY: dict[str, Backend] = {}
_IMPLICIT: set[str] = set()
"""Ids whose backend texir registered by itself (`register_backend(..., implicit=True)`)."""


def _check_registration(backend_id: object, backend: object) -> None:
    if not isinstance(backend_id, str) or not backend_id:
        raise BackendRegistrationError(f"backend id must be a non-empty string, got {backend_id!r}")
    if isinstance(backend, type):
        raise BackendRegistrationError(
            f"backend '{backend_id}': register an instance of {backend.__name__}, not the class"
        )
    if not isinstance(backend, Backend):
        raise BackendRegistrationError(
            f"backend '{backend_id}': {type(backend).__name__} has no preprocess(program, compile_specs) "
            "method; register an object implementing texir.lowering.Backend"
        )


def register_backend(backend_id: str, backend: Backend, *, replace: bool = False, implicit: bool = False) -> None:
    """Make `backend` available under `backend_id`. Re-registering an id needs `replace=True`;
    misuse is a `BackendRegistrationError`. `implicit`: texir registers it by itself, on a
    partitioner's behalf (ExecuTorch's bridge registers ExecuTorch's backend for its partitioner):
    `texir.lower` then still gives texir's native backend to texir's own partitioner of that id,
    as where nothing is registered (`registered_implicitly`)."""
    _check_registration(backend_id, backend)
    existing = _REGISTRY.get(backend_id)
    if existing is not None and existing is not backend and not replace:
        raise BackendRegistrationError(
            f"backend '{backend_id}' is already registered ({existing!r}); pass replace=True to override it"
        )
    _REGISTRY[backend_id] = backend
    if implicit:
        _IMPLICIT.add(backend_id)
    else:
        _IMPLICIT.discard(backend_id)


def registered_implicitly(backend_id: str) -> bool:
    """Whether the backend registered under `backend_id` is one texir registered by itself
    (`register_backend(..., implicit=True)`), not one the user chose."""
    return backend_id in _IMPLICIT and backend_id in _REGISTRY


@contextlib.contextmanager
def backend_registered(backend_id: str, backend: Backend) -> Iterator[Backend]:
    """`backend` registered under `backend_id` for the `with` block only; whatever was registered
    there before (or nothing) is back afterwards, exceptions included."""
    _check_registration(backend_id, backend)
    previous = _REGISTRY.get(backend_id)
    was_implicit = backend_id in _IMPLICIT
    _REGISTRY[backend_id] = backend
    _IMPLICIT.discard(backend_id)
    try:
        yield backend
    finally:
        if previous is None:
            _REGISTRY.pop(backend_id, None)
        else:
            _REGISTRY[backend_id] = previous
        if was_implicit:
            _IMPLICIT.add(backend_id)


def registered_backends() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


_HINTS: dict[str, str] = {
    "XnnpackBackend": "; for texir's native XNNPACK backend: with texir.backends.xnnpack.registered(): ... "
    "(texir.lower registers it itself for texir's XNNPACK partitioner)",
}
"""Backend ids whose usual registration step an UnknownBackendError names."""


def get_backend(backend_id: str, *, tag: str | None = None) -> Backend:
    backend = _REGISTRY.get(backend_id)
    if backend is None:
        where = f" (partition '{tag}')" if tag is not None else ""
        known = ", ".join(registered_backends()) or "none"
        raise UnknownBackendError(
            f"backend '{backend_id}'{where} is not registered (known: {known}); "
            "call texir.lowering.register_backend first (texir's demo and reference backends "
            f"register when texir.backends is imported){_HINTS.get(backend_id, '')}"
        )
    return backend


def check_result(backend_id: str, result: object, tag: str | None = None) -> PreprocessResult:
    """`result` if it is a well-formed PreprocessResult (named data keys unique, each entry's
    `sha256` its payload's digest in hex, the IR's content address), else a typed error."""
    where = f" for partition '{tag}'" if tag is not None else ""
    if not isinstance(result, PreprocessResult):
        raise BackendPreprocessError(
            f"backend '{backend_id}' preprocess returned {type(result).__name__}{where}; "
            "return a texir.lowering.PreprocessResult"
        )
    seen: set[str] = set()
    for entry in result.named_data:
        if entry.key in seen:
            raise BackendPreprocessError(
                f"backend '{backend_id}' returned named data key {entry.key!r} twice{where}; keys must be unique"
            )
        if _SHA256.fullmatch(entry.sha256) is None:
            raise BackendPreprocessError(
                f"backend '{backend_id}' returned named data {entry.key!r}{where} with sha256={entry.sha256[:80]!r}, "
                "not a SHA-256 in lowercase hex; set it to the payload's digest (texir.lowering.named_data_entry "
                "computes it), whatever the key"
            )
        seen.add(entry.key)
    return result
