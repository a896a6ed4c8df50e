"""Conversions between torch tensors / fake tensors and the IR's DType, TensorMeta and TensorData."""

from __future__ import annotations

import bisect
import contextlib
import functools
import hashlib
import os
import warnings
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from typing import Any, Union

import msgspec
import torch

from texir._io import advise_willneed
from texir.errors import ConversionError, UnsupportedError
from texir.ir.blob import Blob, deferred_blob, is_deferred, sha256_many
from texir.ir.literals import float_value
from texir.ir.types import (
    Dim,
    DType,
    FloatValue,
    Layout,
    MemoryFormat,
    TensorData,
    TensorMeta,
)

__all__ = [
    "DTYPE_FROM_TORCH",
    "DTYPE_TO_TORCH",
    "LAYOUT_FROM_TORCH",
    "LAYOUT_TO_TORCH",
    "MEMORY_FORMAT_FROM_TORCH",
    "MEMORY_FORMAT_TO_TORCH",
    "digest_memo",
    "dim_from_torch",
    "expr_str",
    "float_from_python",
    "float_to_python",
    "tensor_data_from_tensor",
    "tensor_digests",
    "tensor_from_data",
    "tensor_meta_from_tensor",
]


def _dtype_table() -> dict[torch.dtype, DType]:
    table: dict[torch.dtype, DType] = {}
    for member in DType:
        dtype = getattr(torch, member.value, None)
        if isinstance(dtype, torch.dtype):
            table[dtype] = member
    return table


DTYPE_FROM_TORCH: dict[torch.dtype, DType] = _dtype_table()
DTYPE_TO_TORCH: dict[DType, torch.dtype] = {v: k for k, v in DTYPE_FROM_TORCH.items()}

LAYOUT_FROM_TORCH: dict[torch.layout, Layout] = {
    getattr(torch, member.value): member for member in Layout if hasattr(torch, member.value)
}
LAYOUT_TO_TORCH: dict[Layout, torch.layout] = {v: k for k, v in LAYOUT_FROM_TORCH.items()}

MEMORY_FORMAT_FROM_TORCH: dict[torch.memory_format, MemoryFormat] = {
    getattr(torch, member.value): member for member in MemoryFormat
}
MEMORY_FORMAT_TO_TORCH: dict[MemoryFormat, torch.memory_format] = {
    v: k for k, v in MEMORY_FORMAT_FROM_TORCH.items()
}

# TensorMeta's default device, the very object: msgspec's omit_defaults tests a field against its
# default by identity, and torch.device.type returns a new "cpu" string on every call, so an equal
# but distinct string would be written into every snapshot for every CPU tensor.
_DEFAULT_DEVICE: str = next(f.default for f in msgspec.structs.fields(TensorMeta) if f.name == "device")


def device_str(device: torch.device) -> str:
    """As torch prints it (``"cpu"``, ``"cuda:0"``); CPU is TensorMeta's default object itself."""
    kind = device.type
    index = device.index
    if index is None:
        return _DEFAULT_DEVICE if kind == _DEFAULT_DEVICE else kind
    return f"{kind}:{index}"


def float_from_python(value: float) -> FloatValue:
    """A Python float as the IR spells it (non-finite values as strings)."""
    return float_value(value)


def float_to_python(value: FloatValue) -> float:
    return value if isinstance(value, float) else float(value)


def dim_from_torch(d: Union[int, torch.SymInt]) -> Dim:
    """A size/stride: an int, or the sympy expression of a SymInt as a string."""
    if type(d) is int:
        return d
    expr = d.node.expr  # type: ignore[union-attr]  # SymInt carries its SymNode
    if expr.is_Integer:
        return int(expr)
    return expr_str(expr)


@functools.lru_cache(maxsize=8192, typed=True)
def expr_str(expr: Any) -> str:
    """A sympy expression printed as the IR spells it, once per distinct expression: printing is
    most of converting a program with symbolic shapes (every size of every node names the same few
    expressions; ~60 us a print). Keyed by sympy's structural equality, which tells apart whatever
    prints differently (`s0 + 1` and `s0 + 1.0`, symbols of other assumptions); bounded."""
    return str(expr)


