"""Deterministic, versioned JSON and msgpack snapshots of Programs and lowered backend modules.

A snapshot is an envelope ``{"format": "texir-snapshot", "schema_version": [major, minor],
"kind": "program" | "lowered_module", <kind>: ...}`` encoded by one module-level msgspec encoder per
format (``order="deterministic"``; struct fields are written in declaration order), so the same value
gives the same bytes in every process. The format is detected on load: JSON starts with ``{``, which
is never the first byte of a msgpack envelope (a fixmap, 0x80-0x8f).

Tensor payloads (`Blob`) are base64 strings in JSON and msgpack extension objects (type code 1) in
msgpack; an extension rather than a plain ``bin`` lets the decoder hand each payload over as a view of
the input buffer instead of a copy (when the input is immutable: ``bytes``, a read-only memoryview or
an ``mmap`` opened read-only).

Decoding tries the whole envelope as a program snapshot in one pass; when that fails (a lowered
module, a foreign or wrong-version file, corrupt data) it reads the small header first (the payload
skipped as raw bytes), so a foreign or wrong-version file is rejected with a clear message before the
payload is decoded. Every decoding failure is a `SnapshotError` naming the bad field
(``$.program.graph.nodes[3].args[0]``).
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Final

import msgspec

from texir._io import atomic_write, gc_paused
from texir.errors import IRError, SnapshotError
from texir.ir.canonical import drop_stack_traces
from texir.ir.blob import Blob, resolve_digests
from texir.ir.verify import check_indices
from texir.serialize import legacy_v1
from texir.serialize.snapshot_wire import (
    FORMAT_MARKER,
    JSON_ENCODER,
    JSON_ENVELOPE,
    JSON_MODULE,
    JSON_MODULE_V1,
    JSON_PROGRAM,
    JSON_PROGRAM_V1,
    MSGPACK_ENCODER,
    MSGPACK_ENVELOPE,
    MSGPACK_MODULE,
    MSGPACK_MODULE_V1,
    MSGPACK_PROGRAM,
    MSGPACK_PROGRAM_V1,
    LoweredModuleSnapshot,
    ProgramSnapshot,
    SnapshotFormat,
    SnapshotVersionError,
    check_header,
    check_version,
    decode_payload,
    detect_format,
    immutable,
    read_header,
)
from texir.ir.types import SCHEMA_VERSION, Graph, LoweredBackendModule, NamedLoweredModule, Program, StateEntry

__all__ = [
    "FORMAT_MARKER",
    "MSGPACK_SUFFIXES",
    "SCHEMA_VERSION",
    "LoweredModuleSnapshot",
    "ProgramSnapshot",
    "SnapshotFormat",
    "SnapshotVersionError",
    "atomic_write_bytes",
    "detect_format",
    "dump",
    "dumps",
    "dumps_lowered_module",
    "dumps_value",
    "format_for_path",
    "load",
    "loads",
    "loads_lowered_module",
    "loads_value",
    "strip_data",
]

# --------------------------------------------------------------------------------------------------
# Stripping payloads


def _strip_module(module: LoweredBackendModule) -> LoweredBackendModule:
    original = strip_data(module.original_program)
    named = module.named_data
    if any(entry.data is not None for entry in named):
        named = tuple(msgspec.structs.replace(entry, data=None) for entry in named)
    if original is module.original_program and named is module.named_data:
        return module
    return msgspec.structs.replace(module, original_program=original, named_data=named)


def strip_data(program: Program) -> Program:
    """`program` with every tensor payload dropped (metadata, sha256 and nbytes kept), including
    the state of lowered modules' original programs and their named data. Returns `program` itself when it holds none.
    Delegate `processed_bytes` are kept as they are: they are the backend's output, not state."""
    state = program.state
    if any(entry.value.data is not None for entry in state):
        state = tuple(
            entry
            if entry.value.data is None
            else StateEntry(target=entry.target, value=msgspec.structs.replace(entry.value, data=None))
            for entry in state
        )
    lowered = program.lowered_modules
    if lowered:
        stripped = tuple(
            NamedLoweredModule(name=m.name, module=_strip_module(m.module)) for m in lowered
        )
        if any(a.module is not b.module for a, b in zip(stripped, lowered)):
            lowered = stripped
    if state is program.state and lowered is program.lowered_modules:
        return program
    return msgspec.structs.replace(program, state=state, lowered_modules=lowered)


# --------------------------------------------------------------------------------------------------
# Encoding


