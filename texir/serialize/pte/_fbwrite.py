"""Builds the ET12 flatbuffer of a `schema.Program` with `flatbuffers.Builder` (no flatc)."""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

import msgspec

import flatbuffers

from texir.serialize.fb_builder import Builder
from texir.errors import PteError
from texir.ir.blob import Blob
from texir.serialize.pte import schema as s

_KERNEL_TAG: dict[type, int] = {cls: i + 1 for i, cls in enumerate(s.KERNEL_TYPES)}
_INSTR_TAG: dict[type, int] = {cls: i + 1 for i, cls in enumerate(s.INSTRUCTION_ARGUMENTS)}


class PteEncodeError(PteError):
    """A schema value cannot be written (out-of-range integer, bad index kind, ...)."""


class PteArgumentError(PteEncodeError, TypeError):
    """`dumps`/`dump` was given something other than a PteProgram (e.g. an IR Program not yet emitted)."""


_SIZE = {"b": 1, "B": 1, "?": 1, "i": 4, "I": 4, "O": 4, "q": 8, "Q": 8, "d": 8}

# A field of a table being written: (slot, struct code, value); code "O" is an offset (uoffset_t)
# whose value is the target's builder offset (distance from the buffer end).
_Field = tuple[int, str, object]
_UNION = ((0, "B"), (1, "O"))
_U32 = struct.Struct("<I")
_VECTOR_FORMATS: dict[tuple[int, str], str] = {(n, c): f"<{n}{c}" for n in range(1, 17) for c in "iqB"}
_CALL = ((0, "i"), (1, "O"))
_CALL0 = ((1, "O"),)


class _Shape(msgspec.Struct, frozen=True):
    """Byte layout of a table with a given set of present fields, started at a given offset modulo 8."""

    packer: struct.Struct
    order: tuple[int, ...]
    """Field indices (into the caller's list) in address order."""
    positions: tuple[int, ...]
    """Byte position of each field (same order as `order`) from the table's start (its vtable offset)."""
    is_offset: tuple[bool, ...]
    has_offsets: bool
    size: int
    """Bytes the table takes, the alignment padding below its first field included (the vtable's object size)."""
    align: int
    vtable: bytes


def _shape(key: tuple[tuple[int, str], ...], start: int) -> _Shape:
    """The layout `flatbuffers.Builder` gives a table whose fields are prepended one by one in `key`'s
    order (slot order: how flatc's generated `Pack` adds them, and so ExecuTorch) when the buffer holds
    `start` bytes (only `start % 8` matters): each field is aligned to its size as it is prepended, then
    the 4-byte vtable offset; padding before the first field belongs to the table."""
    sizes = [_SIZE[code] for _, code in key]
    offset = start
    ends = []
    for size in sizes:
        offset += (-offset & (size - 1)) + size
        ends.append(offset)
    offset += (-offset & 3) + 4
    object_offset = offset
    positions_by_field = [object_offset - end for end in ends]
    order = sorted(range(len(key)), key=lambda k: positions_by_field[k])
    fmt = "<i"
    pos = 4
    for k in order:
        gap = positions_by_field[k] - pos
        if gap:
            fmt += f"{gap}x"
        code = key[k][1]
        fmt += "I" if code == "O" else code
        pos = positions_by_field[k] + sizes[k]
    nslots = max((slot for slot, _ in key), default=-1) + 1
    slots = [0] * nslots
    for k, (slot, _) in enumerate(key):
        slots[slot] = positions_by_field[k]
    size = object_offset - start
    vtable = struct.pack(f"<HH{nslots}H", 4 + 2 * nslots, size, *slots)
    return _Shape(
        packer=struct.Struct(fmt),
        order=tuple(order),
        positions=tuple(positions_by_field[k] for k in order),
        is_offset=tuple(key[k][1] == "O" for k in order),
        has_offsets=any(code == "O" for _, code in key),
        size=size,
        align=max([4, *sizes]),
        vtable=vtable,
    )


