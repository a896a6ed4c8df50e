"""Encode and decode `.bpte` files (ExecuTorch's bundled programs, flatbuffer identifier BP08).

The writer builds the flatbuffer with `flatbuffers.Builder` in the order ExecuTorch 1.5.1's
`serialize_from_bundled_program_to_flatbuffer` does (members before their tables, vectors before
the table that holds them, the program bytes after the suites), so the same bundle gives the same
bytes. The reader follows no offset it has not checked against the buffer.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

import flatbuffers

from texir.serialize.fb_builder import Builder
from texir._io import atomic_write
from texir.errors import PteError
from texir.ir.blob import Blob
from texir.serialize.bpte import schema as b
from texir.serialize.bpte.check import BundleCaseError, check_cases
from texir.serialize.fb_reader import FbReader, PteDecodeError, Tab, file_view
from texir.serialize.pte._fbwrite import PteEncodeError
from texir.serialize.pte.schema import ScalarType

__all__ = ["BpteDecodeError", "BpteEncodeError", "BundleCaseError", "dump", "dumps", "load", "loads", "make_bundle",
           "read_bundle"]

_TAG: dict[type, int] = {cls: i + 1 for i, cls in enumerate(b.VALUE_TYPES)}
_PROGRAM_ALIGN = 32
"""force_align of `BundledProgram.program`: the .pte keeps every alignment it needs inside."""
_TENSOR_DATA_ALIGN = 16
"""force_align of `Tensor.data`."""
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_BOOL = struct.Struct("<?")
_F64 = struct.Struct("<d")


class BpteEncodeError(PteEncodeError):
    """A bundled program cannot be written (a value out of its field's range)."""


class BpteDecodeError(PteDecodeError):
    """`.bpte` bytes are malformed, truncated or of an unsupported version."""


# --- encoding -------------------------------------------------------------------------------------


def _bytes_vector(fb: flatbuffers.Builder, data: memoryview, alignment: int) -> int:
    n = data.nbytes
    fb.StartVector(1, n, alignment)
    fb.head = fb.head - n
    fb.Bytes[fb.head : fb.head + n] = data
    return int(fb.EndVector())


def _offsets(fb: flatbuffers.Builder, offsets: Sequence[int]) -> int:
    fb.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        fb.PrependUOffsetTRelative(off)
    return int(fb.EndVector())


def _member(fb: flatbuffers.Builder, val: b.ValueUnion) -> int:
    if isinstance(val, b.Tensor):
        fb.StartVector(4, len(val.sizes), 4)
        for d in reversed(val.sizes):
            fb.PrependInt32(d)
        sizes = fb.EndVector()
        data = _bytes_vector(fb, val.data.view(), _TENSOR_DATA_ALIGN)
        dim_order = _bytes_vector(fb, memoryview(bytes(val.dim_order)), 1)
        fb.StartObject(4)
        fb.PrependInt8Slot(0, int(val.scalar_type), 0)
        fb.PrependUOffsetTRelativeSlot(1, sizes, 0)
        fb.PrependUOffsetTRelativeSlot(2, data, 0)
        fb.PrependUOffsetTRelativeSlot(3, dim_order, 0)
        return int(fb.EndObject())
    fb.StartObject(1)
    if isinstance(val, b.Int):
        fb.PrependInt64Slot(0, val.int_val, 0)
    elif isinstance(val, b.Bool):
        fb.PrependBoolSlot(0, val.bool_val, False)
    else:
        fb.PrependFloat64Slot(0, val.double_val, 0.0)
    return int(fb.EndObject())


def _value(fb: flatbuffers.Builder, v: b.Value, where: str) -> int:
    tag = _TAG.get(type(v.val))
    if tag is None:
        raise BpteEncodeError(f"{where}: {type(v.val).__name__} is not a ValueUnion member (Tensor, Int, Bool, Double)")
    member = _member(fb, v.val)
    fb.StartObject(2)
    fb.PrependUint8Slot(0, tag, 0)
    fb.PrependUOffsetTRelativeSlot(1, member, 0)
    return int(fb.EndObject())


def _case(fb: flatbuffers.Builder, case: b.BundledMethodTestCase, where: str) -> int:
    inputs = _offsets(fb, [_value(fb, v, f"{where}.inputs[{i}]") for i, v in enumerate(case.inputs)])
    outputs = _offsets(
        fb, [_value(fb, v, f"{where}.expected_outputs[{i}]") for i, v in enumerate(case.expected_outputs)]
    )
    fb.StartObject(2)
    fb.PrependUOffsetTRelativeSlot(0, inputs, 0)
    fb.PrependUOffsetTRelativeSlot(1, outputs, 0)
    return int(fb.EndObject())


def _suite(fb: flatbuffers.Builder, suite: b.BundledMethodTestSuite) -> int:
    name = fb.CreateString(suite.method_name)
    where = f"method {suite.method_name!r}"
    cases = _offsets(fb, [_case(fb, c, f"{where} case {i}") for i, c in enumerate(suite.test_cases)])
    fb.StartObject(2)
    fb.PrependUOffsetTRelativeSlot(0, name, 0)
    fb.PrependUOffsetTRelativeSlot(1, cases, 0)
    return int(fb.EndObject())


def _encode(bundle: b.BundledProgram) -> bytes:
    data_size = bundle.program.nbytes + sum(
        v.val.data.nbytes
        for suite in bundle.method_test_suites
        for case in suite.test_cases
        for v in (*case.inputs, *case.expected_outputs)
        if isinstance(v.val, b.Tensor)
    )
    fb = Builder(data_size + 64 * 1024)
    try:
        suites = _offsets(fb, [_suite(fb, s) for s in bundle.method_test_suites])
        program = _bytes_vector(fb, bundle.program.view(), _PROGRAM_ALIGN)
        fb.StartObject(3)
        fb.PrependUint32Slot(0, bundle.version, 0)
        fb.PrependUOffsetTRelativeSlot(1, suites, 0)
        fb.PrependUOffsetTRelativeSlot(2, program, 0)
        fb.Finish(fb.EndObject(), file_identifier=b.BUNDLED_FILE_IDENTIFIER)
    except PteError:
        raise
    except (struct.error, TypeError, ValueError, OverflowError, AttributeError) as exc:
        raise BpteEncodeError(
            f"cannot encode BundledProgram: {exc}; check that every integer fits its field (int32 sizes, "
            "int64 Int values, uint32 version)"
        ) from exc
    return bytes(fb.Output())


def make_bundle(
    program: bytes | bytearray | memoryview | Blob,
    cases: Mapping[str, Sequence[b.BundledMethodTestCase]],
) -> b.BundledProgram:
    """A checked BundledProgram of the `.pte` bytes `program` and `cases` (method name -> cases);
    suites are sorted by method name, as ExecuTorch writes them."""
    blob = program if isinstance(program, Blob) else Blob(program)
    suites = tuple(
        b.BundledMethodTestSuite(method_name=name, test_cases=tuple(cases[name])) for name in sorted(cases)
    )
    bundle = b.BundledProgram(method_test_suites=suites, program=blob)
    check_cases(bundle)
    return bundle


def dumps(bundle: b.BundledProgram) -> bytes:
    """The `.bpte` bytes of `bundle`, after `check_cases` (every case fits its method)."""
    check_cases(bundle)
    return _encode(bundle)


def dump(bundle: b.BundledProgram, path: str | os.PathLike[str]) -> None:
    """Check `bundle` and write it to `path` atomically (nothing is written when a check fails)."""
    data = dumps(bundle)
    atomic_write(path, (memoryview(data),), error=PteError)


# --- decoding -------------------------------------------------------------------------------------


class _BundleReader(FbReader):
    """The `.pte` reader's checked primitives, failing with `.bpte` errors."""

    def fail(self, where: str, msg: str) -> NoReturn:
        raise BpteDecodeError(f"malformed .bpte flatbuffer at {where}: {msg}")

    def string_at(self, pos: int, where: str) -> str:
        text = super().string_at(pos, where)
        end = pos + 4 + len(text.encode("utf-8"))
        if end >= self.n or self.d[end] != 0:
            self.fail(where, "string is not NUL-terminated inside the buffer (truncated file?)")
        return text

    def value(self, pos: int, where: str) -> b.Value:
        t = self.table(pos, where)
        tag = self.scalar_u8(t, 0, where)
        if not 1 <= tag <= len(b.VALUE_TYPES):
            self.fail(where, f"Value.val_type {tag} is not a ValueUnion member (1..{len(b.VALUE_TYPES)})")
        vp = self.ref(t, 1, where)
        if vp < 0:
            self.fail(where, "Value has no val table")
        cls = b.VALUE_TYPES[tag - 1]
        m = self.table(vp, where)
        val: b.ValueUnion
        if cls is b.Tensor:
            st = self.i8(m, 0, where)
            try:
                scalar_type = ScalarType(st)
            except ValueError:
                self.fail(where, f"Tensor.scalar_type {st} is not a ScalarType of scalar_type.fbs")
            val = b.Tensor(
                scalar_type=scalar_type,
                sizes=self.ints(m, 1, "i", 4, where + ".sizes"),
                data=self.blob(m, 2, where + ".data"),
                dim_order=self.ints(m, 3, "B", 1, where + ".dim_order"),
            )
        elif cls is b.Int:
            val = b.Int(int_val=int(self.scalar(m, 0, _I64, 0, where)))  # type: ignore[call-overload]  # i64
        elif cls is b.Bool:
            val = b.Bool(bool_val=bool(self.scalar(m, 0, _BOOL, False, where)))
        else:
            val = b.Double(double_val=float(self.scalar(m, 0, _F64, 0.0, where)))  # type: ignore[arg-type]  # f64
        return b.Value(val=val)

    def scalar_u8(self, t: Tab, slot: int, where: str) -> int:
        p = self.field(t, slot, 1, where)
        return int(self.d[p]) if p else 0

    def values(self, t: Tab, slot: int, where: str) -> tuple[b.Value, ...]:
        return tuple(self.value(p, f"{where}[{i}]") for i, p in enumerate(self.table_list(t, slot, where)))

    def bundle(self, pos: int) -> b.BundledProgram:
        where = "BundledProgram"
        t = self.table(pos, where)
        version = self.u32(t, 0, where)
        if version != b.BUNDLED_SCHEMA_VERSION:
            raise BpteDecodeError(
                f"BundledProgram.version is {version}; texir reads schema version {b.BUNDLED_SCHEMA_VERSION} "
                "(ExecuTorch 1.5.1) only"
            )
        suites = []
        for i, p in enumerate(self.table_list(t, 1, where)):
            st = self.table(p, f"method_test_suites[{i}]")
            name = self.req_string(st, 0, f"method_test_suites[{i}].method_name")
            w = f"method {name!r}"
            cases = []
            for k, cp in enumerate(self.table_list(st, 1, w)):
                ct = self.table(cp, f"{w} case {k}")
                cases.append(
                    b.BundledMethodTestCase(
                        inputs=self.values(ct, 0, f"{w} case {k}.inputs"),
                        expected_outputs=self.values(ct, 1, f"{w} case {k}.expected_outputs"),
                    )
                )
            suites.append(b.BundledMethodTestSuite(method_name=name, test_cases=tuple(cases)))
        if self.ref(t, 2, where) < 0:
            self.fail(where, "BundledProgram.program (the .pte bytes) is missing")
        return b.BundledProgram(version=version, method_test_suites=tuple(suites), program=self.blob(t, 2, where))


def read_bundle(data: bytes | bytearray | memoryview) -> b.BundledProgram:
    """Decode `.bpte` bytes as stored, without checking the cases against the program."""
    view, ident = file_view(data, kind=".bpte", error=BpteDecodeError)
    n = view.nbytes
    if ident != b.BUNDLED_FILE_IDENTIFIER:
        raise BpteDecodeError(f"not a .bpte file: file identifier {ident!r} != {b.BUNDLED_FILE_IDENTIFIER!r}")
    reader = _BundleReader(view, n)
    return reader.bundle(int(_U32.unpack_from(view, 0)[0]))


def loads(data: bytes | bytearray | memoryview) -> b.BundledProgram:
    """Decode `.bpte` bytes (texir's or ExecuTorch's) and check every case against its method.

    Payloads are zero-copy views of `data`. Malformed or truncated input raises `BpteDecodeError`;
    a case that does not fit its method (or a method the program lacks) raises `BundleCaseError`."""
    bundle = read_bundle(data)
    check_cases(bundle)
    return bundle


def load(path: str | os.PathLike[str]) -> b.BundledProgram:
    """Read and decode the `.bpte` file at `path`."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise PteError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return loads(data)

