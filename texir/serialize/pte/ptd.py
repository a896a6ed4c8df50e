"""The `.ptd` codec: ExecuTorch's FlatTensor files, which hold the data a `.pte` keeps outside
itself (external constants, backends' external named data), looked up by key at load time.

Layout (flat_tensor.fbs, identifier ``FT01``): the flatbuffer, with a 40-byte ``FH01`` header
inserted after its identifier (padded to 48), then the data segments, each aligned to
lcm(segment alignment, the entry's alignment), starting at a segment base aligned to the segment
alignment (128 by default, as ExecuTorch). Entries with equal payloads share one segment.

Written with `flatbuffers.Builder` (no flatc); read with the bounds-checked reader of the `.pte`
codec. `dump_ptd` streams the payloads and writes atomically, as `texir.serialize.pte.dump`.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Iterator, Sequence
from typing import NoReturn, Protocol

import flatbuffers

from texir.serialize.fb_builder import Builder
from texir._io import atomic_write
from texir.errors import PteError
from concurrent.futures import ThreadPoolExecutor

from texir.ir.blob import Blob, HashingCopy, resolve_digests
from texir.serialize.fb_reader import FbReader, PteDecodeError, file_view
from texir.serialize.pte.codec import tensor_nbytes
from texir.serialize.pte.schema import PtdEntry, PtdFile, Program, ScalarType, Tensor, TensorDataLocation, TensorLayout

__all__ = [
    "PTD_FILE_IDENTIFIER",
    "PtdDecodeError",
    "PtdEntry",
    "PtdFile",
    "PtdMismatchError",
    "TensorLayout",
    "check_external",
    "dump_ptd",
    "dumps_ptd",
    "iter_ptd_chunks",
    "load_ptd",
    "loads_ptd",
]

PTD_FILE_IDENTIFIER = b"FT01"
_HEADER_MAGIC = b"FH01"
_HEADER_LENGTH = 40
_PADDED_HEADER = 48  # the header padded to the flatbuffer's 16-byte alignment
_FLAT_TENSOR_VERSION = 0
_HEADER = struct.Struct("<4sIQQQQ")
_U64 = struct.Struct("<Q")
_HASH_THREADS = max(1, min(4, os.cpu_count() or 1))
"""Threads hashing deferred payloads while `dump_ptd` copies them."""


class PtdDecodeError(PteDecodeError):
    """`.ptd` bytes are malformed, truncated or of an unsupported version."""


# --- writing --------------------------------------------------------------------------------------


def _check(ptd: PtdFile) -> None:
    seen: set[str] = set()
    if ptd.segment_alignment < 1:
        raise PteError(f".ptd segment_alignment must be >= 1, got {ptd.segment_alignment}")
    for e in ptd.entries:
        if e.key in seen:
            raise PteError(f".ptd entry {e.key!r} appears twice; keys of one .ptd file must be unique")
        seen.add(e.key)
        if e.alignment < 1:
            raise PteError(f".ptd entry {e.key!r}: alignment must be >= 1, got {e.alignment}")


def _layout(ptd: PtdFile, *, by_content: bool = False) -> tuple[bytes, list[tuple[int, Blob]], int]:
    """(head: header + flatbuffer padded to the segment base, [(padding, payload)], data size).
    A deferred payload of the size of a payload whose digest is known (a tied weight, one use of
    which a backend copied) is hashed now, so that equal ones share a segment as their digests
    would make them; with `by_content`, every deferred payload is."""
    _check(ptd)
    known_sizes = {e.data.nbytes for e in ptd.entries if not e.data.deferred}
    # One segment per distinct payload, in order of first use.
    segment_of: dict[tuple[str, int], int] = {}
    segments: list[tuple[Blob, int]] = []  # payload, alignment
    entry_segment: list[int] = []
    for e in ptd.entries:
        data = e.data
        hashed = data.deferred and (by_content or data.nbytes in known_sizes)
        key = (data.content_digest() if hashed else data.digest(), data.nbytes)
        index = segment_of.get(key)
        if index is None:
            index = segment_of[key] = len(segments)
            segments.append((e.data, e.alignment))
        else:
            blob, align = segments[index]
            segments[index] = (blob, math.lcm(align, e.alignment))
        entry_segment.append(index)
    offsets: list[int] = []
    pieces: list[tuple[int, Blob]] = []
    end = 0
    for blob, align in segments:
        step = math.lcm(ptd.segment_alignment, align)
        start = -(-end // step) * step
        pieces.append((start - end, blob))
        offsets.append(start)
        end = start + blob.nbytes
    fb = _encode(ptd, entry_segment, offsets, [b.nbytes for b, _ in segments])
    base = -(-(len(fb) + _PADDED_HEADER) // ptd.segment_alignment) * ptd.segment_alignment
    header = _HEADER.pack(_HEADER_MAGIC, _HEADER_LENGTH, _PADDED_HEADER, len(fb), base, end)
    root = struct.unpack_from("<I", fb, 0)[0] + _PADDED_HEADER
    head = b"".join([
        struct.pack("<I", root), fb[4:8], header, b"\0" * (_PADDED_HEADER - len(header)), fb[8:],
    ])
    return head + b"\0" * (base - len(head)), pieces, end


def _encode(ptd: PtdFile, entry_segment: list[int], offsets: list[int], sizes: list[int]) -> bytes:
    """The FlatTensor flatbuffer as flatc builds it from ExecuTorch's JSON (its serializer's way):
    each table's children made as its fields are reached, in schema order (the segments, then each
    named entry's key and layout); a table's present fields added 8-byte ones first, then 4-byte
    ones, then 1-byte ones, each group in descending field id; scalars equal to their default (0)
    left out."""
    b = Builder(1024)
    segs = []
    for off, size in zip(offsets, sizes):  # DataSegment: offset (0), size (1), both uint64
        b.StartObject(2)
        b.PrependUint64Slot(1, size, 0)
        b.PrependUint64Slot(0, off, 0)
        segs.append(b.EndObject())
    segments = _table_vector(b, segs)
    named = []
    for e, seg in zip(ptd.entries, entry_segment):  # NamedData: key (0), segment_index (1), tensor_layout (2)
        key = b.CreateString(e.key)
        layout = 0
        if e.layout is not None:  # TensorLayout: scalar_type (0, int8), sizes (1, [int32]), dim_order (2, [uint8])
            b.StartVector(4, len(e.layout.sizes), 4)
            for d in reversed(e.layout.sizes):
                b.PrependInt32(d)
            sizes_vec = b.EndVector()
            b.StartVector(1, len(e.layout.dim_order), 1)
            for d in reversed(e.layout.dim_order):
                b.PrependUint8(d)
            dim_order = b.EndVector()
            b.StartObject(3)
            b.PrependUOffsetTRelativeSlot(2, dim_order, 0)
            b.PrependUOffsetTRelativeSlot(1, sizes_vec, 0)
            b.PrependInt8Slot(0, int(e.layout.scalar_type), 0)
            layout = b.EndObject()
        b.StartObject(3)
        if layout:
            b.PrependUOffsetTRelativeSlot(2, layout, 0)
        b.PrependUint32Slot(1, seg, 0)
        b.PrependUOffsetTRelativeSlot(0, key, 0)
        named.append(b.EndObject())
    named_data = _table_vector(b, named)
    b.StartObject(3)  # FlatTensor: version (0, uint32), segments (1), named_data (2)
    b.PrependUOffsetTRelativeSlot(2, named_data, 0)
    b.PrependUOffsetTRelativeSlot(1, segments, 0)
    b.PrependUint32Slot(0, _FLAT_TENSOR_VERSION, 0)
    root = b.EndObject()
    b.Finish(root, file_identifier=PTD_FILE_IDENTIFIER)
    return bytes(b.Output())


def _table_vector(b: Builder, tables: list[int]) -> int:
    b.StartVector(4, len(tables), 4)
    for t in reversed(tables):
        b.PrependUOffsetTRelative(t)
    return int(b.EndVector())


class _KeptApart(PteError):
    """Two segments hold equal payloads that deferred digests kept apart: the layout is not the
    one the real digests give (the writers lay the file out again by content)."""


def _check_deferred(pieces: list[tuple[int, Blob]]) -> None:
    """Once deferred digests are known: no two segments hold equal payloads (the stand-ins kept
    apart what digests would have merged), else `_KeptApart`."""
    if not any(blob.deferred for _, blob in pieces):
        return
    seen: dict[tuple[str, int], int] = {}
    for index, (_, blob) in enumerate(pieces):
        first = seen.setdefault((blob.content_digest(), blob.nbytes), index)
        if first != index:
            raise _KeptApart(f".ptd segments {first} and {index} hold equal payloads ({blob.nbytes} bytes)")


def _resolved_head(head: bytes, pieces: list[tuple[int, Blob]]) -> bytes | memoryview:
    _check_deferred(pieces)
    return resolve_digests(head)


def iter_ptd_chunks(ptd: PtdFile) -> Iterator[memoryview]:
    """The file's bytes as a sequence of views (payloads are not copied)."""
    head, pieces, _ = _layout(ptd)
    try:
        resolved = _resolved_head(head, pieces)
    except _KeptApart:  # (every payload is hashed by now: laid out by content, as with known digests)
        head, pieces, _ = _layout(ptd, by_content=True)
        resolved = _resolved_head(head, pieces)
    yield memoryview(resolved)
    for pad, blob in pieces:
        if pad:
            yield memoryview(b"\0" * pad)
        yield blob.view()


