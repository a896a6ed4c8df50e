"""A bounds-checked flatbuffer reader (never trusts an offset): the primitives texir's `.pte`, `.ptd`
and `.bpte` decoders and the XNNPACK blob reader share.

Every offset, vtable and vector length is checked against the buffer before it is followed or
allocated, and the total number of decoded elements (vector elements, vtable slots; subclasses
charge their tables) is capped by a budget proportional to the input, so shared or overlapping
vectors in a hostile file cannot blow up memory or time. Subclasses memoize
tables and vectors reached twice (the encoder shares equal ones) in `memo`.
"""

from __future__ import annotations

import struct
from typing import NoReturn

from texir.errors import PteError
from texir.ir.blob import Blob

__all__ = [
    "BOOL", "F64", "I8", "I32", "I64", "U8", "U16", "U16x2", "U32", "U64", "FbReader", "PteDecodeError", "Tab", "file_view",
]

U8 = struct.Struct("<B")
I8 = struct.Struct("<b")
U16x2 = struct.Struct("<HH")
U16 = struct.Struct("<H")
I32 = struct.Struct("<i")
U32 = struct.Struct("<I")
I64 = struct.Struct("<q")
U64 = struct.Struct("<Q")
F64 = struct.Struct("<d")
BOOL = struct.Struct("<?")


class PteDecodeError(PteError):
    """`.pte` bytes are malformed, truncated or of an unsupported version."""


def file_view(
    data: bytes | bytearray | memoryview, *, kind: str, error: type[Exception], minimum: int = 8
) -> tuple[memoryview, bytes]:
    """The header every flatbuffer file starts with (`.pte`, `.bpte`, `.ptd`): `data` as a flat
    byte view and its file identifier (bytes 4..8). Not bytes-like, or shorter than `minimum`
    bytes (root offset, identifier, and the rest of the file's own header), is an `error` naming
    `kind` ('.pte'); the identifier is the caller's to check."""
    try:
        view = memoryview(data)
    except TypeError as exc:
        raise error(f"reading a {kind} file expects bytes or a memoryview, got {type(data).__name__}") from exc
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    if view.nbytes < minimum:
        raise error(
            f"truncated {kind}: {view.nbytes} bytes, need at least {minimum} (root offset + identifier"
            + (", header)" if minimum > 8 else ")")
        )
    return view, bytes(view[4:8])


# A table handle: (position, field offsets from its vtable, table size).
Tab = tuple[int, tuple[int, ...], int]