def _encode(envelope: ProgramSnapshot | LoweredModuleSnapshot, format: SnapshotFormat) -> bytes:
    if format == "json":
        encoder: msgspec.json.Encoder | msgspec.msgpack.Encoder = JSON_ENCODER
    elif format == "msgpack":
        encoder = MSGPACK_ENCODER
    else:
        raise SnapshotError(f"unknown snapshot format {format!r}; use 'json' or 'msgpack'")
    try:
        return encoder.encode(envelope)
    except RecursionError:
        raise SnapshotError("cannot encode: the program's arguments are nested too deeply") from None
    except (TypeError, ValueError, OverflowError, NotImplementedError) as exc:
        raise SnapshotError(f"cannot encode the program: {exc}") from None


def dumps(
    program: Program,
    *,
    format: SnapshotFormat = "json",
    include_data: bool = False,
    include_stack_traces: bool = False,
) -> bytes:
    """The snapshot of `program` as bytes. Without `include_data`, tensor payloads are left out
    (each tensor keeps its metadata, sha256 and nbytes); without `include_stack_traces`, stack
    traces are (they hold machine paths). Same program, same bytes, in any process and directory."""
    if not include_stack_traces:
        program = drop_stack_traces(program)
    if not include_data:
        program = strip_data(program)
    return _encode(ProgramSnapshot(schema_version=SCHEMA_VERSION, program=program), format)


def dumps_lowered_module(
    module: LoweredBackendModule,
    *,
    format: SnapshotFormat = "json",
    include_data: bool = False,
    include_stack_traces: bool = False,
) -> bytes:
    """The snapshot of a lowered backend module (its original program's payloads only with
    `include_data`, its stack traces only with `include_stack_traces`; `processed_bytes` always)."""
    if not include_stack_traces:
        module = msgspec.structs.replace(module, original_program=drop_stack_traces(module.original_program))
    if not include_data:
        module = _strip_module(module)
    return _encode(LoweredModuleSnapshot(schema_version=SCHEMA_VERSION, module=module), format)


def dumps_value(
    value: Program | LoweredBackendModule,
    *,
    format: SnapshotFormat = "json",
    include_data: bool = False,
    include_stack_traces: bool = False,
) -> bytes:
    """`dumps` or `dumps_lowered_module`, by the type of `value`, with real digests in place of
    deferred ones (`texir.ir.blob.deferred_blob`: hashed now if no writer has yet). `dumps` itself
    leaves them as they are: in-process keys need no hashing."""
    if isinstance(value, LoweredBackendModule):
        return bytes(resolve_digests(dumps_lowered_module(
            value, format=format, include_data=include_data, include_stack_traces=include_stack_traces
        )))
    if isinstance(value, Program):
        return bytes(resolve_digests(
            dumps(value, format=format, include_data=include_data, include_stack_traces=include_stack_traces)))
    raise SnapshotError(
        f"cannot snapshot a {type(value).__name__}; pass a Program or a LoweredBackendModule"
    )


def dump(
    value: Program | LoweredBackendModule,
    path: str | os.PathLike[str],
    *,
    format: SnapshotFormat | None = None,
    include_data: bool = False,
    include_stack_traces: bool = False,
) -> Path:
    """Write the snapshot of `value` to `path` atomically (a temporary file in the same directory,
    then `os.replace`): on any failure no partial file is left. `format` defaults to msgpack for
    ``.msgpack``/``.mpk``/``.texir`` paths and JSON otherwise. Returns the path."""
    target = Path(path)
    fmt: SnapshotFormat = format if format is not None else format_for_path(target)
    data = dumps_value(value, format=fmt, include_data=include_data, include_stack_traces=include_stack_traces)
    atomic_write_bytes(target, data)
    return target


MSGPACK_SUFFIXES: Final = (".msgpack", ".mpk", ".texir")


