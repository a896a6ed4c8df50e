"""The snapshot's wire format (texir.serialize.snapshot is the API): the envelopes, whose JSON schema
is checked in under texir/serialize/schema/, the loosely typed header, the payload hooks (a `Blob` is
base64 in JSON and a type-1 extension in msgpack), the module-level encoders and decoders, and the
checks of a header's format marker and schema version."""

from __future__ import annotations

import base64
import binascii
from typing import Any, Final, Literal, TypeAlias, TypeVar

import msgspec

from texir._io import gc_paused
from texir.errors import SnapshotError
from texir.ir.blob import Blob
from texir.ir.types import DIALECTS, SCHEMA_VERSION, LoweredBackendModule, Program
from texir.serialize import legacy_v1


SnapshotFormat: TypeAlias = Literal["json", "msgpack"]

FORMAT_MARKER: Final = "texir-snapshot"
"""Value of the envelope's first field, ``format``; identifies texir snapshots."""

_BLOB_EXT_CODE: Final = 1


class SnapshotVersionError(SnapshotError):
    """The snapshot was written with a schema version this texir cannot read."""


# --------------------------------------------------------------------------------------------------
# Envelopes (their JSON schema is checked in under texir/serialize/schema/)


class ProgramSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of one Program."""

    format: Literal["texir-snapshot"] = "texir-snapshot"
    schema_version: tuple[int, int]
    kind: Literal["program"] = "program"
    program: Program


class LoweredModuleSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of one LoweredBackendModule (with its original program)."""

    format: Literal["texir-snapshot"] = "texir-snapshot"
    schema_version: tuple[int, int]
    kind: Literal["lowered_module"] = "lowered_module"
    module: LoweredBackendModule


class Header(msgspec.Struct, kw_only=True):
    """The envelope as first read: loosely typed so foreign input gets a precise message, with the
    payload kept as undecoded bytes (msgspec skips it without building objects)."""

    format: Any = None
    schema_version: Any = None
    kind: Any = "program"
    program: msgspec.Raw = msgspec.Raw()
    """Empty when absent (msgspec cannot decode Raw inside a union)."""
    module: msgspec.Raw = msgspec.Raw()


# --------------------------------------------------------------------------------------------------
# Blob hooks


def _enc_hook_json(obj: Any) -> Any:
    if isinstance(obj, Blob):
        return obj.view()  # msgspec writes buffers as base64 strings in JSON
    raise NotImplementedError(f"texir snapshots cannot encode {type(obj).__name__}")


def _enc_hook_msgpack(obj: Any) -> Any:
    if isinstance(obj, Blob):
        return msgspec.msgpack.Ext(_BLOB_EXT_CODE, obj.view())
    raise NotImplementedError(f"texir snapshots cannot encode {type(obj).__name__}")


class _BadExtension(ValueError):
    pass


def _ext_hook(code: int, data: memoryview) -> Any:
    # `data` is a view of the input buffer; `loads` only passes immutable buffers, so the Blob can
    # alias it without a copy.
    if code != _BLOB_EXT_CODE:
        raise _BadExtension(f"unknown msgpack extension type {code} (texir writes only type 1, a tensor payload)")
    return Blob(data)


def _dec_hook(typ: type, obj: Any) -> Any:
    if typ is Blob:
        if isinstance(obj, Blob):
            return obj
        if isinstance(obj, str):
            try:
                return Blob(base64.b64decode(obj, validate=True))
            except (binascii.Error, ValueError) as exc:
                raise ValueError(f"invalid base64 tensor payload ({exc})") from None
        raise TypeError(f"expected a tensor payload, got {type(obj).__name__}")
    raise NotImplementedError(f"no decoder for {typ!r}")


JSON_ENCODER: Final = msgspec.json.Encoder(enc_hook=_enc_hook_json, order="deterministic")
MSGPACK_ENCODER: Final = msgspec.msgpack.Encoder(enc_hook=_enc_hook_msgpack, order="deterministic")