def dumps_ptd(ptd: PtdFile) -> bytes:
    """The `.ptd` bytes of `ptd`."""
    return b"".join(iter_ptd_chunks(ptd))


class Draft(Protocol):
    """What `dump_ptd` asks of a draft (`texir.serialize.pte.PtdDraft`, which builds on this module)."""

    def finish(self, ptd: PtdFile, path: str | os.PathLike[str]) -> bool: ...


def dump_ptd(ptd: PtdFile, path: str | os.PathLike[str], *, draft: Draft | None = None) -> None:
    """Write `ptd` to `path` atomically (a failure leaves `path` untouched), streaming payloads.
    With a `draft` (`texir.serialize.pte.PtdDraft`, begun before the program existed), the file is
    the draft's, finished: only what it did not put in place is written now (`draft.outcome`).
    Payloads with deferred digests (large weights: memory-mapped checkpoints, big models in
    memory) are hashed as they are copied, and the header, which names them by digest, is written
    last: one read of each payload; mapped ones are read ahead of the copy (`HashingCopy`). Should
    two of them turn out equal (their stand-ins kept apart what one segment holds), the file is
    written again laid out by content: the bytes are those known digests give."""
    if draft is not None:
        _check(ptd)  # refuse bad input before touching the draft's file
        if draft.finish(ptd, path):
            return
    head, pieces, end = _layout(ptd)  # refuse bad input before a temporary file exists
    size = len(head) + end
    if not any(blob.deferred for _, blob in pieces):
        atomic_write(path, iter_ptd_chunks(ptd), error=PteError, size_hint=size)
        return

    with ThreadPoolExecutor(max_workers=_HASH_THREADS) as pool:
        copy = HashingCopy(pool, [blob for _, blob in pieces])

        def chunks() -> Iterator[memoryview]:
            yield memoryview(head)  # its stand-ins are replaced once the payloads are hashed
            for pad, blob in pieces:
                if pad:
                    yield memoryview(b"\0" * pad)
                yield from copy.chunks(blob)

        try:
            atomic_write(path, chunks(), error=PteError, head=lambda: _resolved_head(head, pieces), size_hint=size)
            return
        except _KeptApart:
            pass  # nothing was written; every payload is hashed now
        finally:
            copy.cancel()
    # Equal payloads behind different stand-ins (two weights of equal bytes): written again, laid
    # out by content as the real digests lay it out (a second copy of the payloads, this once)
    atomic_write(path, iter_ptd_chunks(ptd), error=PteError, size_hint=size)


