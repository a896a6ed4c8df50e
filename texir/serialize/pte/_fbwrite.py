"""Builds the ET12 flatbuffer of a `schema.Program` with `flatbuffers.Builder` (no flatc)."""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

import flatbuffers

from texir.errors import PteError
from texir.ir.blob import Blob
from texir.serialize.pte import schema as s

_KERNEL_TAG: dict[type, int] = {cls: i + 1 for i, cls in enumerate(s.KERNEL_TYPES)}
_INSTR_TAG: dict[type, int] = {cls: i + 1 for i, cls in enumerate(s.INSTRUCTION_ARGUMENTS)}


class PteEncodeError(PteError):
    """A schema value cannot be written (out-of-range integer, bad index kind, ...)."""


class _Writer:
    """One flatbuffer build. Equal strings, scalar vectors and non-tensor EValues are written once
    and shared by offset (legal in flatbuffers: a buffer is a DAG), which keeps big programs small
    and fast to build; the output depends only on the input, so it is deterministic."""

    __slots__ = ("b", "strings", "vectors", "evalues", "tensor_align", "delegate_align")

    def __init__(self, tensor_align: int, delegate_align: int, size_hint: int) -> None:
        self.b = flatbuffers.Builder(max(1024, size_hint))
        self.strings: dict[str, int] = {}
        self.vectors: dict[tuple[str, tuple[object, ...]], int] = {}
        self.evalues: dict[s.EValue, int] = {}
        self.tensor_align = tensor_align
        self.delegate_align = delegate_align

    # -- leaves ---------------------------------------------------------------------------------

    def string(self, value: str) -> int:
        off = self.strings.get(value)
        if off is None:
            off = self.b.CreateString(value)
            self.strings[value] = off
        return off

    def scalars(self, code: str, items: Sequence[object]) -> int:
        """A vector of fixed-width scalars, packed in one call (struct code, e.g. "i", "q")."""
        key = (code, tuple(items))
        off = self.vectors.get(key)
        if off is not None:
            return off
        b = self.b
        size = struct.calcsize(code)
        n = len(items)
        b.StartVector(size, n, size)
        b.head = b.head - n * size
        if n:
            struct.pack_into(f"<{n}{code}", b.Bytes, b.head, *items)
        off = b.EndVector()
        self.vectors[key] = off
        return int(off)

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
        b = self.b
        b.StartVector(4, len(offsets), 4)
        for off in reversed(offsets):
            b.PrependUOffsetTRelative(off)
        return int(b.EndVector())

    # -- tables ---------------------------------------------------------------------------------

    def evalue(self, ev: s.EValue) -> int:
        val = ev.val
        # Tensors are nearly always distinct; Double(0.0) == Double(-0.0) must not share bytes.
        cacheable = not isinstance(val, s.Tensor | s.Double)
        if cacheable:
            cached = self.evalues.get(ev)
            if cached is not None:
                return cached
        tag = _KERNEL_TAG.get(type(val))
        if tag is None:
            raise PteEncodeError(f"EValue.val: {type(val).__name__} is not a KernelTypes member")
        member = self.kernel_type(val)
        b = self.b
        b.StartObject(2)
        b.PrependUOffsetTRelativeSlot(1, member, 0)
        b.PrependUint8Slot(0, tag, 0)
        off = b.EndObject()
        if cacheable:
            self.evalues[ev] = off
        return int(off)

    def kernel_type(self, val: s.KernelTypes) -> int:
        b = self.b
        if isinstance(val, s.Tensor):
            return self.tensor(val)
        if isinstance(val, s.Int):
            b.StartObject(1)
            b.PrependInt64Slot(0, val.int_val, 0)
        elif isinstance(val, s.Null):
            b.StartObject(0)
        elif isinstance(val, s.Bool):
            b.StartObject(1)
            b.PrependBoolSlot(0, val.bool_val, False)
        elif isinstance(val, s.Double):
            b.StartObject(1)
            x = float(val.double_val)
            if x == 0.0 and math.copysign(1.0, x) < 0:
                b.PrependFloat64(x)  # -0.0 equals the default but must survive the round trip
                b.Slot(0)
            else:
                b.PrependFloat64Slot(0, x, 0.0)
        elif isinstance(val, s.String):
            so = self.string(val.string_val)
            b.StartObject(1)
            b.PrependUOffsetTRelativeSlot(0, so, 0)
        else:
            if isinstance(val, s.IntList):
                vo = self.scalars("q", val.items)
            elif isinstance(val, s.DoubleList):
                vo = self.scalars("d", val.items)
            elif isinstance(val, s.BoolList):
                vo = self.scalars("?", val.items)
            else:  # TensorList, OptionalTensorList
                vo = self.scalars("i", val.items)
            b.StartObject(1)
            b.PrependUOffsetTRelativeSlot(0, vo, 0)
        return int(b.EndObject())

    def tensor(self, t: s.Tensor) -> int:
        b = self.b
        sizes = self.scalars("i", t.sizes)
        dim_order = self.scalars("B", t.dim_order)
        alloc = 0
        if t.allocation_info is not None:
            a = t.allocation_info
            b.StartObject(3)
            b.PrependUint32Slot(0, a.memory_id, 0)
            b.PrependUint32Slot(1, a.memory_offset_low, 0)
            b.PrependUint32Slot(2, a.memory_offset_high, 0)
            alloc = b.EndObject()
        extra = 0
        if t.extra_tensor_info is not None:
            extra = self.extra_tensor_info(t.extra_tensor_info)
        b.StartObject(10)
        b.PrependUOffsetTRelativeSlot(2, sizes, 0)
        b.PrependUOffsetTRelativeSlot(3, dim_order, 0)
        b.PrependUOffsetTRelativeSlot(6, alloc, 0)
        b.PrependUOffsetTRelativeSlot(9, extra, 0)
        b.PrependInt32Slot(1, t.storage_offset, 0)
        b.PrependUint32Slot(5, t.data_buffer_idx, 0)
        b.PrependInt8Slot(0, int(t.scalar_type), 0)
        b.PrependBoolSlot(4, t.requires_grad, False)
        b.PrependInt8Slot(7, t.layout, 0)
        b.PrependInt8Slot(8, int(t.shape_dynamism), 0)
        return int(b.EndObject())

    def extra_tensor_info(self, e: s.ExtraTensorInfo) -> int:
        b = self.b
        fqn = self.string(e.fully_qualified_name) if e.fully_qualified_name is not None else 0
        b.StartObject(5)
        b.PrependUint64Slot(0, e.mutable_data_segments_idx, 0)
        b.PrependUOffsetTRelativeSlot(1, fqn, 0)
        b.PrependInt8Slot(2, int(e.location), 0)
        b.PrependInt8Slot(3, int(e.device_type), 0)
        b.PrependInt8Slot(4, e.device_index, 0)
        return int(b.EndObject())

    def instruction(self, ins: s.Instruction) -> int:
        b = self.b
        a = ins.instr_args
        tag = _INSTR_TAG.get(type(a))
        if tag is None:
            raise PteEncodeError(
                f"Instruction.instr_args: {type(a).__name__} is not an InstructionArguments member"
            )
        if isinstance(a, s.KernelCall | s.DelegateCall):
            args = self.scalars("i", a.args)
            b.StartObject(2)
            b.PrependUOffsetTRelativeSlot(1, args, 0)
            b.PrependInt32Slot(0, a.op_index if isinstance(a, s.KernelCall) else a.delegate_index, 0)
        elif isinstance(a, s.MoveCall):
            b.StartObject(2)
            b.PrependInt32Slot(0, a.move_from, 0)
            b.PrependInt32Slot(1, a.move_to, 0)
        elif isinstance(a, s.JumpFalseCall):
            b.StartObject(2)
            b.PrependInt32Slot(0, a.cond_value_index, 0)
            b.PrependInt32Slot(1, a.destination_instruction, 0)
        else:
            b.StartObject(1)
            b.PrependInt32Slot(0, a.value_index, 0)
        member = b.EndObject()
        b.StartObject(2)
        b.PrependUOffsetTRelativeSlot(1, member, 0)
        b.PrependUint8Slot(0, tag, 0)
        return int(b.EndObject())

    def frame_list(self, fl: s.FrameList) -> int:
        b = self.b
        frames = []
        for f in fl.items:
            fn = self.string(f.filename) if f.filename is not None else 0
            nm = self.string(f.name) if f.name is not None else 0
            cx = self.string(f.context) if f.context is not None else 0
            b.StartObject(4)
            b.PrependUOffsetTRelativeSlot(0, fn, 0)
            b.PrependInt32Slot(1, f.lineno, 0)
            b.PrependUOffsetTRelativeSlot(2, nm, 0)
            b.PrependUOffsetTRelativeSlot(3, cx, 0)
            frames.append(b.EndObject())
        items = self.tables(frames)
        b.StartObject(1)
        b.PrependUOffsetTRelativeSlot(0, items, 0)
        return int(b.EndObject())

    def chain(self, c: s.Chain) -> int:
        b = self.b
        inputs = self.scalars("i", c.inputs)
        outputs = self.scalars("i", c.outputs)
        instrs = self.tables([self.instruction(i) for i in c.instructions])
        stack = 0
        if c.stacktrace is not None:
            stack = self.tables([self.frame_list(fl) for fl in c.stacktrace])
        b.StartObject(4)
        b.PrependUOffsetTRelativeSlot(0, inputs, 0)
        b.PrependUOffsetTRelativeSlot(1, outputs, 0)
        b.PrependUOffsetTRelativeSlot(2, instrs, 0)
        b.PrependUOffsetTRelativeSlot(3, stack, 0)
        return int(b.EndObject())

    def delegate(self, d: s.BackendDelegate) -> int:
        b = self.b
        ident = self.string(d.id)
        specs = []
        for cs in d.compile_specs:
            key = self.string(cs.key)
            value = self.scalars("B", cs.value)
            b.StartObject(2)
            b.PrependUOffsetTRelativeSlot(0, key, 0)
            b.PrependUOffsetTRelativeSlot(1, value, 0)
            specs.append(b.EndObject())
        spec_vec = self.tables(specs)
        b.StartObject(2)
        b.PrependInt8Slot(0, int(d.processed.location), 0)
        b.PrependUint32Slot(1, d.processed.index, 0)
        processed = b.EndObject()
        b.StartObject(3)
        b.PrependUOffsetTRelativeSlot(0, ident, 0)
        b.PrependUOffsetTRelativeSlot(1, processed, 0)
        b.PrependUOffsetTRelativeSlot(2, spec_vec, 0)
        return int(b.EndObject())

    def plan(self, p: s.ExecutionPlan) -> int:
        b = self.b
        name = self.string(p.name)
        meta = 0
        if p.container_meta_type is not None:
            inp = self.string(p.container_meta_type.encoded_inp_str)
            out = self.string(p.container_meta_type.encoded_out_str)
            b.StartObject(2)
            b.PrependUOffsetTRelativeSlot(0, inp, 0)
            b.PrependUOffsetTRelativeSlot(1, out, 0)
            meta = b.EndObject()
        values = self.tables([self.evalue(v) for v in p.values])
        inputs = self.scalars("i", p.inputs)
        outputs = self.scalars("i", p.outputs)
        chains = self.tables([self.chain(c) for c in p.chains])
        ops = []
        for op in p.operators:
            on = self.string(op.name)
            ov = self.string(op.overload)
            b.StartObject(2)
            b.PrependUOffsetTRelativeSlot(0, on, 0)
            b.PrependUOffsetTRelativeSlot(1, ov, 0)
            ops.append(b.EndObject())
        operators = self.tables(ops)
        delegates = self.tables([self.delegate(d) for d in p.delegates])
        sizes = self.scalars("q", p.non_const_buffer_sizes)
        devices = 0
        if p.non_const_buffer_device is not None:
            devs = []
            for dv in p.non_const_buffer_device:
                b.StartObject(3)
                b.PrependInt32Slot(0, dv.buffer_idx, 0)
                b.PrependInt8Slot(1, int(dv.device_type), 0)
                b.PrependInt8Slot(2, dv.device_index, 0)
                devs.append(b.EndObject())
            devices = self.tables(devs)
        b.StartObject(10)
        b.PrependUOffsetTRelativeSlot(0, name, 0)
        b.PrependUOffsetTRelativeSlot(1, meta, 0)
        b.PrependUOffsetTRelativeSlot(2, values, 0)
        b.PrependUOffsetTRelativeSlot(3, inputs, 0)
        b.PrependUOffsetTRelativeSlot(4, outputs, 0)
        b.PrependUOffsetTRelativeSlot(5, chains, 0)
        b.PrependUOffsetTRelativeSlot(6, operators, 0)
        b.PrependUOffsetTRelativeSlot(7, delegates, 0)
        b.PrependUOffsetTRelativeSlot(8, sizes, 0)
        b.PrependUOffsetTRelativeSlot(9, devices, 0)
        return int(b.EndObject())

    def subsegment_offsets(self, so: s.SubsegmentOffsets) -> int:
        b = self.b
        offsets = self.scalars("Q", so.offsets)
        b.StartObject(2)
        b.PrependUint32Slot(0, so.segment_index, 0)
        b.PrependUOffsetTRelativeSlot(1, offsets, 0)
        return int(b.EndObject())

    def program(self, p: s.Program) -> int:
        b = self.b
        plans = self.tables([self.plan(x) for x in p.execution_plan])
        bufs = []
        for buf in p.constant_buffer:
            data = self.blob(buf.storage, self.tensor_align)
            b.StartObject(1)
            b.PrependUOffsetTRelativeSlot(0, data, 0)
            bufs.append(b.EndObject())
        constant_buffer = self.tables(bufs)
        inl = []
        for d in p.backend_delegate_data:
            data = self.blob(d.data, self.delegate_align)
            b.StartObject(1)
            b.PrependUOffsetTRelativeSlot(0, data, 0)
            inl.append(b.EndObject())
        delegate_data = self.tables(inl)
        segs = []
        for seg in p.segments:
            b.StartObject(2)
            b.PrependUint64Slot(0, seg.offset, 0)
            b.PrependUint64Slot(1, seg.size, 0)
            segs.append(b.EndObject())
        segments = self.tables(segs)
        constant_segment = 0
        if p.constant_segment is not None:
            constant_segment = self.subsegment_offsets(p.constant_segment)
        mutable = 0
        if p.mutable_data_segments is not None:
            mutable = self.tables([self.subsegment_offsets(x) for x in p.mutable_data_segments])
        named = 0
        if p.named_data is not None:
            entries = []
            for nd in p.named_data:
                key = self.string(nd.key)
                b.StartObject(2)
                b.PrependUOffsetTRelativeSlot(0, key, 0)
                b.PrependUint32Slot(1, nd.segment_index, 0)
                entries.append(b.EndObject())
            named = self.tables(entries)
        b.StartObject(8)
        b.PrependUint32Slot(0, p.version, 0)
        b.PrependUOffsetTRelativeSlot(1, plans, 0)
        b.PrependUOffsetTRelativeSlot(2, constant_buffer, 0)
        b.PrependUOffsetTRelativeSlot(3, delegate_data, 0)
        b.PrependUOffsetTRelativeSlot(4, segments, 0)
        b.PrependUOffsetTRelativeSlot(5, constant_segment, 0)
        b.PrependUOffsetTRelativeSlot(6, mutable, 0)
        b.PrependUOffsetTRelativeSlot(7, named, 0)
        return int(b.EndObject())


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
