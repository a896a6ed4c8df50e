"""Reading XNNPACK delegate blobs: the XH00 header, the XN01 flatbuffer and a check of the decoded graph.

Offsets are followed with texir.serialize.fb_reader's bounds-checked primitives and its element
budget (a table costs one element per present field, a vector one per element; tables reached
twice are decoded once), so what a blob decodes to stays proportional to its size. The decoded
graph is then checked for what the runtime relies on (ids defined, input/output flags matching the
graph's lists, constants inside the data): a damaged blob raises `XnnpackBlobError` naming the
first problem.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterator
from typing import Any, Final, NoReturn

from texir.backends.xnnpack import schema as s
from texir.errors import PteError
from texir.serialize.fb_reader import U8, U32, U64, FbReader, Tab

__all__ = [
    "HEADER", "HEADER_LENGTH", "HEADER_MAGIC", "XnnpackBlobError", "check_graph", "decode_blob",
    "decode_graph", "split_blob",
]

HEADER_MAGIC: Final = b"XH00"
HEADER: Final = struct.Struct("<4s4sHIIIQ")  # zeros, magic, header length, fb offset, fb size, const offset, size
HEADER_LENGTH: Final = 30
_I16: Final = struct.Struct("<h")
_I32: Final = struct.Struct("<i")
_F32: Final = struct.Struct("<f")
_SCALARS: Final[dict[str, struct.Struct]] = {"u64": U64, "u32": U32, "i32": _I32, "f32": _F32, "i16": _I16}
_UINT64_MAX: Final = 2**64 - 1
_FLAG_INPUT: Final = 1
_FLAG_OUTPUT: Final = 2
"""XNN_VALUE_FLAG_EXTERNAL_INPUT / _OUTPUT, the only value flags ExecuTorch writes."""


class XnnpackBlobError(PteError):
    """An XNNPACK blob or graph that cannot be read or written."""


class _Reader(FbReader):
    """schema.fbs' tables, walked from `schema.FIELDS`, over the bounds-checked primitives."""

    __slots__ = ()

    def fail(self, where: str, msg: str) -> NoReturn:
        raise XnnpackBlobError(f"damaged XNNPACK flatbuffer at {where}: {msg}")

    def decode(self, cls: type[Any], pos: int, where: str) -> Any:
        key = (cls.__name__, pos)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        t = self.table(pos, where)
        values: dict[str, Any] = {}
        slot = 0
        for spec in s.FIELDS[cls]:
            if spec.kind == "-":
                slot += 1
                continue
            w = f"{where}.{spec.name}"
            if spec.kind == "union":
                self._union(t, slot, spec, values, w)
                slot += 2
                continue
            self._field(t, slot, spec, values, w)
            slot += 1
        self.charge(1 + len(values), where)
        obj = cls(**values)
        self.memo[key] = obj
        return obj

    def _union(self, t: Tab, slot: int, spec: s.FieldSpec, values: dict[str, Any], where: str) -> None:
        tag = int(self.scalar(t, slot, U8, 0, where))  # type: ignore[call-overload]  # u8
        if not tag:
            return
        if tag > len(spec.ref):
            self.fail(where, f"unknown union tag {tag} (1..{len(spec.ref)})")
        member = spec.ref[tag - 1]
        pos = self.ref(t, slot + 1, where)
        if pos < 0:
            self.fail(where, f"union tag {tag} ({member.__name__}) without its table")
        values[spec.name] = self.decode(member, pos, f"{where}<{member.__name__.removeprefix('XNN')}>")

    def _field(self, t: Tab, slot: int, spec: s.FieldSpec, values: dict[str, Any], where: str) -> None:
        kind = spec.kind
        fmt = _SCALARS.get(kind)
        if fmt is not None:
            pos = self.field(t, slot, fmt.size, where)
            if not pos:
                return
            value = fmt.unpack_from(self.d, pos)[0]
            if kind == "i16":
                try:
                    value = s.XNNDatatype(value)
                except ValueError:
                    self.fail(where, f"{value} is not an XNNDatatype (0..{len(s.XNNDatatype) - 1})")
            values[spec.name] = value
            return
        pos = self.ref(t, slot, where)
        if pos < 0:
            return
        if kind == "str":
            values[spec.name] = self.string_at(pos, where)
        elif kind == "[u32]":
            values[spec.name] = self.scalars(pos, "I", 4, where)
        elif kind == "[f32]":
            values[spec.name] = self.scalars(pos, "f", 4, where)
        elif kind == "table":
            values[spec.name] = self.decode(spec.ref[0], pos, where)
        else:  # "[table]"
            start, count = self.vector(pos, 4, where)
            offsets = struct.unpack_from(f"<{count}I", self.d, start)
            values[spec.name] = tuple(
                self.decode(spec.ref[0], start + 4 * i + off, f"{where}[{i}]") for i, off in enumerate(offsets)
            )


