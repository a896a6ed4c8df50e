"""Encode and decode `.pte` files: flatbuffer, `eh00` extended header and data segments.

`dumps`/`dump` take a `PteProgram` in its logical form (see its docstring) and lay it out as
ExecuTorch 1.5.1's `serialize_pte_binary` does: constant segment (padded entries), mutable-data
segment, extracted delegate blobs (deduplicated), named data; `loads` inverts that layout and
`read_pte` returns the file as stored (used by `texir inspect`).
"""

from __future__ import annotations

import itertools
import math
import os
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

import msgspec
from pydantic import BaseModel, ConfigDict, Field, field_validator

from texir._io import atomic_write
from texir.errors import PteError
from texir.ir.blob import Blob, resolve_digests
from texir.ir.types import Program
from texir.serialize.pte import schema as s
from texir.serialize.pte.check import check_indices
from texir.serialize.pte._fbread import PteDecodeError, decode_program
from texir.serialize.pte._fbwrite import PteArgumentError, PteEncodeError, encode_program
from texir.serialize.fb_reader import file_view

__all__ = [
    "PteOptions",
    "PteArgumentError",
    "PteDecodeError",
    "PteEncodeError",
    "dumps",
    "dump",
    "loads",
    "load",
    "read_pte",
    "to_logical",
    "iter_chunks",
    "ELEMENT_SIZE",
    "tensor_nbytes",
]

_HEADER = struct.Struct("<4sIQQQ")
_HEADER_LENGTH = 32
_ZEROS = bytes(4096)

ELEMENT_SIZE: dict[s.ScalarType, int] = {
    s.ScalarType.BYTE: 1,
    s.ScalarType.CHAR: 1,
    s.ScalarType.SHORT: 2,
    s.ScalarType.INT: 4,
    s.ScalarType.LONG: 8,
    s.ScalarType.HALF: 2,
    s.ScalarType.FLOAT: 4,
    s.ScalarType.DOUBLE: 8,
    s.ScalarType.COMPLEX64: 8,
    s.ScalarType.COMPLEX128: 16,
    s.ScalarType.BOOL: 1,
    s.ScalarType.QINT8: 1,
    s.ScalarType.QUINT8: 1,
    s.ScalarType.QINT32: 4,
    s.ScalarType.BFLOAT16: 2,
    s.ScalarType.QUINT4X2: 1,
    s.ScalarType.QUINT2X4: 1,
    s.ScalarType.BITS16: 2,
    s.ScalarType.FLOAT8E5M2: 1,
    s.ScalarType.FLOAT8E4M3FN: 1,
    s.ScalarType.FLOAT8E5M2FNUZ: 1,
    s.ScalarType.FLOAT8E4M3FNUZ: 1,
    s.ScalarType.UINT16: 2,
    s.ScalarType.UINT32: 4,
    s.ScalarType.UINT64: 8,
}
"""Bytes per element of each ScalarType (the C type's size, as the runtime computes nbytes)."""


def tensor_nbytes(t: s.Tensor) -> int:
    """numel x element size of a (contiguous) Tensor's sizes."""
    return math.prod(t.sizes) * ELEMENT_SIZE[t.scalar_type]


