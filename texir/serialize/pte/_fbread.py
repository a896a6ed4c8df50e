"""A bounds-checked reader of the ET12 flatbuffer into `schema.Program` (never trusts an offset).

The bounds-checked primitives are texir.serialize.fb_reader's; this module adds program.fbs' tables.
Tables and vectors reached twice (the encoder shares equal ones) are decoded once.
"""

from __future__ import annotations

from texir.serialize.fb_reader import BOOL, F64, I64, U32, U64, U8, FbReader, PteDecodeError, Tab
from texir.serialize.pte import schema as s

__all__ = ["PteDecodeError", "decode_program"]


class _Reader(FbReader):
    """program.fbs' tables over the bounds-checked primitives."""

    __slots__ = ()

    # -- tables ---------------------------------------------------------------------------------

    def evalue(self, pos: int, where: str) -> s.EValue:
        key = ("ev", pos)
        hit = self.memo.get(key)
        if hit is not None:
            return hit  # type: ignore[return-value]  # memo stores what this function returned
        t = self.table(pos, where)
        tag = int(self.scalar(t, 0, U8, 0, where))  # type: ignore[call-overload]  # u8
        if tag < 1 or tag > len(s.KERNEL_TYPES):
            self.fail(where, f"EValue.val_type {tag} is not a KernelTypes member (1..11)")
        vp = self.ref(t, 1, where)
        cls = s.KERNEL_TYPES[tag - 1]
        if vp < 0:
            if cls is s.Null:
                ev = s.EValue(val=s.Null())
                self.memo[key] = ev
                return ev
            self.fail(where, f"EValue of kind {cls.__name__} has no val table")
        ev = s.EValue(val=self.kernel_type(cls, vp, where))
        self.memo[key] = ev
        return ev

    def kernel_type(self, cls: type, pos: int, where: str) -> s.KernelTypes:
        t = self.table(pos, where)
        if cls is s.Tensor:
            return self.tensor(t, where)
        if cls is s.Int:
            return s.Int(int_val=int(self.scalar(t, 0, I64, 0, where)))  # type: ignore[call-overload]  # i64
        if cls is s.Null:
            return s.Null()
        if cls is s.Bool:
            return s.Bool(bool_val=bool(self.scalar(t, 0, BOOL, False, where)))
        if cls is s.Double:
            return s.Double(double_val=float(self.scalar(t, 0, F64, 0.0, where)))  # type: ignore[arg-type]  # f64
        if cls is s.String:
            text = self.req_string(t, 0, where + ".string_val")
            return s.String(string_val=text)
        if cls is s.IntList:
            return s.IntList(items=self.list_items(t, "q", 8, where))
        if cls is s.DoubleList:
            return s.DoubleList(items=self.list_items(t, "d", 8, where))
        if cls is s.BoolList:
            return s.BoolList(items=self.list_items(t, "?", 1, where))  # type: ignore[arg-type]  # bools
        if cls is s.TensorList:
            return s.TensorList(items=self.list_items(t, "i", 4, where))
        return s.OptionalTensorList(items=self.list_items(t, "i", 4, where))

    def list_items(self, t: Tab, code: str, elem: int, where: str) -> tuple[int, ...]:
        p = self.ref(t, 0, where)
        if p < 0:
            self.fail(where, "list value has no items vector")
        return self.scalars(p, code, elem, where + ".items")  # type: ignore[return-value]  # by code

    def tensor(self, t: Tab, where: str) -> s.Tensor:
        w = where + ".Tensor"
        st = self.i8(t, 0, w)
        try:
            scalar_type = s.ScalarType(st)
        except ValueError:
            self.fail(w, f"scalar_type {st} is not a ScalarType of scalar_type.fbs")
        dyn = self.i8(t, 8, w)
        try:
            dynamism = s.TensorShapeDynamism(dyn)
        except ValueError:
            self.fail(w, f"shape_dynamism {dyn} is not a TensorShapeDynamism")
        alloc = None
        ap = self.ref(t, 6, w)
        if ap >= 0:
            at = self.table(ap, w + ".allocation_info")
            alloc = s.AllocationDetails(
                memory_id=self.u32(at, 0, w),
                memory_offset_low=self.u32(at, 1, w),
                memory_offset_high=self.u32(at, 2, w),
            )
        extra = None
        ep = self.ref(t, 9, w)
        if ep >= 0:
            extra = self.extra_tensor_info(self.table(ep, w + ".extra_tensor_info"), w)
        return s.Tensor(
            scalar_type=scalar_type,
            storage_offset=self.i32(t, 1, w),
            sizes=self.ints(t, 2, "i", 4, w + ".sizes"),
            dim_order=self.ints(t, 3, "B", 1, w + ".dim_order"),
            requires_grad=bool(self.scalar(t, 4, BOOL, False, w)),
            data_buffer_idx=self.u32(t, 5, w),
            allocation_info=alloc,
            layout=self.i8(t, 7, w),
            shape_dynamism=dynamism,
            extra_tensor_info=extra,
        )

    def extra_tensor_info(self, t: Tab, where: str) -> s.ExtraTensorInfo:
        loc, dev = self.i8(t, 2, where), self.i8(t, 3, where)
        try:
            location, device = s.TensorDataLocation(loc), s.DeviceType(dev)
        except ValueError:
            self.fail(where, f"extra_tensor_info location {loc} / device_type {dev} out of range")
        return s.ExtraTensorInfo(
            mutable_data_segments_idx=int(self.scalar(t, 0, U64, 0, where)),  # type: ignore[call-overload]  # u64
            fully_qualified_name=self.string(t, 1, where),
            location=location,
            device_type=device,
            device_index=self.i8(t, 4, where),
        )

    def instruction(self, pos: int, where: str) -> s.Instruction:
        t = self.table(pos, where)
        tag = int(self.scalar(t, 0, U8, 0, where))  # type: ignore[call-overload]  # u8
        if tag < 1 or tag > len(s.INSTRUCTION_ARGUMENTS):
            self.fail(where, f"Instruction.instr_args_type {tag} is not an InstructionArguments member")
        ap = self.ref(t, 1, where)
        if ap < 0:
            self.fail(where, "Instruction has no instr_args table")
        a = self.table(ap, where)
        args: s.InstructionArguments
        if tag == 1:
            args = s.KernelCall(op_index=self.i32(a, 0, where), args=self.call_args(a, where))
        elif tag == 2:
            args = s.DelegateCall(delegate_index=self.i32(a, 0, where), args=self.call_args(a, where))
        elif tag == 3:
            args = s.MoveCall(move_from=self.i32(a, 0, where), move_to=self.i32(a, 1, where))
        elif tag == 4:
            args = s.JumpFalseCall(
                cond_value_index=self.i32(a, 0, where), destination_instruction=self.i32(a, 1, where)
            )
        else:
            args = s.FreeCall(value_index=self.i32(a, 0, where))
        return s.Instruction(instr_args=args)

    def call_args(self, t: Tab, where: str) -> tuple[int, ...]:
        p = self.ref(t, 1, where)
        if p < 0:
            self.fail(where, "call has no args vector")
        return self.scalars(p, "i", 4, where + ".args")  # type: ignore[return-value]  # ints

    def chain(self, pos: int, where: str) -> s.Chain:
        t = self.table(pos, where)
        stack = None
        if self.ref(t, 3, where) >= 0:
            stack = tuple(
                self.frame_list(p, f"{where}.stacktrace[{i}]")
                for i, p in enumerate(self.table_list(t, 3, where))
            )
        return s.Chain(
            inputs=self.ints(t, 0, "i", 4, where + ".inputs"),
            outputs=self.ints(t, 1, "i", 4, where + ".outputs"),
            instructions=tuple(
                self.instruction(p, f"{where}.instructions[{i}]")
                for i, p in enumerate(self.table_list(t, 2, where))
            ),
            stacktrace=stack,
        )

    def frame_list(self, pos: int, where: str) -> s.FrameList:
        t = self.table(pos, where)
        frames = []
        for p in self.table_list(t, 0, where):
            f = self.table(p, where)
            frames.append(
                s.Frame(
                    filename=self.string(f, 0, where),
                    lineno=self.i32(f, 1, where),
                    name=self.string(f, 2, where),
                    context=self.string(f, 3, where),
                )
            )
        return s.FrameList(items=tuple(frames))

    def delegate(self, pos: int, where: str) -> s.BackendDelegate:
        t = self.table(pos, where)
        ident = self.req_string(t, 0, where + ".id")
        pp = self.ref(t, 1, where)
        if pp < 0:
            self.fail(where, "BackendDelegate.processed is missing")
        pt = self.table(pp, where + ".processed")
        loc = self.i8(pt, 0, where)
        try:
            location = s.DataLocation(loc)
        except ValueError:
            self.fail(where, f"processed.location {loc} is not a DataLocation")
        specs = []
        for i, p in enumerate(self.table_list(t, 2, where)):
            w = f"{where}.compile_specs[{i}]"
            ct = self.table(p, w)
            key = self.req_string(ct, 0, w)
            value = bytes(self.ints(ct, 1, "B", 1, w))
            specs.append(s.CompileSpec(key=key, value=value))
        return s.BackendDelegate(
            id=ident,
            processed=s.BackendDelegateDataReference(location=location, index=self.u32(pt, 1, where)),
            compile_specs=tuple(specs),
        )

    def plan(self, pos: int, where: str) -> s.ExecutionPlan:
        t = self.table(pos, where)
        name = self.req_string(t, 0, where + ".name")
        where = f"ExecutionPlan {name!r}"
        meta = None
        mp = self.ref(t, 1, where)
        if mp >= 0:
            mt = self.table(mp, where + ".container_meta_type")
            meta = s.ContainerMetadata(
                encoded_inp_str=self.string(mt, 0, where) or "",
                encoded_out_str=self.string(mt, 1, where) or "",
            )
        values = tuple(
            self.evalue(p, f"{where}.values[{i}]") for i, p in enumerate(self.table_list(t, 2, where))
        )
        ops = []
        for i, p in enumerate(self.table_list(t, 6, where)):
            w = f"{where}.operators[{i}]"
            ot = self.table(p, w)
            op_name = self.req_string(ot, 0, w + ".name")
            ops.append(s.Operator(name=op_name, overload=self.string(ot, 1, w) or ""))
        devices = None
        if self.ref(t, 9, where) >= 0:
            devs = []
            for i, p in enumerate(self.table_list(t, 9, where)):
                w = f"{where}.non_const_buffer_device[{i}]"
                dt = self.table(p, w)
                dev = self.i8(dt, 1, w)
                try:
                    device = s.DeviceType(dev)
                except ValueError:
                    self.fail(w, f"device_type {dev} is not a DeviceType")
                devs.append(
                    s.NonConstBufferDevice(
                        buffer_idx=self.i32(dt, 0, w), device_type=device, device_index=self.i8(dt, 2, w)
                    )
                )
            devices = tuple(devs)
        return s.ExecutionPlan(
            name=name,
            container_meta_type=meta,
            values=values,
            inputs=self.ints(t, 3, "i", 4, where + ".inputs"),
            outputs=self.ints(t, 4, "i", 4, where + ".outputs"),
            chains=tuple(
                self.chain(p, f"{where}.chains[{i}]") for i, p in enumerate(self.table_list(t, 5, where))
            ),
            operators=tuple(ops),
            delegates=tuple(
                self.delegate(p, f"{where}.delegates[{i}]")
                for i, p in enumerate(self.table_list(t, 7, where))
            ),
            non_const_buffer_sizes=self.ints(t, 8, "q", 8, where + ".non_const_buffer_sizes"),
            non_const_buffer_device=devices,
        )

    def subsegment_offsets(self, pos: int, where: str) -> s.SubsegmentOffsets:
        t = self.table(pos, where)
        return s.SubsegmentOffsets(
            segment_index=self.u32(t, 0, where), offsets=self.ints(t, 1, "Q", 8, where + ".offsets")
        )

    def program(self, pos: int) -> s.Program:
        where = "Program"
        t = self.table(pos, where)
        version = self.u32(t, 0, where)
        if version != 0:
            raise PteDecodeError(
                f"Program.version is {version}; texir reads schema version 0 (ExecuTorch 1.5.1) only"
            )
        plans = tuple(
            self.plan(p, f"Program.execution_plan[{i}]")
            for i, p in enumerate(self.table_list(t, 1, where))
        )
        bufs = tuple(
            s.Buffer(storage=self.blob(self.table(p, f"Program.constant_buffer[{i}]"), 0, where))
            for i, p in enumerate(self.table_list(t, 2, where))
        )
        inline = tuple(
            s.BackendDelegateInlineData(
                data=self.blob(self.table(p, f"Program.backend_delegate_data[{i}]"), 0, where)
            )
            for i, p in enumerate(self.table_list(t, 3, where))
        )
        segs = []
        for i, p in enumerate(self.table_list(t, 4, where)):
            st = self.table(p, f"Program.segments[{i}]")
            segs.append(
                s.DataSegment(
                    offset=int(self.scalar(st, 0, U64, 0, where)),  # type: ignore[call-overload]  # u64
                    size=int(self.scalar(st, 1, U64, 0, where)),  # type: ignore[call-overload]  # u64
                )
            )
        cp = self.ref(t, 5, where)
        constant_segment = self.subsegment_offsets(cp, "Program.constant_segment") if cp >= 0 else None
        mutable = None
        if self.ref(t, 6, where) >= 0:
            mutable = tuple(
                self.subsegment_offsets(p, f"Program.mutable_data_segments[{i}]")
                for i, p in enumerate(self.table_list(t, 6, where))
            )
        named = None
        if self.ref(t, 7, where) >= 0:
            entries = []
            for i, p in enumerate(self.table_list(t, 7, where)):
                w = f"Program.named_data[{i}]"
                nt = self.table(p, w)
                key = self.req_string(nt, 0, w + ".key")
                entries.append(s.NamedData(key=key, segment_index=self.u32(nt, 1, w)))
            named = tuple(entries)
        return s.Program(
            version=version,
            execution_plan=plans,
            constant_buffer=bufs,
            backend_delegate_data=inline,
            segments=tuple(segs),
            constant_segment=constant_segment,
            mutable_data_segments=mutable,
            named_data=named,
        )


def decode_program(data: memoryview, size: int) -> s.Program:
    """Decode the root Program of the flatbuffer in `data[:size]` (identifier already checked)."""
    if size < 8:
        raise PteDecodeError(f"flatbuffer of {size} bytes is too short (need at least 8)")
    reader = _Reader(data, size)
    root: int = U32.unpack_from(data, 0)[0]
    return reader.program(root)