class FbReader:
    """Bounds-checked reads of one flatbuffer; subclasses add the tables of their schema."""

    __slots__ = ("d", "n", "budget", "memo", "vtables")

    def __init__(self, data: memoryview, size: int) -> None:
        self.d = data
        self.n = size
        # Decoded vector elements allowed in total: legit files decode each element once.
        self.budget = size + 4096
        self.memo: dict[tuple[str, int], object] = {}
        self.vtables: dict[tuple[int, int], tuple[int, ...]] = {}

    def fail(self, where: str, msg: str) -> NoReturn:
        raise PteDecodeError(f"malformed .pte flatbuffer at {where}: {msg}")

    def charge(self, count: int, where: str) -> None:
        self.budget -= count
        if self.budget < 0:
            self.fail(where, "decoded data exceeds the input size (overlapping or looping offsets)")

    # -- primitives -----------------------------------------------------------------------------

    def table(self, pos: int, where: str) -> Tab:
        n = self.n
        if pos < 0 or pos + 4 > n:
            self.fail(where, f"table offset {pos} outside the buffer of {n} bytes")
        vt = pos - I32.unpack_from(self.d, pos)[0]
        if vt < 0 or vt + 4 > n:
            self.fail(where, f"vtable offset {vt} outside the buffer")
        vtsize, tsize = U16x2.unpack_from(self.d, vt)
        if vtsize < 4 or vtsize & 1 or vt + vtsize > n:
            self.fail(where, f"bad vtable size {vtsize} at offset {vt}")
        if tsize < 4 or pos + tsize > n:
            self.fail(where, f"bad table size {tsize} at offset {pos}")
        count = (vtsize - 4) >> 1
        slots = self.vtables.get((vt, count))
        if slots is None:
            # A vtable is read once and costs its slots: many tables pointing to distinct, overlapping
            # 64 KiB vtables would otherwise hold (input size)^2 slots.
            self.charge(count, where)
            slots = self.vtables[(vt, count)] = struct.unpack_from(f"<{count}H", self.d, vt + 4)
        return (pos, slots, tsize)

    def field(self, t: Tab, slot: int, width: int, where: str) -> int:
        """Absolute position of a field, or 0 when it is absent."""
        slots = t[1]
        if slot >= len(slots):
            return 0
        off = slots[slot]
        if off == 0:
            return 0
        if off < 4 or off + width > t[2]:
            self.fail(where, f"field slot {slot} offset {off} outside its table of {t[2]} bytes")
        return t[0] + off

    def scalar(self, t: Tab, slot: int, fmt: struct.Struct, default: object, where: str) -> object:
        p = self.field(t, slot, fmt.size, where)
        if not p:
            return default
        return fmt.unpack_from(self.d, p)[0]

    def u32(self, t: Tab, slot: int, where: str) -> int:
        p = self.field(t, slot, 4, where)
        return int(U32.unpack_from(self.d, p)[0]) if p else 0

    def i32(self, t: Tab, slot: int, where: str) -> int:
        p = self.field(t, slot, 4, where)
        return int(I32.unpack_from(self.d, p)[0]) if p else 0

    def i8(self, t: Tab, slot: int, where: str) -> int:
        p = self.field(t, slot, 1, where)
        return int(I8.unpack_from(self.d, p)[0]) if p else 0

    def ref(self, t: Tab, slot: int, where: str) -> int:
        """Target of an offset field, or -1 when absent."""
        p = self.field(t, slot, 4, where)
        if not p:
            return -1
        target = p + U32.unpack_from(self.d, p)[0]
        if target + 4 > self.n:
            self.fail(where, f"offset in slot {slot} points to {target}, past the buffer end {self.n}")
        return int(target)

    def vector(self, pos: int, elem: int, where: str) -> tuple[int, int]:
        """(start of elements, count) of the vector at `pos`, checked before anything is read."""
        if pos < 0 or pos + 4 > self.n:
            self.fail(where, f"vector offset {pos} outside the buffer")
        count: int = U32.unpack_from(self.d, pos)[0]
        start = pos + 4
        if count * elem > self.n - start:
            self.fail(where, f"vector of {count} x {elem}-byte elements overruns the buffer end")
        self.charge(count, where)
        return start, count

    def scalars(self, pos: int, code: str, elem: int, where: str) -> tuple[object, ...]:
        key = (code, pos)
        hit = self.memo.get(key)
        if hit is not None:
            return hit  # type: ignore[return-value]  # memo stores what this function returned
        start, count = self.vector(pos, elem, where)
        out = struct.unpack_from(f"<{count}{code}", self.d, start) if count else ()
        self.memo[key] = out
        return out

    def ints(self, t: Tab, slot: int, code: str, elem: int, where: str) -> tuple[int, ...]:
        p = self.ref(t, slot, where)
        if p < 0:
            return ()
        return self.scalars(p, code, elem, where)  # type: ignore[return-value]  # ints by code

    def string_at(self, pos: int, where: str) -> str:
        key = ("s", pos)
        hit = self.memo.get(key)
        if hit is not None:
            return hit  # type: ignore[return-value]  # memo stores what this function returned
        start, count = self.vector(pos, 1, where)
        try:
            text = str(self.d[start : start + count], "utf-8")
        except UnicodeDecodeError as exc:
            self.fail(where, f"string is not UTF-8 ({exc.reason})")
        self.memo[key] = text
        return text

    def string(self, t: Tab, slot: int, where: str) -> str | None:
        p = self.ref(t, slot, where)
        return None if p < 0 else self.string_at(p, where)

    def req_string(self, t: Tab, slot: int, where: str) -> str:
        p = self.ref(t, slot, where)
        if p < 0:
            self.fail(where, f"required string in slot {slot} is missing")
        return self.string_at(p, where)

    def blob(self, t: Tab, slot: int, where: str) -> Blob:
        p = self.ref(t, slot, where)
        if p < 0:
            return Blob(b"")
        if p + 4 > self.n:
            self.fail(where, "byte vector outside the buffer")
        count: int = U32.unpack_from(self.d, p)[0]
        start = p + 4
        if count > self.n - start:
            self.fail(where, f"byte vector of {count} bytes overruns the buffer end")
        return Blob(self.d[start : start + count])

    def table_list(self, t: Tab, slot: int, where: str) -> list[int]:
        """Positions of the tables in a vector-of-tables field (empty when absent)."""
        p = self.ref(t, slot, where)
        if p < 0:
            return []
        start, count = self.vector(p, 4, where)
        offs = struct.unpack_from(f"<{count}I", self.d, start)
        return [start + 4 * i + o for i, o in enumerate(offs)]