class PteOptions(BaseModel):
    """Layout options of `dumps`/`dump`; defaults are ExecuTorch 1.5.1's `ExecutorchBackendConfig`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    segment_alignment: int = Field(default=128, description="alignment of each segment in the file")
    constant_tensor_alignment: int = Field(
        default=16, description="padding between constant tensors; force_align of Buffer.storage"
    )
    delegate_alignment: int = Field(
        default=16, description="force_align of inline delegate data (BackendDelegateInlineData.data)"
    )
    extract_delegate_segments: bool = Field(
        default=True, description="move non-empty delegate blobs out of the flatbuffer into segments"
    )

    @field_validator("segment_alignment", "constant_tensor_alignment", "delegate_alignment")
    @classmethod
    def _power_of_two(cls, value: int) -> int:
        if value <= 0 or value & (value - 1) or value > 1 << 20:
            raise ValueError(f"alignment must be a power of two between 1 and 2**20, got {value}")
        return value


_DEFAULT_OPTIONS = PteOptions()


def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


# --- encoding -------------------------------------------------------------------------------------


class _Segment(msgspec.Struct, frozen=True):
    chunks: tuple[memoryview, ...]
    size: int


def _concat(blobs: Iterable[Blob], pad_to: int) -> tuple[_Segment, tuple[int, ...]]:
    """ExecuTorch's constant-segment concatenation: pad after every entry except the last."""
    items = list(blobs)
    chunks: list[memoryview] = []
    offsets: list[int] = []
    pos = 0
    for i, blob in enumerate(items):
        offsets.append(pos)
        chunks.append(blob.view())
        pos += blob.nbytes
        if i < len(items) - 1 and pad_to > 1:
            pad = -pos % pad_to
            if pad:
                chunks.append(memoryview(bytes(pad)))
                pos += pad
    return _Segment(tuple(c for c in chunks if c.nbytes), pos), tuple(offsets)


def _check_logical(pte: s.PteProgram) -> None:
    p = pte.program
    if p.segments or p.constant_segment is not None or p.mutable_data_segments is not None:
        raise PteEncodeError(
            "dumps expects a PteProgram in logical form (segments=(), constant_segment=None, "
            "mutable_data_segments=None); pass what emit() or loads() returns, not a raw PteFile.program"
        )
    if p.named_data is not None:
        raise PteEncodeError("Program.named_data must be None; put named payloads in PteProgram.named_data")
    for plan in p.execution_plan:
        for i, d in enumerate(plan.delegates):
            ref = d.processed
            if ref.location != s.DataLocation.INLINE or ref.index >= len(p.backend_delegate_data):
                raise PteEncodeError(
                    f"ExecutionPlan {plan.name!r}.delegates[{i}] ({d.id}): processed must be INLINE with an "
                    f"index below len(backend_delegate_data)={len(p.backend_delegate_data)}, got {ref}"
                )