# --- reading --------------------------------------------------------------------------------------


class _PtdReader(FbReader):
    __slots__ = ()

    def fail(self, where: str, msg: str) -> NoReturn:
        raise PtdDecodeError(f"malformed .ptd flatbuffer at {where}: {msg}")


def loads_ptd(data: bytes | bytearray | memoryview) -> PtdFile:
    """Decode `.ptd` bytes (payloads are zero-copy views of `data`)."""
    view, ident = file_view(data, kind=".ptd", error=PtdDecodeError, minimum=8 + _HEADER.size)
    n = view.nbytes
    if ident != PTD_FILE_IDENTIFIER:
        raise PtdDecodeError(f"not a .ptd file: file identifier {ident!r} != {PTD_FILE_IDENTIFIER!r}")
    magic, length, fb_offset, fb_size, base, data_size = _HEADER.unpack_from(view, 8)
    if magic != _HEADER_MAGIC or length < _HEADER_LENGTH:
        raise PtdDecodeError(f"bad .ptd header: magic {magic!r}, length {length} (want {_HEADER_MAGIC!r}, >= 40)")
    fb_end = fb_offset + fb_size
    if fb_end > n or base + data_size > n or base < fb_end:
        raise PtdDecodeError(
            f".ptd header says flatbuffer [0, {fb_end}) and data [{base}, {base + data_size}) but the file "
            f"has {n} bytes; it is truncated or corrupt"
        )
    r = _PtdReader(view, fb_end)
    root = r.table(int(struct.unpack_from("<I", view, 0)[0]), "FlatTensor")
    version = r.u32(root, 0, "FlatTensor.version")
    if version > _FLAT_TENSOR_VERSION:
        raise PtdDecodeError(f".ptd version {version} is newer than texir reads ({_FLAT_TENSOR_VERSION})")
    spans: list[tuple[int, int]] = []
    for i, pos in enumerate(r.table_list(root, 1, "FlatTensor.segments")):
        t = r.table(pos, f"segments[{i}]")
        off = int(r.scalar(t, 0, _U64, 0, f"segments[{i}].offset"))  # type: ignore[call-overload]  # "<Q" gives int
        size = int(r.scalar(t, 1, _U64, 0, f"segments[{i}].size"))  # type: ignore[call-overload]  # "<Q" gives int
        if off + size > data_size:
            raise PtdDecodeError(f".ptd segments[{i}] [{off}, {off + size}) exceeds the {data_size}-byte data")
        spans.append((base + off, size))
    entries = []
    for i, pos in enumerate(r.table_list(root, 2, "FlatTensor.named_data")):
        where = f"named_data[{i}]"
        t = r.table(pos, where)
        key = r.req_string(t, 0, f"{where}.key")
        seg = r.u32(t, 1, f"{where}.segment_index")
        if seg >= len(spans):
            raise PtdDecodeError(f".ptd entry {key!r}: segment_index {seg} >= {len(spans)} segments")
        lp = r.ref(t, 2, f"{where}.tensor_layout")
        layout = None
        if lp >= 0:
            lt = r.table(lp, f"{where}.tensor_layout")
            code = r.i8(lt, 0, f"{where}.tensor_layout.scalar_type")
            try:
                scalar_type = ScalarType(code)
            except ValueError:
                raise PtdDecodeError(f".ptd entry {key!r}: unknown scalar type {code}") from None
            layout = TensorLayout(
                scalar_type=scalar_type,
                sizes=r.ints(lt, 1, "i", 4, f"{where}.tensor_layout.sizes"),
                dim_order=r.ints(lt, 2, "B", 1, f"{where}.tensor_layout.dim_order"),
            )
        start, size = spans[seg]
        entries.append(PtdEntry(key=key, data=Blob(view[start : start + size]), layout=layout))
    keys = [e.key for e in entries]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise PtdDecodeError(f".ptd holds key {dup!r} twice")
    return PtdFile(entries=tuple(entries))


