"""XNNPACK blobs: the `XH00` header and the XN01 flatbuffer, written byte-equal to flatc 24.3.25 and read back.

The writer follows the rules flatc applies to ExecuTorch's JSON (see the XNNPACK format notes):
children are created depth-first in schema field order as each field is reached; a table then adds
its present fields grouped by inline size (8, then 4 including offsets, 2, 1), each group in
descending field id; scalars equal to their default are left out; strings are never shared;
vtables are deduplicated by the Builder. Both directions walk `schema.FIELDS`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final

import flatbuffers

from texir.serialize.fb_builder import Builder
from texir.backends.xnnpack import schema as s
from texir.errors import PteError

__all__ = ["HEADER_MAGIC", "XnnpackBlobError", "decode_blob", "encode_blob", "decode_graph", "encode_graph", "split_blob"]

HEADER_MAGIC: Final = b"XH00"
_HEADER = struct.Struct("<4s4sHIIIQ")  # zeros, magic, header length, fb offset, fb size, const offset, size
_HEADER_LENGTH: Final = 30
_ALIGN: Final = 16


class XnnpackBlobError(PteError):
    """An XNNPACK blob or graph that cannot be read or written."""


def _align16(n: int) -> int:
    return n + (-n % _ALIGN)


# -- writer --------------------------------------------------------------------------------------

_SIZES: Final[dict[str, int]] = {"u64": 8, "u32": 4, "i32": 4, "f32": 4, "off": 4, "i16": 2, "u8": 1}
_PREPEND: Final[dict[str, Callable[[flatbuffers.Builder, int, Any], None]]] = {
    "u64": lambda b, slot, x: b.PrependUint64Slot(slot, x, 0),
    "u32": lambda b, slot, x: b.PrependUint32Slot(slot, x, 0),
    "i32": lambda b, slot, x: b.PrependInt32Slot(slot, x, 0),
    "f32": lambda b, slot, x: b.PrependFloat32Slot(slot, x, 0.0),
    "i16": lambda b, slot, x: b.PrependInt16Slot(slot, int(x), 0),
    "u8": lambda b, slot, x: b.PrependUint8Slot(slot, x, 0),
    "off": lambda b, slot, x: b.PrependUOffsetTRelativeSlot(slot, x, 0),
}


def _vector(b: flatbuffers.Builder, items: tuple[Any, ...], prepend: Callable[[Any], None]) -> int:
    b.StartVector(4, len(items), 4)
    for item in reversed(items):
        prepend(item)
    return int(b.EndVector())


def _write_table(b: flatbuffers.Builder, obj: Any) -> int:
    present: list[tuple[int, str, Any]] = []
    slot = 0
    for spec in s.FIELDS[type(obj)]:
        kind = spec.kind
        if kind == "-":
            slot += 1
            continue
        value = getattr(obj, spec.name)
        if kind == "union":
            if value is not None:
                if type(value) not in spec.ref:
                    raise XnnpackBlobError(
                        f"{type(obj).__name__}.{spec.name}: {type(value).__name__} is not a member of its union"
                    )
                member = _write_table(b, value)
                present += [(slot, "u8", spec.ref.index(type(value)) + 1), (slot + 1, "off", member)]
            slot += 2
            continue
        if kind in _SIZES:
            present.append((slot, kind, value))
        elif value is not None:
            if kind == "str":
                off = int(b.CreateString(value))
            elif kind == "[u32]":
                off = _vector(b, value, b.PrependUint32)
            elif kind == "[f32]":
                off = _vector(b, value, b.PrependFloat32)
            elif kind == "table":
                off = _write_table(b, value)
            else:  # "[table]": element tables in index order, then the vector
                offsets = tuple(_write_table(b, item) for item in value)
                off = _vector(b, offsets, b.PrependUOffsetTRelative)
            present.append((slot, "off", off))
        slot += 1
    b.StartObject(slot)
    for fslot, wire, value in sorted(present, key=lambda f: (-_SIZES[f[1]], -f[0])):
        _PREPEND[wire](b, fslot, value)
    return int(b.EndObject())


def encode_graph(graph: s.XNNGraph) -> bytes:
    """The XN01 flatbuffer of `graph`, as flatc writes it from ExecuTorch's JSON."""
    b = Builder(1024)
    try:
        root = _write_table(b, graph)
        b.Finish(root, file_identifier=s.SCHEMA_FILE_IDENTIFIER)
    except (struct.error, TypeError, ValueError, OverflowError, AttributeError, KeyError) as exc:
        raise XnnpackBlobError(
            f"cannot encode XNNGraph: {type(exc).__name__}: {exc}; check that every id, dim and flag is a "
            "non-negative int that fits its schema.fbs field"
        ) from exc
    return bytes(b.Output())


