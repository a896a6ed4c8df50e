"""Frozen msgspec mirror of ExecuTorch's `program.fbs` (the `.pte` flatbuffer schema, ET12).

One Struct per flatbuffer table, same names, same field order as program.fbs (field position is the
flatbuffer slot id; a union field occupies two slots, its type tag then its value). References between
entries are int indices, as in the file. Vectors are tuples; byte payloads that may be large
(`Buffer.storage`, `BackendDelegateInlineData.data`) are `texir.ir.Blob` views, never copies.

Fields that ExecuTorch's exporter leaves out when they are None are `X | None = None` here; fields the
1.5.1 runtime requires are plain values (absent in a file decodes as the empty value).

`PteProgram` is the file-level container the emitter produces and `texir.serialize.pte.loads` returns;
`PteFile` is the raw, as-stored view (segments and header) used by `inspect`. The enums and the
members of `union KernelTypes` live in texir.serialize.pte.evalue and are re-exported here.
"""

from __future__ import annotations

from typing import Final

from msgspec import Struct

from texir.ir.blob import Blob
from texir.serialize.pte.evalue import (  # program.fbs' enums and KernelTypes members, re-exported
    KERNEL_TYPES, AllocationDetails, Bool, DataLocation, DeviceType, Double, ExtraTensorInfo, Int, IntList,
    BoolList, DoubleList, KernelTypes, Null, OptionalTensorList, ScalarType, String, Tensor, TensorDataLocation,
    TensorList, TensorShapeDynamism, _Table,
)

__all__ = [
    "PtdEntry",
    "PtdFile",
    "TensorLayout",
    "SCHEMA_FILE_IDENTIFIER",
    "EXTENDED_HEADER_MAGIC",
    "ScalarType",
    "TensorShapeDynamism",
    "TensorDataLocation",
    "DeviceType",
    "DataLocation",
    "ContainerMetadata",
    "Null",
    "AllocationDetails",
    "ExtraTensorInfo",
    "Tensor",
    "Int",
    "Bool",
    "Double",
    "String",
    "IntList",
    "DoubleList",
    "BoolList",
    "TensorList",
    "OptionalTensorList",
    "KernelTypes",
    "KERNEL_TYPES",
    "EValue",
    "Operator",
    "KernelCall",
    "DelegateCall",
    "MoveCall",
    "JumpFalseCall",
    "FreeCall",
    "InstructionArguments",
    "INSTRUCTION_ARGUMENTS",
    "Instruction",
    "Frame",
    "FrameList",
    "BackendDelegateDataReference",
    "CompileSpec",
    "BackendDelegate",
    "Chain",
    "ExecutionPlan",
    "NonConstBufferDevice",
    "Buffer",
    "BackendDelegateInlineData",
    "DataSegment",
    "SubsegmentOffsets",
    "NamedData",
    "Program",
    "NamedBlob",
    "PteProgram",
    "ExtendedHeader",
    "PteFile",
]

SCHEMA_FILE_IDENTIFIER: Final = b"ET12"
"""`file_identifier` of program.fbs; the 1.5.1 runtime accepts exactly this."""

EXTENDED_HEADER_MAGIC: Final = b"eh00"


# --- tables, in program.fbs order ---------------------------------------------------------------


class ContainerMetadata(_Table, frozen=True, kw_only=True):
    """See program.fbs `table ContainerMetadata`: pytree specs of the method's inputs/outputs."""

    encoded_inp_str: str = ""
    encoded_out_str: str = ""


class EValue(_Table, frozen=True, kw_only=True):
    """See program.fbs `table EValue` (slots: val_type, val)."""

    val: KernelTypes


class Operator(_Table, frozen=True, kw_only=True):
    """See program.fbs `table Operator`: e.g. name "aten::add", overload "out" ("" for default)."""

    name: str
    overload: str = ""


class _InstructionArgument(Struct, frozen=True, kw_only=True, tag_field="kind"):
    """Base of the members of the `InstructionArguments` union (tag = member name)."""


class KernelCall(_InstructionArgument, frozen=True, kw_only=True, tag=True):
    """See program.fbs `table KernelCall`: every schema argument, then the return slot."""

    op_index: int
    args: tuple[int, ...]


class DelegateCall(_InstructionArgument, frozen=True, kw_only=True, tag=True):
    """See program.fbs `table DelegateCall`: args are the inputs followed by the outputs."""

    delegate_index: int
    args: tuple[int, ...]