def _dims(values: Any) -> tuple[Dim, ...]:
    out = tuple(values)
    for d in out:
        if type(d) is not int:
            return tuple(dim_from_torch(x) for x in out)
    return out


def tensor_meta_from_tensor(t: torch.Tensor, *, where: object = "tensor") -> TensorMeta:
    """TensorMeta of a real or fake tensor. `where` names it in errors (formatted only then)."""
    dtype = DTYPE_FROM_TORCH.get(t.dtype)
    if dtype is None:
        raise UnsupportedError(f"{where}: dtype {t.dtype} has no texir DType; cast it before export")
    layout = LAYOUT_FROM_TORCH.get(t.layout)
    if layout is None:
        raise UnsupportedError(f"{where}: layout {t.layout} is not supported; use a strided tensor")
    if layout is Layout.strided:
        strides = _dims(t.stride())
        offset = t.storage_offset()
        storage_offset: Dim = offset if type(offset) is int else dim_from_torch(offset)
    else:
        strides = ()
        storage_offset = 0
    return TensorMeta(
        dtype=dtype,
        shape=_dims(t.shape),
        strides=strides,
        storage_offset=storage_offset,
        layout=layout,
        device=device_str(t.device),
        requires_grad=t.requires_grad,
    )


def _byte_view(t: torch.Tensor, where: str) -> tuple[TensorMeta, memoryview]:
    """`t`'s metadata and its bytes in row-major order: a read-only view of its storage when it is
    contiguous, a copy otherwise."""
    if isinstance(t, torch._subclasses.fake_tensor.FakeTensor) or t.device.type == "meta":
        raise UnsupportedError(
            f"{where}: holds a fake/meta tensor, not data; export the model with real weights, or attach "
            "them to a weightless export with texir.adapters.attach_weights"
        )
    meta = tensor_meta_from_tensor(t, where=where)
    if meta.layout is not Layout.strided:
        raise UnsupportedError(f"{where}: only strided tensors can be stored, got {t.layout}")
    if t.device.type != "cpu":
        raise UnsupportedError(f"{where}: tensor on {t.device}; move the model to CPU before export")
    flat = t.detach()
    if not flat.is_contiguous():
        flat = flat.contiguous()
    try:
        array = flat.reshape(-1).view(torch.uint8).numpy()
    except (RuntimeError, TypeError) as exc:
        raise UnsupportedError(f"{where}: cannot view {t.dtype} data as bytes ({exc})") from exc
    array.flags.writeable = False
    return meta, array.data


_MEMO: ContextVar[dict[int, tuple[torch.Tensor, int, int, str]] | None] = ContextVar("texir_digest_memo", default=None)
@contextlib.contextmanager
def digest_memo() -> Iterator[None]:
    """Inside the block a tensor is hashed once: the same tensor object, at the same version (torch
    bumps a tensor's `_version` on every in-place write) and storage, reuses its digest. `lower`
    opens one around its conversions of one program, which share every weight."""
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


def _remembered(t: torch.Tensor) -> str | None:
    memo = _MEMO.get()
    found = memo.get(id(t)) if memo is not None else None
    if found is not None and found[0] is t and found[1] == t._version and found[2] == t.data_ptr():
        return found[3]
    return None


def _remember(t: torch.Tensor, digest: str) -> None:
    memo = _MEMO.get()
    if memo is not None:
        memo[id(t)] = (t, t._version, t.data_ptr(), digest)  # holds t, so its id stays its own


_STAND_INS: dict[str, tuple[int, int, bool]] = {}
"""Each stand-in digest given out -> the (address, size) of the bytes it stands for, and whether
they are mapped from a file."""
_DEFER_BYTES = 1 << 20
"""File-mapped tensors from this size up have their digest deferred to the writer (`deferred_blob`)."""
_DEFER_IN_MEMORY_BYTES = 1 << 30
"""In-memory tensors from `_DEFER_BYTES` up have their digests deferred too when together they
hold at least this much: hashing them here costs seconds (sha256 runs at about 1 GB/s a core)
that the `.ptd` writer spends while the disk writes. Smaller programs keep digests that name their
bytes at once, which a preprocess cache on disk can use (a key with a stand-in holds in memory only)."""
_HASH_AT_IMPORT = "TEXIR_HASH_AT_IMPORT"
"""Environment variable: when "1", no digest is deferred (every weight hashed when converted)."""
_SAMPLE = 4096
_MAPS = "/proc/self/maps"