def format_for_path(path: str | os.PathLike[str]) -> SnapshotFormat:
    """The snapshot format a file name asks for: msgpack for `MSGPACK_SUFFIXES`, else JSON."""
    return "msgpack" if Path(path).suffix.lower() in MSGPACK_SUFFIXES else "json"


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` via a temporary file in the same directory and `os.replace`."""
    atomic_write(path, [data], error=SnapshotError)


# --------------------------------------------------------------------------------------------------
# Decoding


def _check_tables(graph: Graph, where: str) -> None:
    # Table indices (`meta_id`, provenance locations) must resolve, or the Program would fail later
    # far from the bad input.
    try:
        check_indices(graph, where)
    except IRError as exc:
        raise SnapshotError(f"invalid snapshot: {exc}") from None
    for sub in graph.subgraphs:
        _check_tables(sub.graph, f"{where}.subgraphs[{sub.name!r}].graph")


def _check_payloads(program: Program, where: str) -> None:
    # Every graph's tables must resolve. A payload whose length disagrees with nbytes is corrupt.
    # (Hashes are not recomputed here: that would read every byte; `Blob.digest()` is there for
    # callers who want it.)
    _check_tables(program.graph, f"{where}.graph")
    for i, entry in enumerate(program.state):
        value = entry.value
        if value.data is not None and value.data.nbytes != value.nbytes:
            raise SnapshotError(
                f"invalid snapshot: at `{where}.state[{i}].value.data` ({entry.target!r}) the payload "
                f"holds {value.data.nbytes} bytes but nbytes says {value.nbytes}"
            )
    for j, named in enumerate(program.lowered_modules):
        _check_payloads(
            named.module.original_program, f"{where}.lowered_modules[{j}].module.original_program"
        )


def loads_value(data: bytes | bytearray | memoryview) -> Program | LoweredBackendModule:
    """Decode any texir snapshot (format detected): a Program or a LoweredBackendModule."""
    try:
        buf = immutable(data)
    except TypeError as exc:
        raise SnapshotError(f"cannot read a snapshot from {type(data).__name__}: {exc}") from None
    fmt = detect_format(buf)
    # Fast path: decode the whole envelope as a program snapshot in one pass. Anything unexpected
    # (another kind, another version, bad data) falls back to reading the header first, which
    # gives the precise message.
    try:
        with gc_paused():
            envelope = (JSON_ENVELOPE if fmt == "json" else MSGPACK_ENVELOPE).decode(buf)
    except (msgspec.DecodeError, RecursionError, ValueError, TypeError, OverflowError, MemoryError):
        envelope = None  # msgspec.ValidationError and _BadExtension are ValueErrors
    if envelope is not None and envelope.schema_version[0] == SCHEMA_VERSION[0]:
        check_version(envelope.schema_version)
        _check_payloads(envelope.program, "$.program")
        return envelope.program
    header = read_header(buf, fmt)
    check_header(header)
    legacy = tuple(header.schema_version) in legacy_v1.LEGACY_VERSIONS
    json = fmt == "json"
    if header.kind == "program":
        if not header.program:
            raise SnapshotError("invalid snapshot: the envelope has no `$.program`")
        if legacy:
            old = decode_payload(JSON_PROGRAM_V1 if json else MSGPACK_PROGRAM_V1, header.program, "program")
            program = legacy_v1.upgrade_program(old)
        else:
            program = decode_payload(JSON_PROGRAM if json else MSGPACK_PROGRAM, header.program, "program")
        _check_payloads(program, "$.program")
        return program
    if header.kind == "lowered_module":
        if not header.module:
            raise SnapshotError("invalid snapshot: the envelope has no `$.module`")
        if legacy:
            old_module = decode_payload(JSON_MODULE_V1 if json else MSGPACK_MODULE_V1, header.module, "module")
            module = legacy_v1.upgrade_module(old_module)
        else:
            module = decode_payload(JSON_MODULE if json else MSGPACK_MODULE, header.module, "module")
        _check_payloads(module.original_program, "$.module.original_program")
        return module
    raise SnapshotError(
        f"invalid snapshot: unknown `$.kind` {header.kind!r} (expected 'program' or 'lowered_module')"
    )


def loads(data: bytes | bytearray | memoryview) -> Program:
    """Decode a Program snapshot written by `dumps` (JSON or msgpack, detected). Corrupt, truncated,
    foreign or wrong-version input raises `SnapshotError` naming the bad field."""
    value = loads_value(data)
    if not isinstance(value, Program):
        raise SnapshotError(
            "this snapshot holds a lowered backend module, not a program; use loads_lowered_module"
        )
    return value


def loads_lowered_module(data: bytes | bytearray | memoryview) -> LoweredBackendModule:
    """Decode a snapshot written by `dumps_lowered_module`."""
    value = loads_value(data)
    if not isinstance(value, LoweredBackendModule):
        raise SnapshotError("this snapshot holds a program, not a lowered backend module; use loads")
    return value


def load(path: str | os.PathLike[str]) -> Program | LoweredBackendModule:
    """Read a snapshot file (a Program or a LoweredBackendModule)."""
    target = Path(path)
    try:
        data = target.read_bytes()
    except OSError as exc:
        raise SnapshotError(f"cannot read {target}: {exc.strerror or exc}") from None
    try:
        return loads_value(data)
    except SnapshotError as exc:
        raise type(exc)(f"{target}: {exc}") from None