class MoveCall(_InstructionArgument, frozen=True, kw_only=True, tag=True):
    """See program.fbs `table MoveCall`."""

    move_from: int
    move_to: int


class JumpFalseCall(_InstructionArgument, frozen=True, kw_only=True, tag=True):
    """See program.fbs `table JumpFalseCall`."""

    cond_value_index: int
    destination_instruction: int


class FreeCall(_InstructionArgument, frozen=True, kw_only=True, tag=True):
    """See program.fbs `table FreeCall`."""

    value_index: int


InstructionArguments = KernelCall | DelegateCall | MoveCall | JumpFalseCall | FreeCall
"""See program.fbs `union InstructionArguments`."""

INSTRUCTION_ARGUMENTS: Final[tuple[type[_InstructionArgument], ...]] = (
    KernelCall,
    DelegateCall,
    MoveCall,
    JumpFalseCall,
    FreeCall,
)
"""Members in union order: the flatbuffer type tag of `INSTRUCTION_ARGUMENTS[i]` is `i + 1`."""


class Instruction(_Table, frozen=True, kw_only=True):
    """See program.fbs `table Instruction` (slots: instr_args_type, instr_args)."""

    instr_args: InstructionArguments


class Frame(_Table, frozen=True, kw_only=True):
    """See program.fbs `table Frame`."""

    filename: str | None = None
    lineno: int = 0
    name: str | None = None
    context: str | None = None


class FrameList(_Table, frozen=True, kw_only=True):
    """See program.fbs `table FrameList`."""

    items: tuple[Frame, ...] = ()


class BackendDelegateDataReference(_Table, frozen=True, kw_only=True):
    """See program.fbs `table BackendDelegateDataReference`.

    INLINE: index into `Program.backend_delegate_data`; SEGMENT: index into `Program.segments`.
    """

    location: DataLocation = DataLocation.INLINE
    index: int = 0


class CompileSpec(_Table, frozen=True, kw_only=True):
    """See program.fbs `table CompileSpec`."""

    key: str
    value: bytes


class BackendDelegate(_Table, frozen=True, kw_only=True):
    """See program.fbs `table BackendDelegate`: `id` names a backend registered in the runtime."""

    id: str
    processed: BackendDelegateDataReference
    compile_specs: tuple[CompileSpec, ...] = ()


class Chain(_Table, frozen=True, kw_only=True):
    """See program.fbs `table Chain` (the runtime ignores inputs and outputs)."""

    inputs: tuple[int, ...] = ()
    outputs: tuple[int, ...] = ()
    instructions: tuple[Instruction, ...] = ()
    stacktrace: tuple[FrameList, ...] | None = None


class ExecutionPlan(_Table, frozen=True, kw_only=True):
    """See program.fbs `table ExecutionPlan`: one method. `non_const_buffer_sizes[0]` is reserved (0)."""

    name: str
    container_meta_type: ContainerMetadata | None = None
    values: tuple[EValue, ...] = ()
    inputs: tuple[int, ...] = ()
    outputs: tuple[int, ...] = ()
    chains: tuple[Chain, ...] = ()
    operators: tuple[Operator, ...] = ()
    delegates: tuple[BackendDelegate, ...] = ()
    non_const_buffer_sizes: tuple[int, ...] = ()
    non_const_buffer_device: tuple[NonConstBufferDevice, ...] | None = None


class NonConstBufferDevice(_Table, frozen=True, kw_only=True):
    """See program.fbs `table NonConstBufferDevice` (buffer_idx is 1-based like the sizes)."""

    buffer_idx: int
    device_type: DeviceType = DeviceType.CPU
    device_index: int = 0


class Buffer(_Table, frozen=True, kw_only=True):
    """See program.fbs `table Buffer` (storage is force_align'ed to constant_tensor_alignment)."""

    storage: Blob


class BackendDelegateInlineData(_Table, frozen=True, kw_only=True):
    """See program.fbs `table BackendDelegateInlineData` (data is force_align'ed to delegate_alignment)."""

    data: Blob


class DataSegment(_Table, frozen=True, kw_only=True):
    """See program.fbs `table DataSegment`: offset is relative to the segment base offset."""

    offset: int
    size: int


class SubsegmentOffsets(_Table, frozen=True, kw_only=True):
    """See program.fbs `table SubsegmentOffsets`: offsets relative to the start of the segment."""

    segment_index: int
    offsets: tuple[int, ...]