def _file_mappings() -> list[tuple[int, int]]:
    """The address ranges of this process's data mappings of files (a memory-mapped checkpoint's
    weights); none where the system does not list them (not Linux)."""
    ranges = []
    try:
        with open(_MAPS, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].startswith("/") and "x" not in fields[1]:
                    lo, _, hi = fields[0].partition("-")
                    ranges.append((int(lo, 16), int(hi, 16)))
    except (OSError, ValueError):
        return []
    return ranges


def _sample(view: memoryview) -> bytes:
    """Size and a few pages of `view` (first, middle, last): equal bytes give equal samples, and
    payloads whose samples differ are known to differ without reading them whole."""
    n = view.nbytes
    middle = max(0, n // 2 - _SAMPLE // 2)
    return hashlib.sha256(b"".join([n.to_bytes(8, "little"), view[:_SAMPLE], view[middle:middle + _SAMPLE],
                                    view[max(0, n - _SAMPLE):]])).digest()


def _stand_ins(tensors: Sequence[torch.Tensor], views: Sequence[memoryview]) -> list[str | None]:
    """A stand-in digest for each large mapped tensor (each large one when those in memory hold
    `_DEFER_IN_MEMORY_BYTES`) whose sample no other tensor here shares but one viewing the same
    bytes (so its bytes are unique among them, and deduplication by digest is unchanged), else
    None."""
    out: list[str | None] = [None] * len(tensors)
    large = [i for i, v in enumerate(views) if v.nbytes >= _DEFER_BYTES]
    mapped = sorted(_file_mappings()) if large else []
    starts = [lo for lo, _ in mapped]

    def in_file(address: int) -> bool:
        k = bisect.bisect_right(starts, address) - 1
        return k >= 0 and address < mapped[k][1]

    mapped_ones = {i for i in large if in_file(tensors[i].data_ptr())}
    in_memory = sum(views[i].nbytes for i in large if i not in mapped_ones)
    if in_memory < _DEFER_IN_MEMORY_BYTES:
        large = [i for i in large if i in mapped_ones]
    if not large or os.environ.get(_HASH_AT_IMPORT) == "1":
        return out
    sizes = {views[i].nbytes for i in large}
    samples: dict[int, bytes] = {i: _sample(v) for i, v in enumerate(views) if v.nbytes in sizes}
    # Tensors viewing the very same bytes (a tied embedding and output projection, listed under
    # both names) are one payload: they share a stand-in; other tensors sharing a sample may share
    # bytes without sharing storage.
    same: dict[bytes, set[tuple[int, int] | int]] = {}
    for i, sample in samples.items():
        t = tensors[i]
        same.setdefault(sample, set()).add((t.data_ptr(), views[i].nbytes) if t.is_contiguous() else i)
    for i in large:
        sample = samples[i]
        if len(same[sample]) > 1:
            continue  # maybe equal to another tensor: hashed now, so equal bytes share a digest
        stand_in = hashlib.sha256(b"texir deferred digest\0" + sample).hexdigest()
        place = (tensors[i].data_ptr(), views[i].nbytes, i in mapped_ones)
        if _STAND_INS.get(stand_in, place)[:2] != place[:2] and is_deferred(stand_in):
            continue  # other bytes with this sample are still in use: hashed now
        _STAND_INS[stand_in] = place
        out[i] = stand_in
    return out


def tensor_digests(tensors: Sequence[torch.Tensor], wheres: Sequence[str]) -> list[str]:
    """The sha256 of each tensor's bytes (as `tensor_data_from_tensor` computes it), large ones
    hashed in parallel threads; digests inside a `digest_memo` block are reused. A large
    tensor memory-mapped from a file (a checkpoint), or any large one of a program whose weights in
    memory are large (`_DEFER_IN_MEMORY_BYTES`), whose bytes no other tensor here can share gets a
    stand-in instead, which `tensor_data_from_tensor` turns into a deferred payload."""
    digests: list[str | None] = [_remembered(t) for t in tensors]
    todo = [i for i, d in enumerate(digests) if d is None]
    views = [_byte_view(tensors[i], wheres[i])[1] for i in todo]
    deferred = _stand_ins([tensors[i] for i in todo], views)
    for i, stand_in in zip(todo, deferred):
        digests[i] = stand_in
    hashed = [(i, v) for i, v, d in zip(todo, views, deferred) if d is None]
    for (i, _), digest in zip(hashed, sha256_many([v for _, v in hashed])):
        digests[i] = digest
    result = [d if d is not None else "" for d in digests]  # every index is filled above
    for t, digest in zip(tensors, result):
        _remember(t, digest)
    return result


def _read_ahead(address: int, start: int, nbytes: int) -> None:
    advise_willneed(address + start, nbytes)


def tensor_data_from_tensor(t: torch.Tensor, *, where: str = "tensor", digest: str | None = None) -> TensorData:
    """A real CPU tensor's value. The payload aliases the tensor's storage when it is contiguous
    (zero-copy, read-only view); only non-contiguous tensors are copied. `digest`, when given, is
    the sha256 of those bytes (from `tensor_digests`, possibly of another tensor with equal bytes)."""
    meta, view = _byte_view(t, where)
    if digest is None:
        digest = _remembered(t)
        if digest is None:
            digest = hashlib.sha256(view).hexdigest()
            _remember(t, digest)
    place = _STAND_INS.get(digest)
    if place is not None:  # these bytes, or a copy of them (a buffer): still unique
        read_ahead = None
        if place[2] and t.is_contiguous() and t.data_ptr() == place[0]:  # the mapping itself, not a copy
            read_ahead = functools.partial(_read_ahead, place[0])
        return TensorData(meta=meta, sha256=digest, nbytes=view.nbytes,
                          data=deferred_blob(view, digest, read_ahead=read_ahead))
    return TensorData(meta=meta, sha256=digest, nbytes=view.nbytes, data=Blob(view, digest=digest))


def tensor_from_data(data: TensorData, *, where: str = "tensor", copy: bool = False) -> torch.Tensor:
    """A CPU tensor holding `data`. Zero-copy over the Blob unless `copy` (use it for values the
    runtime may write to, such as mutable buffers) or the recorded strides are not contiguous."""
    if data.data is None:
        raise ConversionError(
            f"{where}: the snapshot holds no tensor data (only its hash); "
            "write it with include_data=True (`texir snapshot --include-data`) to rebuild a runnable program"
        )
    meta = data.meta
    dtype = DTYPE_TO_TORCH.get(meta.dtype)
    if dtype is None:
        raise UnsupportedError(f"{where}: dtype {meta.dtype} is not available in this torch build")
    shape = [_static_dim(d, where) for d in meta.shape]
    view = data.data.view()
    if view.nbytes == 0:
        flat = torch.empty((0,), dtype=torch.uint8)
    else:
        with warnings.catch_warnings():
            # torch warns that the buffer is read-only; texir never writes through it and copies
            # whatever the runtime may write to.
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.frombuffer(view, dtype=torch.uint8)
    t = flat.view(dtype).reshape(shape)
    strides = [_static_dim(d, where) for d in meta.strides]
    offset = _static_dim(meta.storage_offset, where)
    if offset or (tuple(t.stride()) != tuple(strides) and t.numel() > 1):
        # Recreate the recorded layout (a transposed or sliced parameter): the payload holds the
        # values in contiguous order, the strides say where they live.
        extent = offset + 1 + sum((n - 1) * st for n, st in zip(shape, strides)) if t.numel() else offset
        out = torch.zeros((extent,), dtype=dtype).as_strided(shape, strides, offset)
        out.copy_(t)
        t = out
    elif copy:
        t = t.clone()
    return t


def _static_dim(d: Dim, where: str) -> int:
    if isinstance(d, int):
        return d
    raise ConversionError(f"{where}: stored tensor has a symbolic size {d!r}; state must be static")