def _layout(pte: s.PteProgram, options: PteOptions) -> tuple[bytes, list[memoryview], int]:
    """(flatbuffer head incl. header and pre-segment padding, segment chunks, total file size)."""
    _check_logical(pte)
    program = pte.program
    segments: list[_Segment] = []
    seg_align: list[int] = []
    constant_segment = None
    constant_buffer = program.constant_buffer
    if constant_buffer:
        seg, offsets = _concat((b.storage for b in constant_buffer), options.constant_tensor_alignment)
        constant_segment = s.SubsegmentOffsets(segment_index=len(segments), offsets=offsets)
        constant_buffer = ()
        segments.append(seg)
    mutable_segments = None
    if pte.mutable_data:
        seg, offsets = _concat((b.storage for b in pte.mutable_data), 1)
        if seg.size:
            mutable_segments = (s.SubsegmentOffsets(segment_index=len(segments), offsets=offsets),)
            segments.append(seg)
    plans = program.execution_plan
    delegate_data = program.backend_delegate_data
    if options.extract_delegate_segments and any(plan.delegates for plan in plans):
        remaining: list[s.BackendDelegateInlineData] = []
        by_content: dict[Blob, int] = {}
        new_plans = []
        for plan in plans:
            new_delegates = []
            for d in plan.delegates:
                inline = delegate_data[d.processed.index]
                if inline.data.nbytes:
                    index = by_content.get(inline.data)
                    if index is None:
                        index = len(segments)
                        by_content[inline.data] = index
                        segments.append(_Segment((memoryview(resolve_digests(inline.data.view())),), inline.data.nbytes))
                    ref = s.BackendDelegateDataReference(location=s.DataLocation.SEGMENT, index=index)
                else:
                    ref = s.BackendDelegateDataReference(location=s.DataLocation.INLINE, index=len(remaining))
                    remaining.append(inline)
                new_delegates.append(msgspec.structs.replace(d, processed=ref))
            new_plans.append(msgspec.structs.replace(plan, delegates=tuple(new_delegates)))
        plans, delegate_data = tuple(new_plans), tuple(remaining)
    named = None
    align_of: dict[int, int] = {}
    if pte.named_data:
        entries = []
        # One segment per distinct payload: by content (a Blob compares its bytes), or, when some
        # digests are deferred (stand-ins compare unequal), by real digest, hashed now
        by_digest = any(nb.data.deferred for nb in pte.named_data)
        named_index: dict[object, int] = {}
        for nb in pte.named_data:
            if nb.alignment < 1:
                raise PteEncodeError(f"named data {nb.key!r}: alignment must be positive, got {nb.alignment}")
            content: object = (nb.data.content_digest(), nb.data.nbytes) if by_digest else nb.data
            index = named_index.get(content)
            if index is None:
                index = len(segments)
                named_index[content] = index
                segments.append(_Segment((nb.data.view(),) if nb.data.nbytes else (), nb.data.nbytes))
            align_of[index] = math.lcm(align_of.get(index, 1), nb.alignment)
            entries.append(s.NamedData(key=nb.key, segment_index=index))
        named = tuple(entries)

    table: list[s.DataSegment] = []
    chunks: list[memoryview] = []
    data_size = 0
    for i, seg in enumerate(segments):
        offset = _align(data_size, math.lcm(options.segment_alignment, align_of.get(i, 1)))
        if offset > data_size:
            chunks.append(memoryview(bytes(offset - data_size)))
        table.append(s.DataSegment(offset=offset, size=seg.size))
        chunks.extend(seg.chunks)
        data_size = offset + seg.size
    raw = msgspec.structs.replace(
        program,
        execution_plan=plans,
        constant_buffer=constant_buffer,
        backend_delegate_data=delegate_data,
        segments=tuple(table),
        constant_segment=constant_segment if constant_segment is not None else program.constant_segment,
        mutable_data_segments=mutable_segments,
        named_data=named,
    )
    fb = encode_program(
        raw,
        tensor_alignment=options.constant_tensor_alignment,
        delegate_alignment=options.delegate_alignment,
    )
    fb = bytes(resolve_digests(fb))  # named-data keys and inline delegates may name deferred digests
    if data_size == 0:
        return fb, [], len(fb)
    padded = _align(_HEADER_LENGTH, max(options.constant_tensor_alignment, options.delegate_alignment))
    program_size = len(fb) + padded
    base = _align(program_size, options.segment_alignment)
    (root,) = struct.unpack_from("<I", fb, 0)
    header = _HEADER.pack(s.EXTENDED_HEADER_MAGIC, _HEADER_LENGTH, program_size, base, data_size)
    head = b"".join(
        (
            struct.pack("<I", root + padded),
            fb[4:8],
            header,
            bytes(padded - _HEADER_LENGTH),
            fb[8:],
            bytes(base - program_size),
        )
    )
    return head, chunks, base + data_size


def iter_chunks(pte: s.PteProgram, options: PteOptions | None = None) -> Iterator[memoryview]:
    """The file's bytes as a sequence of views (no whole-file copy): what `dump` writes."""
    head, chunks, _ = _layout(pte, options or _DEFAULT_OPTIONS)
    yield memoryview(head)
    yield from chunks


def _check_argument(pte: object, function: str) -> None:
    if isinstance(pte, s.PteProgram):
        return
    if isinstance(pte, Program):
        raise PteArgumentError(
            f"pte.{function}() writes an emitted .pte program, not a texir.ir.Program; emit it first: "
            f"pte.{function}(texir.emit.emit(program){', path' if function == 'dump' else ''})"
        )
    raise PteArgumentError(f"pte.{function}() takes a PteProgram (what texir.emit.emit returns), not {type(pte).__name__}")


def dumps(pte: s.PteProgram, options: PteOptions | None = None) -> bytes:
    """The `.pte` bytes of `pte` (in logical form) laid out per `options` (ExecuTorch defaults)."""
    _check_argument(pte, "dumps")
    head, chunks, _ = _layout(pte, options or _DEFAULT_OPTIONS)
    if not chunks:
        return head
    return b"".join([head, *chunks])


