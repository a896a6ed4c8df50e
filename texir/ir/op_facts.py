"""What the edge passes and the emitter know about an operator, from schema strings, without torch.

The strings come from two places: the packaged table `op_schemas.json` (torch's registry for the
namespaces texir emits, written by `tools/gen_op_schemas.py`; tests/test_op_schemas.py checks it
against torch), and, for operators outside it (custom ops), the strings the adapter recorded at
import in `Program.op_schemas`. `op_table(program.op_schemas)` is the table of one program; the
module-level functions read the packaged table alone.
"""

from __future__ import annotations

import bisect
import functools
import importlib.resources
from collections.abc import Iterable

import msgspec

from texir.ir.op_schema import ArgKind, ArgSchema, OpSchema, OpSchemaError, parse_schema, split_target
from texir.ir.types import CallFunction, Graph

__all__ = [
    "ArgSchema",
    "OpFacts",
    "OpSchema",
    "OpSchemaError",
    "OpTable",
    "SYM_OPS",
    "TABLE_FILE",
    "is_inplace",
    "is_view",
    "op_facts",
    "op_schema",
    "op_table",
    "out_variant",
    "packaged_schemas",
    "schemas_used_by",
    "view_copy_target",
]

TABLE_FILE = "op_schemas.json"

# Ops that compute symbolic ints: the emitter gives them an Int(0) result slot the kernel fills.
SYM_OPS: frozenset[str] = frozenset({
    "aten::sym_size.int", "aten::sym_numel.default", "aten::sym_stride.int",
    "aten::sym_storage_offset.default", "aten::_local_scalar_dense.default",
})

# View ops whose copy variant is not `<name>_copy` with the same overload.
_VIEW_COPY_OVERRIDES: dict[str, str] = {
    "aten::_unsafe_view.default": "aten::view_copy.default",
    "aten::t.default": "aten::permute_copy.default",
    "aten::reshape.default": "aten::view_copy.default",
}

# ExecuTorch's own namespaces: their ops are never views (exir keeps them as they are).
_NEVER_VIEWS = ("dim_order_ops::", "executorch_prim::")

_TENSOR_OPTIONS = frozenset({"dtype", "layout", "device", "pin_memory"})


class _TableFile(msgspec.Struct, frozen=True):
    torch: str
    schemas: tuple[str, ...]


@functools.cache
def packaged_schemas() -> tuple[str, ...]:
    """The schema strings of the packaged table, sorted."""
    data = importlib.resources.files("texir.ir").joinpath(TABLE_FILE).read_bytes()
    return msgspec.json.decode(data, type=_TableFile).schemas


def _name_of(text: str) -> str:
    head = text.split("(", 1)[0]
    return head.split(".", 1)[0]


def _overload_of(text: str) -> str:
    """'aten::add.Tensor(Tensor self, ...' -> 'Tensor'; '' for the default overload (as
    `parse_schema` reads the head)."""
    return text.split("(", 1)[0].partition(".")[2]


