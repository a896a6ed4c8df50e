"""`Builder`: flatbuffers' Python builder with flatc's vtable sharing, whatever flatbuffers release is
installed (texir's `.pte`, `.ptd`, `.bpte` and XNNPACK writers all build through it)."""

from __future__ import annotations

import flatbuffers
from flatbuffers import encode, packer

__all__ = ["Builder"]

_VTABLE_HEADER = 2
"""A vtable starts with two uint16: its own size in bytes and the size of its table."""


class Builder(flatbuffers.Builder):  # type: ignore[misc]  # flatbuffers ships no type information
    """A table reuses an earlier vtable only when the two are the same bytes, the table size
    included, as flatc does. flatbuffers releases before 25.12 key vtables by their field offsets
    alone, so two tables of different sizes share one vtable there and the bytes differ from
    flatc's; `tosa-tools` (ExecuTorch's Arm extra) pins such a release."""

    # the builder's own state, as flatbuffers keeps it (declared for mypy; flatbuffers is untyped)
    current_vtable: list[int] | None
    objectEnd: int
    vtables: dict[tuple[int, ...], int]
    Bytes: bytearray
    head: int

    def WriteVtable(self) -> int:  # noqa: N802 - the name flatbuffers calls
        self.PrependSOffsetTRelative(0)  # the table's offset to its vtable, filled in below
        table = self.Offset()
        fields = [table - at if at else 0 for at in self.current_vtable or ()]
        while fields and fields[-1] == 0:  # absent fields at the end take no slot
            fields.pop()
        size = table - self.objectEnd
        key = (size, *fields)
        found = self.vtables.get(key)
        if found is None:
            for offset in reversed(fields):
                self.PrependVOffsetT(offset)
            self.PrependVOffsetT(size)
            self.PrependVOffsetT((_VTABLE_HEADER + len(fields)) * 2)
            # (where the table starts is measured after the prepends: they may have grown the buffer)
            encode.Write(packer.soffset, self.Bytes, len(self.Bytes) - table, self.Offset() - table)
            self.vtables[key] = self.Offset()
        else:  # the table points back at the vtable written before
            self.head = len(self.Bytes) - table
            encode.Write(packer.soffset, self.Bytes, self.Head(), found - table)
        self.current_vtable = None
        return int(table)
