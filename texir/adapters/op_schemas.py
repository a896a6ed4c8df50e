"""Operator schema facts from torch for the .pte emitter: argument lists, out variants, view copies."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal

from texir.errors import PteError
from texir.ir.literals import literal_arg
from texir.ir.types import (
    Argument,
    IntArg,
    ListArg,
)

__all__ = [
    "ArgKind",
    "ArgSchema",
    "OpFacts",
    "OpSchema",
    "OpSchemaError",
    "SYM_OPS",
    "is_inplace",
    "is_view",
    "op_facts",
    "op_schema",
    "out_variant",
    "view_copy_target",
]

ArgKind = Literal[
    "tensor", "optional_tensor", "tensor_list", "optional_tensor_list", "int", "int_list",
    "float", "float_list", "bool", "bool_list", "scalar", "str", "other",
]


class OpSchemaError(PteError):
    """An operator's schema is unknown to torch or has no usable out variant."""


@dataclass(frozen=True)
class ArgSchema:
    """One schema argument; `default` is the IR spelling of its default value, if any."""

    name: str
    kind: ArgKind
    optional: bool
    kwarg_only: bool
    is_out: bool
    default: Argument | None
    has_default: bool


@dataclass(frozen=True)
class OpSchema:
    """One operator overload: ``namespace::name`` plus its overload ('' for default)."""

    name: str
    overload: str
    arguments: tuple[ArgSchema, ...]
    num_returns: int
    is_mutable: bool

    @property
    def target(self) -> str:
        return f"{self.name}.{self.overload or 'default'}"

    @property
    def out_args(self) -> tuple[ArgSchema, ...]:
        return tuple(a for a in self.arguments if a.is_out)

    @property
    def in_args(self) -> tuple[ArgSchema, ...]:
        return tuple(a for a in self.arguments if not a.is_out)


# Ops that compute symbolic ints: the emitter gives them an Int(0) result slot the kernel fills.
SYM_OPS: frozenset[str] = frozenset({
    "aten::sym_size.int", "aten::sym_numel.default", "aten::sym_stride.int",
    "aten::sym_storage_offset.default", "aten::_local_scalar_dense.default",
})

# ExecuTorch's dim-order ops (MemoryFormatOpsPass). torch does not know them unless executorch is
# imported, and texir never imports executorch, so their schemas are spelled out here.
_EXTRA_SCHEMAS: dict[str, tuple[str, ...]] = {
    "dim_order_ops::_to_dim_order_copy": (
        "dim_order_ops::_to_dim_order_copy(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, "
        "Device? device=None, bool? pin_memory=None, bool non_blocking=False, int[]? dim_order=None) -> Tensor",
        "dim_order_ops::_to_dim_order_copy.out(Tensor self, *, bool non_blocking=False, "
        "int[]? dim_order=None, Tensor(a!) out) -> Tensor(a!)",
    ),
    "dim_order_ops::_empty_dim_order": (
        "dim_order_ops::_empty_dim_order(int[] size, *, ScalarType? dtype=None, Layout? layout=None, "
        "Device? device=None, bool? pin_memory=None, int[]? dim_order=None) -> Tensor",
        "dim_order_ops::_empty_dim_order.out(int[] size, *, int[]? dim_order=None, Tensor(a!) out) -> Tensor(a!)",
    ),
    "dim_order_ops::_clone_dim_order": (
        "dim_order_ops::_clone_dim_order(Tensor self, *, bool non_blocking=False, int[]? dim_order=None) -> Tensor",
        "dim_order_ops::_clone_dim_order.out(Tensor self, *, bool non_blocking=False, int[]? dim_order=None, "
        "Tensor(a!) out) -> Tensor(a!)",
    ),
    "executorch_prim::et_view": (
        "executorch_prim::et_view(Tensor self, int[] size) -> Tensor",
    ),
}

# View ops whose copy variant is not `<name>_copy` with the same overload.
_VIEW_COPY_OVERRIDES: dict[str, str] = {
    "aten::_unsafe_view.default": "aten::view_copy.default",
    "aten::t.default": "aten::permute_copy.default",
    "aten::reshape.default": "aten::view_copy.default",
}


def _split_target(target: str) -> tuple[str, str]:
    """'aten::add.Tensor' -> ('aten::add', 'Tensor'); '.default' -> ''."""
    if "::" not in target:
        raise OpSchemaError(f"operator {target!r} has no namespace; spell it like 'aten::add.Tensor'")
    name, _, overload = target.partition(".")
    if overload == "default":
        overload = ""
    return name, overload


def _kind(type_: Any) -> tuple[ArgKind, bool]:
    import torch

    optional = False
    if isinstance(type_, torch.OptionalType):
        optional = True
        type_ = type_.getElementType()
    if isinstance(type_, torch.TensorType):
        return ("optional_tensor" if optional else "tensor"), optional
    if isinstance(type_, torch.ListType):
        elem = type_.getElementType()
        if isinstance(elem, torch.OptionalType) and isinstance(elem.getElementType(), torch.TensorType):
            return "optional_tensor_list", optional
        if isinstance(elem, torch.TensorType):
            return "tensor_list", optional
        if isinstance(elem, (torch.IntType, torch.SymIntType)):
            return "int_list", optional
        if isinstance(elem, torch.FloatType):
            return "float_list", optional
        if isinstance(elem, torch.BoolType):
            return "bool_list", optional
        return "other", optional
    if isinstance(type_, (torch.IntType, torch.SymIntType)):
        return "int", optional
    if isinstance(type_, torch.FloatType):
        return "float", optional
    if isinstance(type_, torch.BoolType):
        return "bool", optional
    if isinstance(type_, torch.NumberType):
        return "scalar", optional
    if isinstance(type_, torch.StringType):
        return "str", optional
    return "other", optional