def _decode(fb: bytes) -> s.XNNGraph:
    if len(fb) < 8 or fb[4:8] not in (b"XN00", b"XN01"):
        raise XnnpackBlobError(f"not an XNNPACK flatbuffer: identifier {bytes(fb[4:8])!r}, expected b'XN01'")
    reader = _Reader(memoryview(fb), len(fb))
    graph: s.XNNGraph = reader.decode(s.XNNGraph, int(U32.unpack_from(fb, 0)[0]), "XNNGraph")
    return graph


def decode_graph(fb: bytes) -> s.XNNGraph:
    """The checked XNNGraph of an XN01 (or XN00-identified) flatbuffer with no constant data beside it."""
    graph = _decode(fb)
    check_graph(graph, constant_data_size=0)
    return graph


def split_blob(blob: bytes) -> tuple[bytes, bytes]:
    """(flatbuffer, constant data) of a blob; a blob without the XH00 header is all flatbuffer."""
    if blob[4:8] != HEADER_MAGIC:
        return bytes(blob), b""
    if len(blob) < HEADER_LENGTH:
        raise XnnpackBlobError(
            f"XNNPACK blob of {len(blob)} bytes is shorter than the {HEADER_LENGTH}-byte XH00 header it starts with"
        )
    _, _, length, fb_offset, fb_size, const_offset, const_size = HEADER.unpack_from(blob, 0)
    if length < HEADER_LENGTH:
        raise XnnpackBlobError(f"XNNPACK header length field is {length}, expected {HEADER_LENGTH}")
    if fb_offset + fb_size > len(blob) or const_offset + const_size > len(blob):
        raise XnnpackBlobError(
            f"XNNPACK header points past the blob's end ({len(blob)} bytes): flatbuffer at {fb_offset}+{fb_size}, "
            f"constants at {const_offset}+{const_size}"
        )
    return bytes(blob[fb_offset : fb_offset + fb_size]), bytes(blob[const_offset : const_offset + const_size])


def decode_blob(blob: bytes) -> s.XNNGraph:
    """The checked XNNGraph of a delegate blob (header optional, as for the runtime)."""
    fb, constants = split_blob(blob)
    graph = _decode(fb)
    check_graph(graph, constant_data_size=len(constants))
    return graph


# -- the decoded graph ---------------------------------------------------------------------------


def _tensor(value: s.XValue) -> s.XNNTensorValue | None:
    u = value.xvalue_union
    if isinstance(u, s.XNNQuantizedTensorValue):
        return u.tensor_value
    return u if isinstance(u, s.XNNTensorValue) else None


def _value_problems(graph: s.XNNGraph, ids: dict[int, s.XNNTensorValue]) -> Iterator[str]:
    n_values, n_consts = len(graph.xvalues), len(graph.constant_data)
    externals: dict[int, int] = {}
    for i, value in enumerate(graph.xvalues):
        t = _tensor(value)
        if t is None:
            yield f"xvalues[{i}] holds no tensor value"
            continue
        v = f"xvalues[{i}] (id {t.id_out})"
        if t.id_out >= n_values:
            yield f"{v}: id out of range (the graph has {n_values} values)"
        elif t.id_out in ids:
            yield f"{v}: id defined twice"
        else:
            ids[t.id_out] = t
        if t.datatype == s.XNNDatatype.xnn_datatype_invalid:
            yield f"{v}: datatype is xnn_datatype_invalid"
        if t.num_dims != len(t.dims):
            yield f"{v}: num_dims {t.num_dims} but {len(t.dims)} dims"
        if t.constant_buffer_idx and t.constant_buffer_idx >= n_consts:  # 0: not a constant
            yield f"{v}: constant_buffer_idx {t.constant_buffer_idx} outside constant_data ({n_consts} entries)"
        if t.flags & ~(_FLAG_INPUT | _FLAG_OUTPUT):
            yield f"{v}: unknown flags {t.flags:#x} (1 input, 2 output)"
        if (t.flags & (_FLAG_INPUT | _FLAG_OUTPUT) != 0) != (t.external_id != s.INVALID_ID):
            yield f"{v}: flags {t.flags} do not match external_id {t.external_id:#x}"
        elif t.external_id != s.INVALID_ID:
            if t.external_id >= graph.num_externs:
                yield f"{v}: external_id {t.external_id} not below num_externs {graph.num_externs}"
            elif externals.setdefault(t.external_id, i) != i:
                yield f"{v}: external_id {t.external_id} also used by xvalues[{externals[t.external_id]}]"
        u = value.xvalue_union
        q = u.quant_params if isinstance(u, s.XNNQuantizedTensorValue) else None
        if isinstance(q, (s.PerChannelQuant, s.PerChannelGroupQuant)) and q.scale_buffer_idx >= n_consts:
            yield f"{v}: scale_buffer_idx {q.scale_buffer_idx} outside constant_data ({n_consts} entries)"