_JSON_HEADER: Final = msgspec.json.Decoder(Header)
_MSGPACK_HEADER: Final = msgspec.msgpack.Decoder(Header, ext_hook=_ext_hook)
JSON_PROGRAM: Final = msgspec.json.Decoder(Program, dec_hook=_dec_hook)
MSGPACK_PROGRAM: Final = msgspec.msgpack.Decoder(Program, dec_hook=_dec_hook, ext_hook=_ext_hook)
JSON_ENVELOPE: Final = msgspec.json.Decoder(ProgramSnapshot, dec_hook=_dec_hook)
MSGPACK_ENVELOPE: Final = msgspec.msgpack.Decoder(ProgramSnapshot, dec_hook=_dec_hook, ext_hook=_ext_hook)
JSON_MODULE: Final = msgspec.json.Decoder(LoweredBackendModule, dec_hook=_dec_hook)
MSGPACK_MODULE: Final = msgspec.msgpack.Decoder(
    LoweredBackendModule, dec_hook=_dec_hook, ext_hook=_ext_hook
)
# Schema 1.x payloads, upgraded on load (texir/serialize/legacy_v1.py).
JSON_PROGRAM_V1: Final = msgspec.json.Decoder(legacy_v1.ProgramV1, dec_hook=_dec_hook)
MSGPACK_PROGRAM_V1: Final = msgspec.msgpack.Decoder(legacy_v1.ProgramV1, dec_hook=_dec_hook, ext_hook=_ext_hook)
JSON_MODULE_V1: Final = msgspec.json.Decoder(legacy_v1.LoweredBackendModuleV1, dec_hook=_dec_hook)
MSGPACK_MODULE_V1: Final = msgspec.msgpack.Decoder(
    legacy_v1.LoweredBackendModuleV1, dec_hook=_dec_hook, ext_hook=_ext_hook
)


# --------------------------------------------------------------------------------------------------
# Reading the header


def detect_format(data: bytes | bytearray | memoryview) -> SnapshotFormat:
    """'json' if the input starts with ``{``, ``[`` or a blank, else 'msgpack'. Raises on empty input."""
    view = memoryview(data)
    if view.nbytes == 0:
        raise SnapshotError("empty input: a snapshot holds at least its header")
    # JSON may start with blanks; msgpack envelopes start with a map header (0x80-0x8f, 0xde, 0xdf),
    # never with one of these bytes.
    first = view[0]
    if first in b"{[ \t\r\n":
        return "json"
    return "msgpack"


def immutable(data: bytes | bytearray | memoryview) -> bytes | memoryview:
    # Payload Blobs alias the input buffer, so it must not change under them: copy writable input.
    if isinstance(data, bytes):
        return data
    view = memoryview(data)
    return view if view.readonly else view.tobytes()


MIGRATED_VERSIONS: Final[tuple[tuple[int, int], ...]] = ((2, 0), (2, 1), (2, 2), (2, 3))
"""Older versions the current decoder reads as they are: 3.0 narrowed `Program.dialect` from any
string to `texir.ir.Dialect` and changed nothing on the wire, so a 2.x snapshot is a 3.0 one whose
dialect the decoder checks (a dialect outside `DIALECTS` is a `SnapshotError` naming the field)."""


def _supported_versions() -> str:
    major, minor = SCHEMA_VERSION
    current = f"{major}.0" if minor == 0 else f"{major}.0 to {major}.{minor}"
    migrated = f"{MIGRATED_VERSIONS[0][0]}.{MIGRATED_VERSIONS[0][1]} to {MIGRATED_VERSIONS[-1][0]}.{MIGRATED_VERSIONS[-1][1]}"
    return ", ".join(f"{a}.{b}" for a, b in legacy_v1.LEGACY_VERSIONS) + f", {migrated} and {current}"