class NamedData(_Table, frozen=True, kw_only=True):
    """See program.fbs `table NamedData`."""

    key: str
    segment_index: int


class Program(_Table, frozen=True, kw_only=True):
    """See program.fbs `table Program` (the root; `version` must be 0 for the 1.5.1 runtime)."""

    version: int = 0
    execution_plan: tuple[ExecutionPlan, ...] = ()
    constant_buffer: tuple[Buffer, ...] = ()
    backend_delegate_data: tuple[BackendDelegateInlineData, ...] = ()
    segments: tuple[DataSegment, ...] = ()
    constant_segment: SubsegmentOffsets | None = None
    mutable_data_segments: tuple[SubsegmentOffsets, ...] | None = None
    named_data: tuple[NamedData, ...] | None = None


# --- file-level containers (texir's, not in program.fbs) ----------------------------------------


class NamedBlob(_Table, frozen=True, kw_only=True):
    """A named-data payload (`NamedData.key` plus its bytes), stored in its own segment. Keys with
    equal payloads share one segment, placed at a multiple of lcm(segment alignment, `alignment`).
    The file does not record `alignment`: `loads` gives 1."""

    key: str
    data: Blob
    alignment: int = 1


# --- .ptd (flat_tensor.fbs) ---------------------------------------------------------------------


class TensorLayout(_Table, frozen=True, kw_only=True):
    """How an entry's bytes are a tensor (flat_tensor.fbs `TensorLayout`)."""

    scalar_type: ScalarType
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]


class PtdEntry(_Table, frozen=True, kw_only=True):
    """One named payload. `alignment` is what the writer honours (it is not stored in the file;
    a decoded entry reports 1)."""

    key: str
    data: Blob
    alignment: int = 1
    layout: TensorLayout | None = None


class PtdFile(_Table, frozen=True, kw_only=True):
    """A `.ptd` file's contents (flat_tensor.fbs): entries in file order, keys unique. `tag` names
    the file (ExecuTorch writes `<tag>.ptd`); it is not stored inside it."""

    tag: str = ""
    entries: tuple[PtdEntry, ...]
    segment_alignment: int = 128

    def entry(self, key: str) -> PtdEntry:
        for e in self.entries:
            if e.key == key:
                return e
        raise KeyError(key)


class PteProgram(_Table, frozen=True, kw_only=True):
    """A `.pte` program in its logical form, independent of the on-disk segment layout.

    Invariant (what the emitter produces and `loads` returns, like ExecuTorch's emitter output):
    - `program.constant_buffer` holds every constant payload, entry 0 the empty placeholder; a
      Tensor's `data_buffer_idx` indexes it. Each entry is exactly the tensor's bytes (no padding).
    - every delegate is `processed=INLINE` into `program.backend_delegate_data`, whose entries are
      distinct and ordered by first reference (plans in order, delegates in order).
    - `program.segments == ()`, `program.constant_segment is None`, `program.mutable_data_segments is
      None` and `program.named_data is None`: the codec derives them from the options at dumps time.
    - `mutable_data` holds the initial values of planned mutable tensors (entry 0 the placeholder),
      or is empty; `named_data` holds named payloads in key order of first appearance.

    For such a value, `loads(dumps(x, options)) == x` for any options, and for bytes texir wrote with
    options `o`, `dumps(loads(b), o) == b`.
    """

    program: Program
    mutable_data: tuple[Buffer, ...] = ()
    named_data: tuple[NamedBlob, ...] = ()
    external: tuple[PtdFile, ...] = ()
    """The `.ptd` files the program's EXTERNAL tensors and external named data live in, by tag
    (sorted). Not part of the `.pte` bytes: `dumps`/`dump` leave them out and `loads` returns none;
    write them with `texir.serialize.pte.ptd.dump_ptd`."""


class ExtendedHeader(_Table, frozen=True, kw_only=True):
    """The `eh00` header at file offset 8 (32 bytes, little-endian, padded to the max force_align)."""

    program_size: int
    segment_base_offset: int
    segment_data_size: int
    header_length: int = 32


class PteFile(_Table, frozen=True, kw_only=True):
    """A `.pte` file as stored: the raw root table, the header and the segment payloads (views)."""

    program: Program
    header: ExtendedHeader | None
    segment_data: tuple[Blob, ...]
    """Payload of `program.segments[i]`, without padding."""
    file_size: int
    flatbuffer_size: int
    """Bytes `[0, flatbuffer_size)` hold the flatbuffer (with the inserted header)."""
