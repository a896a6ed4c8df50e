"""ExecuTorch backends (`BackendDetails` subclasses such as XnnpackBackend) as texir backends."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import msgspec

from texir.executorch.deps import installed_version, require_executorch
from texir.executorch.edge_program import to_edge_exported_program
from texir.ir import CompileSpec, DebugHandleEntry, NamedDataEntry, Program
from texir.ir.blob import Blob, digest_all
from texir.lowering.backend import PreprocessResult, get_backend, named_data_entry, register_backend
from texir.errors import UnsupportedError
from texir.lowering.errors import BackendPreprocessError, UnknownBackendError

__all__ = [
    "ExecutorchBackend",
    "compile_spec_from_executorch",
    "delegate_info_from_executorch",
    "executorch_backend_class",
    "named_data_entries",
    "register_executorch_backend",
]

_ADAPTER_VERSION = 3  # 3: the result keeps _delegate_info_meta
"""Bump when what `preprocess` is shown changes (cached results then miss)."""


def _subclasses(cls: type) -> list[type]:
    found: list[type] = []
    sub: type
    for sub in cls.__subclasses__():
        found.append(sub)
        found += _subclasses(sub)
    return found


def executorch_backend_class(backend_id: str) -> type | None:
    """The imported ExecuTorch backend class named `backend_id` (how ExecuTorch finds it too), or None."""
    require_executorch(f"the ExecuTorch backend {backend_id!r}")
    # executorch is an optional extra: imported on use
    from executorch.exir.backend.backend_details import BackendDetails

    matches = sorted(
        {c for c in _subclasses(BackendDetails) if c.__name__ == backend_id},
        key=lambda c: f"{c.__module__}.{c.__qualname__}",
    )
    return matches[0] if matches else None


class ExecutorchBackend:
    """A texir backend that runs an ExecuTorch backend's `preprocess` on the edge form of the
    sub-program and translates its result (blob, debug handle map, named data)."""

    def __init__(self, backend_cls: type) -> None:
        self.backend_cls = backend_cls
        self.backend_id = backend_cls.__name__

    def __repr__(self) -> str:
        return f"ExecutorchBackend({self.backend_cls.__module__}.{self.backend_cls.__qualname__})"

    @property
    def cache_version(self) -> str:
        """What a cached result depends on besides its input: ExecuTorch's version and the class."""

        cls = self.backend_cls
        return f"executorch=={installed_version()} {cls.__module__}.{cls.__qualname__} adapter={_ADAPTER_VERSION}"

    def preprocess(self, program: Program, compile_specs: Sequence[CompileSpec], /) -> PreprocessResult:
        # executorch is an optional extra: imported on use
        from executorch.exir.backend.compile_spec_schema import CompileSpec as EtCompileSpec

        ep = to_edge_exported_program(program)
        for node in ep.graph_module.graph.nodes:
            if node.op == "output":  # a delegated sub-program returns a flat list under ExecuTorch
                node.args = (list(node.args[0]),)
        ep.graph_module.recompile()
        specs = [EtCompileSpec(key=s.key, value=bytes(s.value)) for s in compile_specs]
        result = self.backend_cls.preprocess(ep, specs)  # type: ignore[attr-defined]  # BackendDetails API
        return _translate(self.backend_id, result)


def _translate(backend_id: str, result: Any) -> PreprocessResult:
    processed = getattr(result, "processed_bytes", None)
    if not isinstance(processed, (bytes, bytearray)):
        raise BackendPreprocessError(
            f"ExecuTorch backend {backend_id!r} returned {type(result).__name__} without processed_bytes; "
            "preprocess must return executorch.exir.backend.backend_details.PreprocessResult"
        )
    handle_map = None
    raw_map = getattr(result, "debug_handle_map", None)
    if raw_map:
        handle_map = tuple(
            DebugHandleEntry(identifier=key, debug_handles=tuple(int(h) for h in handles))
            for key, handles in raw_map.items()
        )
    named = named_data_entries(backend_id, getattr(result, "data_store_output", None))
    info = delegate_info_from_executorch(
        f"ExecuTorch backend {backend_id!r} (PreprocessResult._delegate_info_meta)",
        getattr(result, "_delegate_info_meta", None),
    )
    return PreprocessResult(
        processed_bytes=bytes(processed), debug_handle_map=handle_map, named_data=named, delegate_info=info
    )