class OpFacts(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the edge passes and the emitter ask about one operator, resolved once."""

    target: str
    schema: OpSchema
    """The functional schema the node calls."""
    out: OpSchema | None
    """Its out variant (what a `.pte` kernel call runs), or None."""
    is_view: bool
    view_copy: str | None
    """The copy variant's target when the op is a view."""


def _signature(schema: OpSchema, *, strip_options: bool = False) -> tuple[tuple[str, ArgKind, bool], ...]:
    return tuple(
        (a.name, a.kind, a.optional) for a in schema.in_args
        if not (strip_options and a.name in _TENSOR_OPTIONS)
    )


def _is_out_schema(schema: OpSchema) -> bool:
    return bool(schema.out_args) and all(a.kwarg_only for a in schema.out_args)


class OpTable:
    """Operator schemas by name, parsed on first use; the facts functions over them."""

    def __init__(self, schemas: Iterable[str]) -> None:
        # Sorted (the packaged table is), an op's overloads are one run ('aten::add(' and
        # 'aten::add.' sort together, '(' and '.' before every character a name goes on with):
        # found by bisection when first asked for, not grouped here over the 3,800 schemas.
        texts = tuple(schemas)
        self._sorted: tuple[str, ...] | None = texts if all(a <= b for a, b in zip(texts, texts[1:])) else None
        self._groups: dict[str, tuple[str, ...]] = {}
        if self._sorted is None:  # (a program's own schemas added: grouped in their order)
            by_name: dict[str, list[str]] = {}
            for text in texts:
                by_name.setdefault(_name_of(text), []).append(text)
            self._groups = {k: tuple(v) for k, v in by_name.items()}
        self._parsed: dict[str, tuple[OpSchema, ...]] = {}
        self._one: dict[str, OpSchema] = {}  # schema text -> its parse
        self._facts: dict[str, OpFacts | None] = {}

    def _texts(self, name: str) -> tuple[str, ...]:
        """The schema texts of `name` ('aten::add'), in table order."""
        found = self._groups.get(name)
        texts = self._sorted
        if found is None and texts is not None:
            run = texts[bisect.bisect_left(texts, name + "("):bisect.bisect_left(texts, name + "/")]
            found = self._groups[name] = tuple(t for t in run if _name_of(t) == name)
        return found or ()

    def knows(self, name: str) -> bool:
        """Whether the table holds schemas of `name` ('aten::add')."""
        return bool(self._texts(name))

    def schemas_for(self, name: str) -> tuple[OpSchema, ...]:
        """Every overload of `name` ('aten::add')."""
        found = self._parsed.get(name)
        if found is None:
            found = self._parsed[name] = tuple(self._parse(t) for t in self._texts(name))
        return found

    def _parse(self, text: str) -> OpSchema:
        found = self._one.get(text)
        if found is None:
            found = self._one[text] = parse_schema(text)
        return found

    def op_schema(self, target: str) -> OpSchema:
        """The schema of a canonical op string such as ``aten::add.Tensor``."""
        name, overload = split_target(target)
        # Only the overload asked for is parsed (aten::add has a dozen): its text's head names it
        for text in self._texts(name):
            if _overload_of(text) == overload:
                return self._parse(text)
        raise OpSchemaError(
            f"operator {target!r} is not known to torch; check the op name and overload "
            "(core ATen programs come from texir.adapters.from_exported_program(ep, decompose=True), or "
            "`texir show/snapshot/diff --decompose`; "
            "a custom op's schema is recorded in Program.op_schemas when the program is imported)"
        )

    def out_variant(self, target: str) -> OpSchema | None:
        """The out-variant overload with the same non-out arguments (``add.Tensor`` -> ``add.out``,
        ``max.dim`` -> ``max.dim_max``); the schema itself if it is an out variant; None if none exists."""
        schema = self.op_schema(target)
        if _is_out_schema(schema):
            return schema
        # (an out argument is written, `Tensor(a!)`: a schema without "!" has none and is not parsed)
        candidates = [
            c for c in (self._parse(t) for t in self._texts(schema.name) if "!" in t) if _is_out_schema(c)
        ]
        wanted = _signature(schema)
        for candidate in candidates:
            if _signature(candidate) == wanted:
                return candidate
        # Factory and conversion ops: the out tensor carries dtype/layout/device, so the out variant
        # drops those TensorOptions arguments (full -> full.out, _to_copy -> _to_copy.out).
        wanted = _signature(schema, strip_options=True)
        for candidate in candidates:
            if _signature(candidate, strip_options=True) == wanted:
                return candidate
        return None

    def is_view(self, target: str) -> bool:
        """True for ops whose result aliases an input without writing it (view, permute, select...)."""
        if target in _VIEW_COPY_OVERRIDES:
            return True
        if target.startswith(_NEVER_VIEWS):
            return False
        try:
            schema = self.op_schema(target)
        except OpSchemaError:
            return False
        return any(r.alias is not None and not r.writes for r in schema.returns) and not any(
            a.writes for a in schema.arguments
        )

    def view_copy_target(self, target: str) -> str | None:
        """The copy variant of a view op (``aten::view.default`` -> ``aten::view_copy.default``)."""
        if target in _VIEW_COPY_OVERRIDES:
            return _VIEW_COPY_OVERRIDES[target]
        if not self.is_view(target):
            return None
        name, overload = split_target(target)
        candidate = f"{name}_copy.{overload or 'default'}"
        try:
            self.op_schema(candidate)
        except OpSchemaError:
            return None
        return candidate

    def is_inplace(self, target: str) -> bool:
        """True for ops that write one of their non-out inputs (``copy_``, ``index_put_``)."""
        schema = self.op_schema(target)
        return schema.is_mutable and not _is_out_schema(schema)

    def op_facts(self, target: str) -> OpFacts | None:
        """The facts of an operator target, or None when no schema of it is known."""
        if target in self._facts:
            return self._facts[target]
        try:
            schema = self.op_schema(target)
        except OpSchemaError:
            facts = None
        else:
            view = self.is_view(target)
            facts = OpFacts(
                target=target, schema=schema, out=self.out_variant(target), is_view=view,
                view_copy=self.view_copy_target(target) if view else None,
            )
        self._facts[target] = facts
        return facts


def schemas_used_by(graph: Graph, schemas: tuple[str, ...]) -> tuple[str, ...]:
    """The strings of `schemas` (a program's `op_schemas`) naming an operator that `graph` or a
    nested graph calls: what a sub-program cut from the program keeps."""
    if not schemas:
        return ()
    called: set[str] = set()
    stack = [graph]
    while stack:
        g = stack.pop()
        called.update(n.target.split(".", 1)[0] for n in g.nodes if isinstance(n, CallFunction))
        stack.extend(s.graph for s in g.subgraphs)
    return tuple(t for t in schemas if _name_of(t) in called)


@functools.cache
def op_table(extra: tuple[str, ...] = ()) -> OpTable:
    """The packaged table, plus `extra` schema strings (a program's `op_schemas`) for names it lacks."""
    packaged = packaged_schemas()
    if not extra:
        return OpTable(packaged)
    known = {_name_of(t) for t in packaged}
    return OpTable((*packaged, *(t for t in extra if _name_of(t) not in known)))


def op_schema(target: str) -> OpSchema:
    """`OpTable.op_schema` over the packaged table."""
    return op_table().op_schema(target)


def out_variant(target: str) -> OpSchema | None:
    """`OpTable.out_variant` over the packaged table."""
    return op_table().out_variant(target)


def is_view(target: str) -> bool:
    """`OpTable.is_view` over the packaged table."""
    return op_table().is_view(target)


def view_copy_target(target: str) -> str | None:
    """`OpTable.view_copy_target` over the packaged table."""
    return op_table().view_copy_target(target)


def is_inplace(target: str) -> bool:
    """`OpTable.is_inplace` over the packaged table."""
    return op_table().is_inplace(target)


def op_facts(target: str) -> OpFacts | None:
    """`OpTable.op_facts` over the packaged table."""
    return op_table().op_facts(target)