def encode_blob(graph: s.XNNGraph) -> bytes:
    """What ExecuTorch's XnnpackBackend returns: the XH00 header, the flatbuffer, zero padding to 16
    bytes and an empty constant-data region (1.5.1 keeps every weight in named data)."""
    fb = encode_graph(graph)
    constant_offset = _ALIGN * 2 + _align16(len(fb))
    header = _HEADER.pack(b"\0" * 4, HEADER_MAGIC, _HEADER_LENGTH, _ALIGN * 2, len(fb), constant_offset, 0)
    return b"".join((header, b"\0\0", fb, b"\0" * (-len(fb) % _ALIGN)))


# -- reader --------------------------------------------------------------------------------------


class _Reader:
    __slots__ = ("buf",)

    def __init__(self, buf: bytes) -> None:
        self.buf = buf

    def u32(self, pos: int) -> int:
        return int(struct.unpack_from("<I", self.buf, pos)[0])

    def field(self, table: int, slot: int) -> int:
        """Absolute position of `slot`'s data in the table at `table`, or 0 when absent."""
        vtable = table - int(struct.unpack_from("<i", self.buf, table)[0])
        vt_size = int(struct.unpack_from("<H", self.buf, vtable)[0])
        entry = 4 + 2 * slot
        if entry >= vt_size:
            return 0
        rel = int(struct.unpack_from("<H", self.buf, vtable + entry)[0])
        return table + rel if rel else 0

    def deref(self, pos: int) -> int:
        return pos + self.u32(pos)

    def vector(self, pos: int, code: str) -> tuple[Any, ...]:
        start = self.deref(pos)
        n = self.u32(start)
        return tuple(struct.unpack_from(f"<{n}{code}", self.buf, start + 4))

    def table(self, cls: type[Any], table: int) -> Any:
        values: dict[str, Any] = {}
        slot = 0
        for spec in s.FIELDS[cls]:
            kind = spec.kind
            if kind == "-":
                slot += 1
                continue
            if kind == "union":
                tag_pos, val_pos = self.field(table, slot), self.field(table, slot + 1)
                tag = self.buf[tag_pos] if tag_pos else 0
                if tag and val_pos:
                    if tag > len(spec.ref):
                        raise XnnpackBlobError(f"{cls.__name__}.{spec.name}: unknown union tag {tag}")
                    values[spec.name] = self.table(spec.ref[tag - 1], self.deref(val_pos))
                slot += 2
                continue
            pos = self.field(table, slot)
            slot += 1
            if not pos:
                continue
            if kind in _SCALAR_CODES:
                value: Any = struct.unpack_from(_SCALAR_CODES[kind], self.buf, pos)[0]
                values[spec.name] = s.XNNDatatype(value) if kind == "i16" else value
            elif kind == "str":
                start = self.deref(pos)
                values[spec.name] = self.buf[start + 4 : start + 4 + self.u32(start)].decode("utf-8")
            elif kind == "[u32]":
                values[spec.name] = self.vector(pos, "I")
            elif kind == "[f32]":
                values[spec.name] = self.vector(pos, "f")
            elif kind == "table":
                values[spec.name] = self.table(spec.ref[0], self.deref(pos))
            else:
                start = self.deref(pos)
                values[spec.name] = tuple(
                    self.table(spec.ref[0], self.deref(start + 4 + 4 * i)) for i in range(self.u32(start))
                )
        return cls(**values)


_SCALAR_CODES: Final = {"u64": "<Q", "u32": "<I", "i32": "<i", "f32": "<f", "i16": "<h"}


def decode_graph(fb: bytes) -> s.XNNGraph:
    """The XNNGraph of an XN01 (or XN00-identified) flatbuffer."""
    if len(fb) < 8 or fb[4:8] not in (b"XN00", b"XN01"):
        raise XnnpackBlobError(f"not an XNNPACK flatbuffer: identifier {bytes(fb[4:8])!r}, expected b'XN01'")
    try:
        graph: s.XNNGraph = _Reader(bytes(fb)).table(s.XNNGraph, int(struct.unpack_from("<I", fb, 0)[0]))
    except (struct.error, IndexError, UnicodeDecodeError, ValueError) as exc:
        raise XnnpackBlobError(f"damaged XNNPACK flatbuffer: {type(exc).__name__}: {exc}") from exc
    return graph


def split_blob(blob: bytes) -> tuple[bytes, bytes]:
    """(flatbuffer, constant data) of a blob; a blob without the XH00 header is all flatbuffer."""
    if blob[4:8] != HEADER_MAGIC:
        return bytes(blob), b""
    _, _, _, fb_offset, fb_size, const_offset, const_size = _HEADER.unpack_from(blob, 0)
    if fb_offset + fb_size > len(blob) or const_offset + const_size > len(blob):
        raise XnnpackBlobError(
            f"XNNPACK header points past the blob's end ({len(blob)} bytes): flatbuffer at {fb_offset}+{fb_size}, "
            f"constants at {const_offset}+{const_size}"
        )
    return bytes(blob[fb_offset : fb_offset + fb_size]), bytes(blob[const_offset : const_offset + const_size])


def decode_blob(blob: bytes) -> s.XNNGraph:
    """The XNNGraph of a delegate blob (header optional, as for the runtime)."""
    return decode_graph(split_blob(blob)[0])