def _short(ids: tuple[int, ...]) -> str:
    return str(list(ids)) if len(ids) <= 8 else f"[{', '.join(map(str, ids[:8]))}, ... {len(ids)} ids]"


def _io_problems(graph: s.XNNGraph, ids: dict[int, s.XNNTensorValue]) -> Iterator[str]:
    for field, flag, word in (("input_ids", _FLAG_INPUT, "input"), ("output_ids", _FLAG_OUTPUT, "output")):
        listed: tuple[int, ...] = getattr(graph, field)
        listed_set = set(listed)
        for vid in listed:
            t = ids.get(vid)
            if t is None:
                yield f"{field} lists {vid}, which no value defines"
            elif not t.flags & flag:
                yield f"{field} lists value {vid}, which is not flagged {word} (flags {t.flags})"
        for vid, t in ids.items():
            if t.flags & flag and vid not in listed_set:
                yield f"value {vid} is flagged {word} but {field} {_short(listed)} does not list it"


def _node_problems(graph: s.XNNGraph, ids: dict[int, s.XNNTensorValue]) -> Iterator[str]:
    for k, node in enumerate(graph.xnodes):
        u = node.xnode_union
        if u is None:
            yield f"xnodes[{k}] has no operator"
            continue
        where = f"xnodes[{k}] ({type(u).__name__.removeprefix('XNN')}, debug handle {node.debug_handle})"
        for name in u.__struct_fields__:
            if not name.endswith("_id"):
                continue
            vid = getattr(u, name)
            # An absent optional operand (bias, the unused inputs of a concatenation, a mask) is
            # INVALID_ID; an output never is.
            if vid == s.INVALID_ID and not name.startswith("output"):
                continue
            if vid not in ids:
                shown = f"{vid:#x}" if vid == s.INVALID_ID else str(vid)
                yield f"{where}: {name} {shown} is not a value id"


def _constant_problems(graph: s.XNNGraph, constant_data_size: int) -> Iterator[str]:
    for i, c in enumerate(graph.constant_data):
        if c.named_key or (i == 0 and c.offset == 0 and c.size == 0):
            continue
        if c.offset == _UINT64_MAX:
            yield f"constant_data[{i}] is named data (offset UINT64_MAX) without a named_key"
        elif c.offset + c.size > constant_data_size:
            yield (f"constant_data[{i}] at {c.offset}+{c.size} lies outside the blob's "
                   f"{constant_data_size} bytes of constant data")


def check_graph(graph: s.XNNGraph, *, constant_data_size: int) -> None:
    """Refuse a decoded graph the runtime cannot load: ids defined once and in range, input/output
    flags matching `input_ids`/`output_ids` and the external ids, operands that are values,
    constants inside the `constant_data_size` bytes of constant data or named."""
    ids: dict[int, s.XNNTensorValue] = {}
    # Generators, counted rather than kept: a hostile graph may have a problem per value.
    problems = itertools.chain(
        _value_problems(graph, ids), _io_problems(graph, ids), _node_problems(graph, ids),
        _constant_problems(graph, constant_data_size),
    )
    first = next(problems, None)
    if first is not None:
        more = sum(1 for _ in problems)
        raise XnnpackBlobError(f"damaged XNNPACK graph: {first}" + (f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""))