_JSON_SCALARS = (str, int, float, bool, type(None))


def _json_problem(value: object, where: str) -> str | None:
    """Where `value` is not a JSON value (None, bool, int, finite float, str, list/tuple, dict
    with str keys) and what is there, or None when it is one."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where} is {value!r}"
    if isinstance(value, _JSON_SCALARS):
        return None
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            problem = _json_problem(item, f"{where}[{i}]")
            if problem is not None:
                return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{where} has the key {key!r} ({type(key).__name__}, not str)"
            problem = _json_problem(item, f"{where}[{key!r}]")
            if problem is not None:
                return problem
        return None
    return f"{where} is a {type(value).__module__}.{type(value).__qualname__}"


def delegate_info_from_executorch(owner: str, value: object) -> str | None:
    """ExecuTorch's `_delegate_info_meta` value as texir's `delegate_info` (JSON text, sorted keys),
    None for None. texir's lowered module is data (snapshots, the preprocess cache, worker
    processes), so the value must be a JSON value; anything else is a typed error naming `owner`.
    Tuples come back as lists."""
    if value is None:
        return None
    problem = _json_problem(value, "the value")
    if problem is not None:
        raise BackendPreprocessError(
            f"{owner}: {problem}, which texir cannot keep: texir keeps this metadata in its IR, which "
            "holds JSON values only (None, bool, int, finite float, str, lists, dicts with str keys); "
            "have the backend attach such a value (e.g. a dict of its fields), or None"
        )
    return msgspec.json.encode(value, order="sorted").decode()


def named_data_entries(backend_id: str, store: Any) -> tuple[NamedDataEntry, ...]:
    """ExecuTorch's `NamedDataStoreOutput` (or None) as texir's named-data entries, in its order."""
    if store is None:
        return ()
    if store.external_data:
        files = ", ".join(sorted(store.external_data))
        raise BackendPreprocessError(
            f"ExecuTorch backend {backend_id!r} stored named data for external files ({files}); texir "
            "writes named data into the .pte only: configure the backend to keep its data in the program"
        )
    items = [(key, Blob(bytes(store.buffers[e.buffer_index])), e.alignment) for key, e in store.pte_data.items()]
    digest_all([blob for _, blob, _ in items])  # a partition's weights, hashed in parallel
    return tuple(named_data_entry(key, blob, alignment=alignment) for key, blob, alignment in items)


def register_executorch_backend(backend_id: str) -> None:
    """Make the ExecuTorch backend `backend_id` available to texir lowering under the same id
    (nothing to do when a texir backend is already registered under it), as an implicit
    registration: texir's own partitioner of that id still gets texir's backend."""
    try:
        get_backend(backend_id)
        return
    except UnknownBackendError:
        pass
    cls = executorch_backend_class(backend_id)
    if cls is None:
        raise UnknownBackendError(
            f"backend {backend_id!r} is neither a registered texir backend nor an imported ExecuTorch backend "
            "(a BackendDetails subclass of that name); import the module defining it, or register a texir "
            "backend with texir.lowering.register_backend"
        )
    register_backend(backend_id, ExecutorchBackend(cls), implicit=True)


def compile_spec_from_executorch(owner: str, spec: Any) -> CompileSpec:
    """ExecuTorch's `CompileSpec` (`key`, `value`) as texir's. ExecuTorch's type says bytes, but its
    `to_backend` also takes a `str` value (its tests pass one) and then its serializer fails; texir
    keeps the value's UTF-8 bytes (a deliberate difference, docs/compat.md). `owner` names who
    gave the spec (a partition, a lowered module) for the error."""
    value = spec.value
    if isinstance(value, str):
        value = value.encode()
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise UnsupportedError(
            f"{owner}: compile spec {spec.key!r} has a {type(value).__name__} value; "
            "give ExecuTorch's CompileSpec a bytes (or str) value"
        )
    return CompileSpec(key=str(spec.key), value=bytes(value))
