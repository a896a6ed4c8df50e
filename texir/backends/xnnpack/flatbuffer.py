"""XNNPACK blobs: the `XH00` header and the XN01 flatbuffer, written byte-equal to flatc 24.3.25 (the
reader is `texir.backends.xnnpack.reader`; its names are re-exported here).

The writer follows the rules flatc applies to ExecuTorch's JSON (see the XNNPACK format notes):
children are created depth-first in schema field order as each field is reached; a table then adds
its present fields grouped by inline size (8, then 4 including offsets, 2, 1), each group in
descending field id; scalars equal to their default are left out; strings are never shared;
vtables are deduplicated by the Builder. Writer and reader both walk `schema.FIELDS`.
"""

from __future__ import annotations

import struct
from typing import Any, Final

import flatbuffers

from texir.serialize.fb_builder import Builder
from texir.backends.xnnpack import schema as s
from texir.backends.xnnpack.reader import HEADER as _HEADER
from texir.backends.xnnpack.reader import HEADER_LENGTH as _HEADER_LENGTH
from texir.backends.xnnpack.reader import HEADER_MAGIC, XnnpackBlobError, decode_blob, decode_graph, split_blob

__all__ = ["HEADER_MAGIC", "XnnpackBlobError", "decode_blob", "encode_blob", "decode_graph", "encode_graph", "split_blob"]

_ALIGN: Final = 16


def _align16(n: int) -> int:
    return n + (-n % _ALIGN)


# -- writer --------------------------------------------------------------------------------------

_SIZES: Final[dict[str, int]] = {"u64": 8, "u32": 4, "i32": 4, "f32": 4, "off": 4, "i16": 2, "u8": 1}
_FLAGS: Final[dict[str, Any]] = {
    "u64": flatbuffers.number_types.Uint64Flags,
    "u32": flatbuffers.number_types.Uint32Flags,
    "i32": flatbuffers.number_types.Int32Flags,
    "f32": flatbuffers.number_types.Float32Flags,
    "i16": flatbuffers.number_types.Int16Flags,
    "u8": flatbuffers.number_types.Uint8Flags,
}


def _scalar_slot(b: Builder, slot: int, wire: str, x: Any) -> None:
    """What flatbuffers' Prepend<Type>Slot(slot, x, default 0) writes, without its five layers of
    calls a field (the same range check, alignment, bytes and vtable entry)."""
    flags = _FLAGS[wire]
    if wire == "i16":
        x = int(x)
    flatbuffers.number_types.enforce_number(x, flags)
    if x != 0:  # (0 and 0.0 alike: the schema's default, left out)
        width = flags.bytewidth
        b.Prep(width, 0)
        b.head -= width
        flags.packer_type.pack_into(b.Bytes, b.head, x)
        vtable = b.current_vtable
        if vtable is None:  # pragma: no cover - StartObject made it; flatbuffers' Slot asserts the same
            raise XnnpackBlobError("internal error: a table field written outside a table; please report")
        vtable[slot] = b.Offset()


def _numbers(b: Builder, items: tuple[Any, ...], code: str) -> int:
    """A vector of 4-byte numbers (struct `code` "I" or "f"), written at once: the bytes one
    PrependUint32/PrependFloat32 an item writes (StartVector made room and aligned for them all)."""
    b.StartVector(4, len(items), 4)
    b.head -= 4 * len(items)
    struct.pack_into(f"<{len(items)}{code}", b.Bytes, b.head, *items)
    return int(b.EndVector())


def _offsets(b: Builder, items: tuple[int, ...]) -> int:
    b.StartVector(4, len(items), 4)
    for item in reversed(items):
        b.PrependUOffsetTRelative(item)
    return int(b.EndVector())


def _write_table(b: Builder, obj: Any) -> int:
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
                off = _numbers(b, value, "I")
            elif kind == "[f32]":
                off = _numbers(b, value, "f")
            elif kind == "table":
                off = _write_table(b, value)
            else:  # "[table]": element tables in index order, then the vector
                off = _offsets(b, tuple(_write_table(b, item) for item in value))
            present.append((slot, "off", off))
        slot += 1
    b.StartObject(slot)
    for fslot, wire, value in sorted(present, key=lambda f: (-_SIZES[f[1]], -f[0])):
        if wire == "off":
            b.PrependUOffsetTRelativeSlot(fslot, value, 0)
        else:
            _scalar_slot(b, fslot, wire, value)
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