class _Writer:
    """One flatbuffer build on a `flatbuffers.Builder`, byte-equal to ExecuTorch's writer.

    ExecuTorch packs its `schema.Program` with flatc's generated object API (`ProgramT.Pack`): every
    table's children (strings, vectors, tables) are created depth-first in field order, then its
    present fields are prepended in field order; nothing is shared (each string and vector is
    written where it is reached); vtables are deduplicated by the Builder. This writer builds the
    same bytes, but lays each table out from a cached per-shape struct and writes it with one
    `pack_into` (the Builder's per-field Prepend*Slot calls cost ~10x more). The output depends only
    on the input.
    """

    __slots__ = ("b", "vtables", "shapes", "tensor_align", "delegate_align")

    def __init__(self, tensor_align: int, delegate_align: int, size_hint: int) -> None:
        self.b = Builder(max(1024, size_hint))
        self.vtables: dict[bytes, int] = {}
        self.shapes: dict[tuple[tuple[tuple[int, str], ...], int], _Shape] = {}
        self.tensor_align = tensor_align
        self.delegate_align = delegate_align

    # -- primitives -----------------------------------------------------------------------------

    def reserve(self, align: int, size: int) -> int:
        """Make room for `size` bytes ending aligned to `align` (like Builder.Prep, minus zero-filling:
        bytes below the head are still the zeros the buffer was allocated with); returns the head."""
        b = self.b
        if align > b.minalign:
            b.minalign = align
        buf = b.Bytes
        head: int = b.head
        pad = -(len(buf) - head + size) & (align - 1)
        while head < pad + size:
            old = len(buf)
            b.GrowByteBuffer()
            buf = b.Bytes
            head += len(buf) - old
        b.head = head = head - pad - size
        return head

    def table(self, key: tuple[tuple[int, str], ...], values: list[object]) -> int:
        """Write a table whose present (non-default) fields are `key` = ((slot, code), ...), in slot
        order, with `values` (offset fields hold the target's offset); returns the table's offset."""
        b = self.b
        buf: bytearray = b.Bytes
        head: int = b.head
        start = len(buf) - head
        shape = self.shapes.get((key, start & 7))
        if shape is None:
            shape = self.shapes[(key, start & 7)] = _shape(key, start)
        size = shape.size
        vt_off = self.vtables.get(shape.vtable)
        # room for the table and (when new) its vtable right below it: no padding, as the table's
        # start is 4-aligned and a vtable is a whole number of u16s
        need = size if vt_off is not None else size + len(shape.vtable)
        if head < need:
            head = self.reserve(1, need) + need
            buf = b.Bytes
        head -= size
        b.head = head
        if shape.align > b.minalign:
            b.minalign = shape.align
        table_off = start + size
        if shape.has_offsets:
            ordered = [
                table_off - pos - values[k] if is_off else values[k]  # type: ignore[operator]  # offset fields hold ints
                for k, pos, is_off in zip(shape.order, shape.positions, shape.is_offset)
            ]
        else:
            ordered = [values[k] for k in shape.order]
        if vt_off is not None:
            shape.packer.pack_into(buf, head, vt_off - table_off, *ordered)
            return table_off
        n = len(shape.vtable)
        vt_head = head - n
        buf[vt_head:head] = shape.vtable
        b.head = vt_head
        if b.minalign < 2:
            b.minalign = 2
        vt_off = len(buf) - vt_head
        self.vtables[shape.vtable] = vt_off
        shape.packer.pack_into(buf, head, vt_off - table_off, *ordered)
        return table_off

    def fields(self, fields: list[_Field]) -> int:
        return self.table(tuple((f[0], f[1]) for f in fields), [f[2] for f in fields])

    def string(self, value: str) -> int:
        return int(self.b.CreateString(value))

    def scalars(self, code: str, items: Sequence[object]) -> int:
        """A vector of fixed-width scalars, packed in one call (struct code, e.g. "i", "q")."""
        size = _SIZE[code]
        n = len(items)
        nbytes = n * size
        # Elements aligned to their size (at least 4), the u32 length right before them.
        head = self.reserve(size if size > 4 else 4, nbytes)
        if n:
            struct.pack_into(_VECTOR_FORMATS.get((n, code)) or f"<{n}{code}", self.b.Bytes, head, *items)
        head = self.reserve(4, 4)
        buf = self.b.Bytes
        _U32.pack_into(buf, head, n)
        return len(buf) - head

    def blob(self, data: Blob | bytes, alignment: int) -> int:
        """A [ubyte] vector whose data starts at a multiple of `alignment` (force_align)."""
        b = self.b
        view = data.view() if isinstance(data, Blob) else memoryview(data)
        n = view.nbytes
        b.StartVector(1, n, alignment)
        b.head = b.head - n
        b.Bytes[b.head : b.head + n] = view
        return int(b.EndVector())

    def tables(self, offsets: Sequence[int]) -> int:
        """A vector of tables (or strings), all offsets written in one call."""
        b = self.b
        n = len(offsets)
        b.StartVector(4, n, 4)
        b.head = head = b.head - 4 * n
        first = len(b.Bytes) - head
        if n:
            struct.pack_into(f"<{n}I", b.Bytes, head, *[first - 4 * i - o for i, o in enumerate(offsets)])
        return int(b.EndVector())

    # -- tables ---------------------------------------------------------------------------------

    def evalue(self, ev: s.EValue) -> int:
        val = ev.val
        tag = _KERNEL_TAG.get(type(val))
        if tag is None:
            raise PteEncodeError(f"EValue.val: {type(val).__name__} is not a KernelTypes member")
        member = self.kernel_type(val)
        return self.table(_UNION, [tag, member])

    def kernel_type(self, val: s.KernelTypes) -> int:
        if isinstance(val, s.Tensor):
            return self.tensor(val)
        if isinstance(val, s.Int):
            return self.fields([(0, "q", val.int_val)] if val.int_val else [])
        if isinstance(val, s.Null):
            return self.fields([])
        if isinstance(val, s.Bool):
            return self.fields([(0, "?", True)] if val.bool_val else [])
        if isinstance(val, s.Double):
            x = float(val.double_val)
            # -0.0 equals the default 0.0 but must survive the round trip.
            keep = x != 0.0 or math.copysign(1.0, x) < 0
            return self.fields([(0, "d", x)] if keep else [])
        if isinstance(val, s.String):
            return self.fields([(0, "O", self.string(val.string_val))])
        if isinstance(val, s.IntList):
            vo = self.scalars("q", val.items)
        elif isinstance(val, s.DoubleList):
            vo = self.scalars("d", val.items)
        elif isinstance(val, s.BoolList):
            vo = self.scalars("?", val.items)
        else:  # TensorList, OptionalTensorList
            vo = self.scalars("i", val.items)
        return self.fields([(0, "O", vo)])

    def tensor(self, t: s.Tensor) -> int:
        fields: list[_Field] = []
        if t.scalar_type:
            fields.append((0, "b", int(t.scalar_type)))
        if t.storage_offset:
            fields.append((1, "i", t.storage_offset))
        fields.append((2, "O", self.scalars("i", t.sizes)))
        fields.append((3, "O", self.scalars("B", t.dim_order)))
        if t.requires_grad:
            fields.append((4, "?", True))
        if t.data_buffer_idx:
            fields.append((5, "I", t.data_buffer_idx))
        a = t.allocation_info
        if a is not None:
            af: list[_Field] = []
            if a.memory_id:
                af.append((0, "I", a.memory_id))
            if a.memory_offset_low:
                af.append((1, "I", a.memory_offset_low))
            if a.memory_offset_high:
                af.append((2, "I", a.memory_offset_high))
            fields.append((6, "O", self.fields(af)))
        if t.layout:
            fields.append((7, "b", t.layout))
        if t.shape_dynamism:
            fields.append((8, "b", int(t.shape_dynamism)))
        if t.extra_tensor_info is not None:
            fields.append((9, "O", self.extra_tensor_info(t.extra_tensor_info)))
        return self.fields(fields)

    def extra_tensor_info(self, e: s.ExtraTensorInfo) -> int:
        fields: list[_Field] = []
        if e.mutable_data_segments_idx:
            fields.append((0, "Q", e.mutable_data_segments_idx))
        if e.fully_qualified_name is not None:
            fields.append((1, "O", self.string(e.fully_qualified_name)))
        if e.location:
            fields.append((2, "b", int(e.location)))
        if e.device_type:
            fields.append((3, "b", int(e.device_type)))
        if e.device_index:
            fields.append((4, "b", e.device_index))
        return self.fields(fields)

    def instruction(self, ins: s.Instruction) -> int:
        a = ins.instr_args
        tag = _INSTR_TAG.get(type(a))
        if tag is None:
            raise PteEncodeError(
                f"Instruction.instr_args: {type(a).__name__} is not an InstructionArguments member"
            )
        fields: list[_Field]
        if isinstance(a, s.KernelCall | s.DelegateCall):
            index = a.op_index if isinstance(a, s.KernelCall) else a.delegate_index
            args = self.scalars("i", a.args)
            member = self.table(_CALL, [index, args]) if index else self.table(_CALL0, [args])
            return self.table(_UNION, [tag, member])
        elif isinstance(a, s.MoveCall):
            fields = _nonzero_i32((a.move_from, a.move_to))
        elif isinstance(a, s.JumpFalseCall):
            fields = _nonzero_i32((a.cond_value_index, a.destination_instruction))
        else:
            fields = _nonzero_i32((a.value_index,))
        member = self.fields(fields)
        return self.table(_UNION, [tag, member])

    def opt_string(self, slot: int, value: str | None, fields: list[_Field]) -> None:
        if value is not None:
            fields.append((slot, "O", self.string(value)))

    def frame_list(self, fl: s.FrameList) -> int:
        frames = []
        for f in fl.items:
            fields: list[_Field] = []
            self.opt_string(0, f.filename, fields)
            if f.lineno:
                fields.append((1, "i", f.lineno))
            self.opt_string(2, f.name, fields)
            self.opt_string(3, f.context, fields)
            frames.append(self.fields(fields))
        return self.fields([(0, "O", self.tables(frames))])

    def chain(self, c: s.Chain) -> int:
        fields: list[_Field] = [
            (0, "O", self.scalars("i", c.inputs)),
            (1, "O", self.scalars("i", c.outputs)),
            (2, "O", self.tables([self.instruction(i) for i in c.instructions])),
        ]
        if c.stacktrace is not None:
            fields.append((3, "O", self.tables([self.frame_list(fl) for fl in c.stacktrace])))
        return self.fields(fields)

    def delegate(self, d: s.BackendDelegate) -> int:
        ident = self.string(d.id)
        pf: list[_Field] = []
        if d.processed.location:
            pf.append((0, "b", int(d.processed.location)))
        if d.processed.index:
            pf.append((1, "I", d.processed.index))
        processed = self.fields(pf)
        specs = []
        for cs in d.compile_specs:
            key = self.string(cs.key)
            specs.append(self.fields([(0, "O", key), (1, "O", self.scalars("B", cs.value))]))
        spec_vec = self.tables(specs)
        return self.fields([(0, "O", ident), (1, "O", processed), (2, "O", spec_vec)])

    def plan(self, p: s.ExecutionPlan) -> int:
        fields: list[_Field] = [(0, "O", self.string(p.name))]
        if p.container_meta_type is not None:
            inp = self.string(p.container_meta_type.encoded_inp_str)
            out = self.string(p.container_meta_type.encoded_out_str)
            fields.append((1, "O", self.fields([(0, "O", inp), (1, "O", out)])))
        fields.append((2, "O", self.tables([self.evalue(v) for v in p.values])))
        fields.append((3, "O", self.scalars("i", p.inputs)))
        fields.append((4, "O", self.scalars("i", p.outputs)))
        fields.append((5, "O", self.tables([self.chain(c) for c in p.chains])))
        ops = [
            self.fields([(0, "O", self.string(op.name)), (1, "O", self.string(op.overload))])
            for op in p.operators
        ]
        fields.append((6, "O", self.tables(ops)))
        fields.append((7, "O", self.tables([self.delegate(d) for d in p.delegates])))
        fields.append((8, "O", self.scalars("q", p.non_const_buffer_sizes)))
        if p.non_const_buffer_device is not None:
            devs = []
            for dv in p.non_const_buffer_device:
                df: list[_Field] = _nonzero_i32((dv.buffer_idx,))
                if dv.device_type:
                    df.append((1, "b", int(dv.device_type)))
                if dv.device_index:
                    df.append((2, "b", dv.device_index))
                devs.append(self.fields(df))
            fields.append((9, "O", self.tables(devs)))
        return self.fields(fields)

    def subsegment_offsets(self, so: s.SubsegmentOffsets) -> int:
        fields: list[_Field] = [(0, "I", so.segment_index)] if so.segment_index else []
        fields.append((1, "O", self.scalars("Q", so.offsets)))
        return self.fields(fields)

    def program(self, p: s.Program) -> int:
        plans = self.tables([self.plan(x) for x in p.execution_plan])
        bufs = [self.fields([(0, "O", self.blob(b.storage, self.tensor_align))]) for b in p.constant_buffer]
        constant_buffer = self.tables(bufs)
        inline = [
            self.fields([(0, "O", self.blob(d.data, self.delegate_align))]) for d in p.backend_delegate_data
        ]
        delegate_data = self.tables(inline)
        segs = []
        for seg in p.segments:
            sf: list[_Field] = []
            if seg.offset:
                sf.append((0, "Q", seg.offset))
            if seg.size:
                sf.append((1, "Q", seg.size))
            segs.append(self.fields(sf))
        fields: list[_Field] = [(0, "I", p.version)] if p.version else []
        fields += [(1, "O", plans), (2, "O", constant_buffer), (3, "O", delegate_data)]
        fields.append((4, "O", self.tables(segs)))
        if p.constant_segment is not None:
            fields.append((5, "O", self.subsegment_offsets(p.constant_segment)))
        if p.mutable_data_segments is not None:
            mutable = [self.subsegment_offsets(x) for x in p.mutable_data_segments]
            fields.append((6, "O", self.tables(mutable)))
        if p.named_data is not None:
            entries = []
            for nd in p.named_data:
                nf: list[_Field] = [(0, "O", self.string(nd.key))]
                if nd.segment_index:
                    nf.append((1, "I", nd.segment_index))
                entries.append(self.fields(nf))
            fields.append((7, "O", self.tables(entries)))
        return self.fields(fields)


def _nonzero_i32(values: tuple[int, ...]) -> list[_Field]:
    return [(slot, "i", v) for slot, v in enumerate(values) if v]


def encode_program(program: s.Program, *, tensor_alignment: int, delegate_alignment: int) -> bytes:
    """The flatbuffer bytes of `program` (identifier ET12, no extended header)."""
    hint = sum(b.storage.nbytes for b in program.constant_buffer) + sum(
        d.data.nbytes for d in program.backend_delegate_data
    )
    w = _Writer(tensor_alignment, delegate_alignment, hint + 64 * 1024)
    try:
        root = w.program(program)
        w.b.Finish(root, file_identifier=s.SCHEMA_FILE_IDENTIFIER)
    except PteError:
        raise
    except (struct.error, TypeError, ValueError, OverflowError, AttributeError) as exc:
        raise PteEncodeError(
            f"cannot encode Program: {exc}; check that every integer fits its program.fbs field "
            "type (e.g. uint for data_buffer_idx, int for value indices)"
        ) from exc
    return bytes(w.b.Output())