def load_ptd(path: str | os.PathLike[str]) -> PtdFile:
    """Read and decode a `.ptd` file."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise PtdDecodeError(f"cannot read {os.fspath(path)}: {exc.strerror or exc}") from None
    return loads_ptd(data)


# --- checking a .pte against its .ptd files -------------------------------------------------------


class PtdMismatchError(PteError):
    """A `.pte` refers to external data its `.ptd` files lack, or hold with another layout."""


def check_external(program: Program, files: Sequence[PtdFile]) -> int:
    """Check that every EXTERNAL tensor of `program` is found, by its fully qualified name, in one
    of `files` with the same scalar type, sizes and dim order and enough bytes (what the runtime
    checks at load); returns how many were checked. Raises `PtdMismatchError` naming the key and
    the method. Delegates' named data is not checked: the keys a blob uses are the backend's own."""
    checked = 0
    by_key: dict[str, tuple[PtdEntry, str]] = {}
    for f in files:
        for e in f.entries:
            if e.key in by_key:
                raise PtdMismatchError(
                    f"external key {e.key!r} is in both {by_key[e.key][1]!r}.ptd and {f.tag!r}.ptd; "
                    "each key may live in one file only"
                )
            by_key[e.key] = (e, f.tag)
    names = ", ".join(repr(f.tag) for f in files) or "none"
    for plan in program.execution_plan:
        for v, ev in enumerate(plan.values):
            t = ev.val
            if not isinstance(t, Tensor) or t.extra_tensor_info is None:
                continue
            info = t.extra_tensor_info
            if info.location != TensorDataLocation.EXTERNAL:
                continue
            where = f"method {plan.name!r}, values[{v}]"
            key = info.fully_qualified_name
            if not key:
                raise PtdMismatchError(f"{where}: an EXTERNAL tensor without a fully qualified name")
            found = by_key.get(key)
            if found is None:
                raise PtdMismatchError(
                    f"{where}: external tensor {key!r} is in none of the .ptd files given ({names}); "
                    "pass the .ptd file written with this .pte"
                )
            entry, tag = found
            want = TensorLayout(scalar_type=t.scalar_type, sizes=tuple(t.sizes), dim_order=tuple(t.dim_order))
            if entry.layout is not None and entry.layout != want:
                raise PtdMismatchError(
                    f"{where}: external tensor {key!r} is {_layout_str(want)} in the .pte but "
                    f"{_layout_str(entry.layout)} in {tag!r}.ptd; the files come from different exports"
                )
            nbytes = tensor_nbytes(t)
            checked += 1
            if entry.data.nbytes < nbytes:
                raise PtdMismatchError(
                    f"{where}: external tensor {key!r} needs {nbytes} bytes but {tag!r}.ptd holds "
                    f"{entry.data.nbytes}; the files come from different exports"
                )
    return checked


def _layout_str(layout: TensorLayout) -> str:
    return f"{layout.scalar_type.name}{list(layout.sizes)} dim_order {list(layout.dim_order)}"