def _default(value: Any) -> Argument:
    if isinstance(value, (list, tuple)):
        return ListArg(items=tuple(_default(v) for v in value))
    try:
        return literal_arg(value)
    except TypeError:
        # Enum defaults (layout, memory format, dtype) arrive as ints in torch's schema objects.
        return IntArg(value=int(value))


def _convert(schema: Any) -> OpSchema:
    args = []
    for a in schema.arguments:
        kind, optional = _kind(a.type)
        has_default = bool(a.has_default_value())
        args.append(ArgSchema(
            name=a.name, kind=kind, optional=optional, kwarg_only=bool(a.kwarg_only),
            is_out=bool(a.is_out), default=_default(a.default_value) if has_default else None,
            has_default=has_default,
        ))
    return OpSchema(
        name=schema.name, overload=schema.overload_name, arguments=tuple(args),
        num_returns=len(schema.returns), is_mutable=bool(schema.is_mutable),
    )


@functools.cache
def _schemas_for(name: str) -> tuple[OpSchema, ...]:
    import torch

    if name in _EXTRA_SCHEMAS:
        return tuple(_convert(torch._C.parse_schema(s)) for s in _EXTRA_SCHEMAS[name])
    return tuple(_convert(s) for s in torch._C._jit_get_schemas_for_operator(name))


@functools.cache
def op_schema(target: str) -> OpSchema:
    """The schema of a canonical op string such as ``aten::add.Tensor``."""
    name, overload = _split_target(target)
    for schema in _schemas_for(name):
        if schema.overload == overload:
            return schema
    raise OpSchemaError(
        f"operator {target!r} is not known to torch; check the op name and overload "
        "(core ATen programs come from from_exported_program(ep, decompose=True), or --decompose)"
    )


_TENSOR_OPTIONS = frozenset({"dtype", "layout", "device", "pin_memory"})


def _signature(schema: OpSchema, *, strip_options: bool = False) -> tuple[tuple[str, ArgKind, bool], ...]:
    return tuple(
        (a.name, a.kind, a.optional) for a in schema.in_args
        if not (strip_options and a.name in _TENSOR_OPTIONS)
    )


def _is_out_schema(schema: OpSchema) -> bool:
    return bool(schema.out_args) and all(a.kwarg_only for a in schema.out_args)


@functools.cache
def out_variant(target: str) -> OpSchema | None:
    """The out-variant overload with the same non-out arguments (``add.Tensor`` -> ``add.out``,
    ``max.dim`` -> ``max.dim_max``); the schema itself if it is an out variant; None if none exists."""
    schema = op_schema(target)
    if _is_out_schema(schema):
        return schema
    wanted = _signature(schema)
    candidates = [c for c in _schemas_for(schema.name) if _is_out_schema(c)]
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


@functools.cache
def is_view(target: str) -> bool:
    """True for ops whose result aliases an input without writing it (view, permute, select...)."""
    if target in _VIEW_COPY_OVERRIDES:
        return True
    if target.startswith("dim_order_ops::") or target.startswith("executorch_prim::"):
        return False
    import torch

    name, overload = _split_target(target)
    for s in torch._C._jit_get_schemas_for_operator(name):
        if s.overload_name == overload:
            return any(
                r.alias_info is not None and not r.alias_info.is_write for r in s.returns
            ) and not any(a.alias_info is not None and a.alias_info.is_write for a in s.arguments)
    return False


@functools.cache
def view_copy_target(target: str) -> str | None:
    """The copy variant of a view op (``aten::view.default`` -> ``aten::view_copy.default``)."""
    if target in _VIEW_COPY_OVERRIDES:
        return _VIEW_COPY_OVERRIDES[target]
    if not is_view(target):
        return None
    name, overload = _split_target(target)
    candidate = f"{name}_copy.{overload or 'default'}"
    try:
        op_schema(candidate)
    except OpSchemaError:
        return None
    return candidate


@functools.cache
def is_inplace(target: str) -> bool:
    """True for ops that write one of their non-out inputs (``copy_``, ``index_put_``)."""
    schema = op_schema(target)
    return schema.is_mutable and not _is_out_schema(schema)


@dataclass(frozen=True)
class OpFacts:
    """Everything the edge passes and the emitter ask about one operator, resolved once."""

    target: str
    schema: OpSchema
    """The functional schema the node calls."""
    out: OpSchema | None
    """Its out variant (what a `.pte` kernel call runs), or None."""
    is_view: bool
    view_copy: str | None
    """The copy variant's target when the op is a view."""


@functools.cache
def op_facts(target: str) -> OpFacts | None:
    """The facts of a torch operator target, or None when torch has no such operator."""
    try:
        schema = op_schema(target)
    except OpSchemaError:
        return None
    view = is_view(target)
    return OpFacts(
        target=target, schema=schema, out=out_variant(target), is_view=view,
        view_copy=view_copy_target(target) if view else None,
    )