def check_header(header: Header) -> None:
    if header.format != FORMAT_MARKER:
        found = "no format marker" if header.format is None else f"format marker {header.format!r}"
        raise SnapshotError(
            f"not a texir snapshot ({found}; expected \"format\": \"{FORMAT_MARKER}\"); "
            "create one with `texir snapshot MODEL -o FILE` or texir.serialize.snapshot.dumps"
        )
    check_version(header.schema_version)


def check_version(version: Any) -> None:
    if (
        not isinstance(version, (list, tuple))
        or len(version) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in version)
    ):
        raise SnapshotError(
            f"bad snapshot header at $.schema_version: expected [major, minor], got {version!r}"
        )
    major, minor = int(version[0]), int(version[1])
    our_major, our_minor = SCHEMA_VERSION
    if (major == our_major and 0 <= minor <= our_minor) or (major, minor) in (*legacy_v1.LEGACY_VERSIONS, *MIGRATED_VERSIONS):
        return
    found = f"{major}.{minor}"
    if (major, minor) > SCHEMA_VERSION:
        advice = "upgrade texir, or re-create the snapshot with this texir (`texir snapshot MODEL -o FILE`)"
        what = "newer than this texir"
    else:
        advice = "re-create the snapshot with this texir (`texir snapshot MODEL -o FILE`)"
        what = "older than this texir can read"
    raise SnapshotVersionError(
        f"snapshot schema version {found} is {what} (this texir reads {_supported_versions()}); {advice}"
    )


_T = TypeVar("_T")


def decode_payload(
    decoder: msgspec.json.Decoder[_T] | msgspec.msgpack.Decoder[_T], raw: msgspec.Raw, field: str
) -> _T:
    try:
        with gc_paused():
            return decoder.decode(raw)
    except msgspec.ValidationError as exc:
        # msgspec reports paths relative to the decoded object: "... - at `$.graph.nodes[3]`".
        message = str(exc)
        if "`$" in message:
            message = message.replace("`$", f"`$.{field}", 1)
        else:
            message = f"{message} - at `$.{field}`"
        if message.endswith(".dialect`"):
            message += f" (texir's dialects are {', '.join(DIALECTS)}; re-create the snapshot with `texir snapshot MODEL -o FILE`)"
        raise SnapshotError(f"invalid snapshot: {message}") from None
    except msgspec.DecodeError as exc:
        raise SnapshotError(f"corrupt snapshot in $.{field}: {exc}") from None
    except RecursionError:
        raise SnapshotError(f"corrupt snapshot: $.{field} is nested too deeply") from None
    except _BadExtension as exc:
        raise SnapshotError(f"corrupt snapshot in $.{field}: {exc}") from None
    except (ValueError, TypeError, OverflowError, MemoryError) as exc:
        raise SnapshotError(f"corrupt snapshot in $.{field}: {type(exc).__name__}: {exc}") from None


def read_header(data: bytes | memoryview, fmt: SnapshotFormat) -> Header:
    decoder = _JSON_HEADER if fmt == "json" else _MSGPACK_HEADER
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        # A file that is not a map at all is not a snapshot of either format: say so plainly.
        what = "not a texir snapshot" if "expected `object`" not in str(exc).lower() else (
            "not a texir snapshot (neither a JSON nor a msgpack envelope)" if fmt == "msgpack" else "not a texir snapshot"
        )
        raise SnapshotError(
            f"{what} ({fmt}: {exc}); expected the envelope "
            f'{{"format": "{FORMAT_MARKER}", "schema_version": ..., "program": ...}}'
        ) from None
    except msgspec.DecodeError as exc:
        raise SnapshotError(f"corrupt or truncated {fmt} snapshot: {exc}") from None
    except RecursionError:
        raise SnapshotError(f"corrupt {fmt} snapshot: nested too deeply") from None
    except (ValueError, TypeError, OverflowError, MemoryError) as exc:
        raise SnapshotError(f"corrupt {fmt} snapshot: {type(exc).__name__}: {exc}") from None
