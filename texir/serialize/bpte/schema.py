"""Frozen msgspec mirror of ExecuTorch 1.5.1's `bundled_program_schema.fbs` (the `.bpte` flatbuffer, BP08).

A bundled program is a serialized `.pte` plus test cases: for some of its methods, sets of inputs
and the outputs they are expected to produce. One Struct per flatbuffer table, same names and field
order as the schema (field position is the slot id; the `val` union takes two slots, tag then value).
`ScalarType` is scalar_type.fbs's, shared with the `.pte` schema. Byte payloads (`Tensor.data`,
`BundledProgram.program`) are `texir.ir.Blob` views, never copies.
"""

from __future__ import annotations

from typing import Final

from msgspec import Struct

from texir.ir.blob import Blob
from texir.serialize.pte.schema import ScalarType

__all__ = [
    "BUNDLED_FILE_IDENTIFIER",
    "BUNDLED_SCHEMA_VERSION",
    "Bool",
    "BundledMethodTestCase",
    "BundledMethodTestSuite",
    "BundledProgram",
    "Double",
    "Int",
    "ScalarType",
    "Tensor",
    "VALUE_TYPES",
    "Value",
    "ValueUnion",
]

BUNDLED_FILE_IDENTIFIER: Final = b"BP08"
"""`file_identifier` of bundled_program_schema.fbs; the 1.5.1 runtime checks it."""

BUNDLED_SCHEMA_VERSION: Final = 2
"""`BundledProgram.version` ExecuTorch 1.5.1 writes (`BUNDLED_PROGRAM_SCHEMA_VERSION`)."""


class _Table(Struct, frozen=True, kw_only=True):
    """Base of every table struct (frozen, keyword-only, hashable)."""


class _Member(Struct, frozen=True, kw_only=True, tag_field="kind"):
    """Base of the members of the `ValueUnion` union (tag = member name)."""


class Int(_Member, frozen=True, kw_only=True, tag=True):
    """See bundled_program_schema.fbs `table Int`."""

    int_val: int = 0


class Bool(_Member, frozen=True, kw_only=True, tag=True):
    """See bundled_program_schema.fbs `table Bool`."""

    bool_val: bool = False


class Double(_Member, frozen=True, kw_only=True, tag=True):
    """See bundled_program_schema.fbs `table Double`. NaN is not equal to itself here either."""

    double_val: float = 0.0


class Tensor(_Member, frozen=True, kw_only=True, tag=True):
    """See bundled_program_schema.fbs `table Tensor`: a whole tensor, sizes and bytes.

    `data` holds the elements in the memory order `dim_order` gives (contiguous: 0, 1, ..., n-1),
    little-endian, exactly numel x element size bytes."""

    scalar_type: ScalarType
    sizes: tuple[int, ...]
    data: Blob
    dim_order: tuple[int, ...]


ValueUnion = Tensor | Int | Bool | Double

VALUE_TYPES: Final[tuple[type, ...]] = (Tensor, Int, Bool, Double)
"""Members of `union ValueUnion` in declaration order: the union tag of `VALUE_TYPES[i]` is i + 1."""


class Value(_Table, frozen=True, kw_only=True):
    """See bundled_program_schema.fbs `table Value`."""

    val: ValueUnion


class BundledMethodTestCase(_Table, frozen=True, kw_only=True):
    """See bundled_program_schema.fbs `table BundledMethodTestCase`.

    `inputs` match the method's inputs in number, kind, dtype and shape; `expected_outputs` are
    tensors matching its outputs, or empty (a case to run, with nothing to compare)."""

    inputs: tuple[Value, ...]
    expected_outputs: tuple[Value, ...] = ()


class BundledMethodTestSuite(_Table, frozen=True, kw_only=True):
    """See bundled_program_schema.fbs `table BundledMethodTestSuite`: the cases of one method."""

    method_name: str
    test_cases: tuple[BundledMethodTestCase, ...]


class BundledProgram(_Table, frozen=True, kw_only=True):
    """See bundled_program_schema.fbs `table BundledProgram` (the root).

    Invariant (checked by `texir.serialize.bpte.check_cases`, which `dumps` runs): suites are sorted
    by method name, one per method at most, each naming a method of `program`, whose cases fit it."""

    version: int = BUNDLED_SCHEMA_VERSION
    method_test_suites: tuple[BundledMethodTestSuite, ...]
    program: Blob
    """The `.pte` bytes, as written (flatbuffer, header and segments)."""