def dump(pte: s.PteProgram, path: str | os.PathLike[str], options: PteOptions | None = None) -> None:
    """Write `pte` to `path` atomically, streaming tensor and delegate payloads from their views.

    The bytes go to a temporary file in the same directory, which replaces `path` only once fully
    written; on any failure it is removed and `path` is left untouched.
    """
    _check_argument(pte, "dump")
    check_indices(pte, PteEncodeError)
    head, chunks, size = _layout(pte, options or _DEFAULT_OPTIONS)
    atomic_write(path, itertools.chain((memoryview(head),), chunks), error=PteError, size_hint=size)


# --- decoding -------------------------------------------------------------------------------------


def read_pte(data: bytes | bytearray | memoryview) -> s.PteFile:
    """Parse a `.pte` file as stored: header, raw Program and segment payloads (zero-copy views)."""
    view, ident = file_view(data, kind=".pte", error=PteDecodeError)
    n = view.nbytes
    if ident != s.SCHEMA_FILE_IDENTIFIER:
        if ident[:2] == b"ET" and ident[2:].isalnum():
            raise PteDecodeError(
                f"unsupported .pte schema {ident.decode('ascii')!r}: texir reads 'ET12' (ExecuTorch 1.5.1)"
            )
        raise PteDecodeError(f"not a .pte file: file identifier {ident!r} != b'ET12'")
    header = None
    program_size = n
    if n >= 16 and bytes(view[8:12]) == s.EXTENDED_HEADER_MAGIC:
        (length,) = struct.unpack_from("<I", view, 12)
        if length < 24 or n < 8 + max(length, 24):
            raise PteDecodeError(f"extended header length {length} is invalid for a {n}-byte file")
        program_size, base = struct.unpack_from("<QQ", view, 16)
        data_size = struct.unpack_from("<Q", view, 32)[0] if length >= 32 else 0
        if not 8 + length <= program_size <= n:
            raise PteDecodeError(
                f"extended header program_size {program_size} outside [{8 + length}, file size {n}]"
            )
        if data_size and not (program_size <= base and base + data_size <= n):
            raise PteDecodeError(
                f"extended header segments [{base}, {base + data_size}) do not fit the {n}-byte file "
                f"after the program ({program_size} bytes); the file is truncated or corrupt"
            )
        header = s.ExtendedHeader(
            program_size=program_size, segment_base_offset=base, segment_data_size=data_size, header_length=length
        )
    program = decode_program(view, program_size)
    segment_data = []
    for i, seg in enumerate(program.segments):
        if seg.size == 0:
            segment_data.append(Blob(b""))
            continue
        if header is None or header.segment_base_offset == 0:
            raise PteDecodeError(f"Program.segments[{i}] holds {seg.size} bytes but the file has no extended header")
        limit = header.segment_data_size or (n - header.segment_base_offset)
        if seg.offset + seg.size > limit:
            raise PteDecodeError(
                f"Program.segments[{i}] [{seg.offset}, {seg.offset + seg.size}) exceeds the segment data "
                f"({limit} bytes)"
            )
        start = header.segment_base_offset + seg.offset
        segment_data.append(Blob(view[start : start + seg.size]))
    return s.PteFile(
        program=program, header=header, segment_data=tuple(segment_data), file_size=n, flatbuffer_size=program_size
    )


def _segment(f: s.PteFile, index: int, what: str) -> Blob:
    if index >= len(f.segment_data):
        raise PteDecodeError(f"{what} refers to segment {index}, but Program.segments has {len(f.segment_data)}")
    return f.segment_data[index]


def _split(seg: Blob, offsets: tuple[int, ...], sizes: dict[int, int], what: str) -> tuple[s.Buffer, ...]:
    view = seg.view()
    out = []
    for i, off in enumerate(offsets):
        end = offsets[i + 1] if i + 1 < len(offsets) else seg.nbytes
        size = sizes.get(i, max(0, end - off))
        if off + size > seg.nbytes:
            raise PteDecodeError(
                f"{what}.offsets[{i}]: entry [{off}, {off + size}) exceeds its segment of {seg.nbytes} bytes"
            )
        out.append(s.Buffer(storage=Blob(view[off : off + size])))
    return tuple(out)


def to_logical(f: s.PteFile) -> s.PteProgram:
    """Turn a stored file back into the logical PteProgram (constants, delegates and named data inline)."""
    program = f.program
    constant_buffer = program.constant_buffer
    cs = program.constant_segment
    if cs is not None and cs.offsets:
        if constant_buffer:
            raise PteDecodeError("Program has both constant_segment offsets and an inline constant_buffer")
        sizes: dict[int, int] = {}
        for plan in program.execution_plan:
            for ev in plan.values:
                t = ev.val
                if (
                    isinstance(t, s.Tensor)
                    and t.data_buffer_idx > 0
                    and t.allocation_info is None
                    and (t.extra_tensor_info is None or t.extra_tensor_info.location == s.TensorDataLocation.SEGMENT)
                    and t.data_buffer_idx < len(cs.offsets)
                ):
                    if any(d < 0 for d in t.sizes):
                        raise PteDecodeError(f"ExecutionPlan {plan.name!r}: constant tensor with negative size")
                    nbytes = tensor_nbytes(t)
                    sizes[t.data_buffer_idx] = max(sizes.get(t.data_buffer_idx, 0), nbytes)
        seg = _segment(f, cs.segment_index, "Program.constant_segment")
        constant_buffer = _split(seg, cs.offsets, sizes, "Program.constant_segment")
    mutable_data: tuple[s.Buffer, ...] = ()
    if program.mutable_data_segments:
        if len(program.mutable_data_segments) > 1:
            raise PteDecodeError("Program.mutable_data_segments has more than one entry; texir supports one")
        ms = program.mutable_data_segments[0]
        seg = _segment(f, ms.segment_index, "Program.mutable_data_segments[0]")
        mutable_data = _split(seg, ms.offsets, {}, "Program.mutable_data_segments[0]")
    inline: list[s.BackendDelegateInlineData] = []
    index_of: dict[Blob, int] = {}
    plans = []
    for plan in program.execution_plan:
        delegates = []
        for i, d in enumerate(plan.delegates):
            what = f"ExecutionPlan {plan.name!r}.delegates[{i}].processed"
            if d.processed.location == s.DataLocation.SEGMENT:
                blob = _segment(f, d.processed.index, what)
            else:
                if d.processed.index >= len(program.backend_delegate_data):
                    raise PteDecodeError(
                        f"{what}: INLINE index {d.processed.index} >= len(backend_delegate_data)="
                        f"{len(program.backend_delegate_data)}"
                    )
                blob = program.backend_delegate_data[d.processed.index].data
            index = index_of.get(blob)
            if index is None:
                index = index_of[blob] = len(inline)
                inline.append(s.BackendDelegateInlineData(data=blob))
            ref = s.BackendDelegateDataReference(location=s.DataLocation.INLINE, index=index)
            delegates.append(msgspec.structs.replace(d, processed=ref))
        plans.append(msgspec.structs.replace(plan, delegates=tuple(delegates)) if delegates else plan)
    named = tuple(
        s.NamedBlob(key=nd.key, data=_segment(f, nd.segment_index, f"Program.named_data[{i}]"))
        for i, nd in enumerate(program.named_data or ())
    )
    logical = msgspec.structs.replace(
        program,
        execution_plan=tuple(plans),
        constant_buffer=constant_buffer,
        backend_delegate_data=tuple(inline),
        segments=(),
        constant_segment=None,
        mutable_data_segments=None,
        named_data=None,
    )
    return s.PteProgram(program=logical, mutable_data=mutable_data, named_data=named)


def loads(data: bytes | bytearray | memoryview) -> s.PteProgram:
    """Decode `.pte` bytes (texir's or ExecuTorch's) into the logical PteProgram.

    Payloads are zero-copy views of `data`. Malformed, truncated or wrong-version input raises
    `PteDecodeError` naming the table, field and offset.
    """
    pte = to_logical(read_pte(data))
    check_indices(pte, PteDecodeError)
    return pte


def load(path: str | os.PathLike[str]) -> s.PteProgram:
    """Read and decode the `.pte` file at `path`."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise PteError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return loads(data)
