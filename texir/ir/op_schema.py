"""Operator schemas without torch: the types, and a parser of the schema strings torch prints.

`parse_schema("aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor")` gives
the `OpSchema` texir's edge passes and emitter read. The grammar is the one `str(torch.FunctionSchema)`
writes (and `torch._C.parse_schema` reads): alias annotations (`Tensor(a!)`, `Tensor(a -> *)`),
optionals (`int?`), lists (`int[2]`, `SymInt[]`, `Tensor?[]`), `*` before keyword-only arguments,
defaults as torch reports them (enum defaults such as `contiguous_format` are ints there), and one
return, a list return, or a parenthesised tuple of them.
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

from texir.errors import PteError
from texir.ir.literals import literal_arg
from texir.ir.types import Argument, ListArg, NoneArg

__all__ = ["ArgKind", "ArgSchema", "OpSchema", "OpSchemaError", "ReturnSchema", "parse_schema", "split_target"]

ArgKind = Literal[
    "tensor", "optional_tensor", "tensor_list", "optional_tensor_list", "int", "int_list",
    "float", "float_list", "bool", "bool_list", "scalar", "str", "other",
]


class OpSchemaError(PteError):
    """An operator's schema is unknown, malformed, or has no usable out variant."""


class ArgSchema(msgspec.Struct, frozen=True, kw_only=True):
    """One schema argument; `default` is the IR spelling of its default value, if any."""

    name: str
    kind: ArgKind
    optional: bool
    kwarg_only: bool
    is_out: bool
    default: Argument | None
    has_default: bool
    alias: str | None = None
    """The alias set ('a'), if annotated."""
    writes: bool = False
    """True for `Tensor(a!)`: the op writes this argument."""


class ReturnSchema(msgspec.Struct, frozen=True, kw_only=True):
    """One return value: its alias set, if any (a view returns its input's set, unwritten)."""

    alias: str | None = None
    writes: bool = False


class OpSchema(msgspec.Struct, frozen=True, kw_only=True):
    """One operator overload: ``namespace::name`` plus its overload ('' for default)."""

    name: str
    overload: str
    arguments: tuple[ArgSchema, ...]
    returns: tuple[ReturnSchema, ...]
    text: str
    """The schema string this was parsed from."""

    @property
    def num_returns(self) -> int:
        return len(self.returns)

    @property
    def is_mutable(self) -> bool:
        return any(a.writes for a in self.arguments)

    @property
    def target(self) -> str:
        return f"{self.name}.{self.overload or 'default'}"

    @property
    def out_args(self) -> tuple[ArgSchema, ...]:
        return tuple(a for a in self.arguments if a.is_out)

    @property
    def in_args(self) -> tuple[ArgSchema, ...]:
        return tuple(a for a in self.arguments if not a.is_out)


def split_target(target: str) -> tuple[str, str]:
    """'aten::add.Tensor' -> ('aten::add', 'Tensor'); '.default' -> ''."""
    if "::" not in target:
        raise OpSchemaError(f"operator {target!r} has no namespace; spell it like 'aten::add.Tensor'")
    name, _, overload = target.partition(".")
    return name, "" if overload == "default" else overload


# Base type -> kind, and its kind as a list element; names not here are "other" (Device, Generator...).
_SCALAR_KINDS: dict[str, tuple[ArgKind, ArgKind]] = {
    "Tensor": ("tensor", "tensor_list"),
    "int": ("int", "int_list"), "SymInt": ("int", "int_list"),
    # torch types these enums as int (their defaults are ints too)
    "ScalarType": ("int", "int_list"), "Layout": ("int", "int_list"),
    "MemoryFormat": ("int", "int_list"), "QScheme": ("int", "int_list"),
    "float": ("float", "float_list"),
    "bool": ("bool", "bool_list"),
    "Scalar": ("scalar", "other"),
    "str": ("str", "other"),
}

_TYPE = re.compile(
    r"(?P<base>[A-Za-z_][\w.]*)"
    r"(?:\((?P<alias>[a-z*][\w|*]*)(?P<bang>!)?(?:\s*->\s*\*)?\))?"
    r"(?P<elem_opt>\?)?"
    r"(?P<list>\[\d*\])?"
    r"(?P<list_alias>\((?P<alias2>[a-z*][\w|*]*)(?P<bang2>!)?\))?"
    r"(?P<opt>\?)?$"
)


class _Type(msgspec.Struct, frozen=True):
    kind: ArgKind
    optional: bool
    alias: str | None
    writes: bool
    size: int | None = None
    """N for a fixed-size list `int[N]`."""


def _generic_rest(text: str) -> str | None:
    """For a type with parameters (`Dict(str, Tensor)`, `Future(t)`, `(int, int)`), what follows
    them; None for any other type."""
    base = re.match(r"[A-Za-z_]*", text)
    assert base is not None  # matches the empty string at least
    if base.group() not in _GENERICS or not text[base.end():].startswith("("):
        return None
    depth = 0
    for i in range(base.end(), len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[i + 1:]
    return None


# Types with parameters in parentheses ("" is a tuple); on any other name they are an alias annotation.
_GENERICS = frozenset({"", "Dict", "Future", "Await", "RRef", "Union", "Tuple", "tuple", "List", "Optional"})


def _parse_type(text: str, where: str) -> _Type:
    rest = _generic_rest(text)
    if rest is not None:
        text = "Any" + rest  # a generic: its parameters do not change what texir reads ("other")
    m = _TYPE.match(text)
    if m is None:
        raise OpSchemaError(f"schema {where!r}: cannot read the type {text!r}")
    base, is_list = m["base"], m["list"] is not None
    alias = m["alias"] or m["alias2"]
    writes = bool(m["bang"] or m["bang2"])
    kinds = _SCALAR_KINDS.get(base)
    if is_list:
        if base == "Tensor":
            kind: ArgKind = "optional_tensor_list" if m["elem_opt"] else "tensor_list"
        elif m["elem_opt"] or kinds is None:
            kind = "other"
        else:
            kind = kinds[1]
        size = m["list"][1:-1]
        return _Type(kind, bool(m["opt"]), alias, writes, int(size) if size else None)
    optional = bool(m["elem_opt"] or m["opt"])
    if kinds is None:
        return _Type("other", optional, alias, writes)
    kind = "optional_tensor" if base == "Tensor" and optional else kinds[0]
    return _Type(kind, optional, alias, writes)


def _split_top(text: str, where: str) -> list[str]:
    """`text` split at commas outside brackets and string literals."""
    parts: list[str] = []
    depth, start, i, quote = 0, 0, 0, ""
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "\"'":
            quote = c
        elif c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
            if depth < 0:
                raise OpSchemaError(f"schema {where!r}: unbalanced brackets")
        elif c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
        i += 1
    if quote or depth:
        raise OpSchemaError(f"schema {where!r}: an unterminated string or bracket")
    tail = text[start:].strip()
    if tail or parts:
        parts.append(tail)
    return parts


_ESCAPES = {"n": "\n", "t": "\t", "f": "\f", "v": "\v", "r": "\r", "a": "\a", "b": "\b", "0": "\0"}


def _unquote(text: str) -> str:
    out, i = [], 1
    while i < len(text) - 1:
        c = text[i]
        if c == "\\":
            i += 1
            out.append(_ESCAPES.get(text[i], text[i]))
        else:
            out.append(c)
        i += 1
    return "".join(out)


# The enum names torch's schema parser takes as defaults, and the ints it reports for them (it prints
# the int: `MemoryFormat? memory_format=contiguous_format` reads back as `=0`).
_ENUM_DEFAULTS: dict[str, int] = {
    "contiguous_format": 0, "strided": 0, "Mean": 1,
    "uint8": 0, "int8": 1, "int16": 2, "short": 2, "int32": 3, "int": 3, "int64": 4, "long": 4,
    "float16": 5, "half": 5, "float32": 6, "float": 6, "float64": 7, "double": 7, "complex32": 8, "chalf": 8,
    "complex64": 9, "cfloat": 9, "complex128": 10, "cdouble": 10, "bool": 11, "qint8": 12, "quint8": 13,
    "qint32": 14, "bfloat16": 15, "quint4x2": 16, "quint2x4": 17, "float8_e5m2": 23, "float8_e4m3fn": 24,
    "uint16": 27, "uint32": 28, "uint64": 29,
}


def _default(text: str, where: str) -> Argument:
    if text == "None":
        return literal_arg(None)
    if text in ("True", "False"):
        return literal_arg(text == "True")
    if text[:1] in "\"'":
        return literal_arg(_unquote(text))
    if text.startswith("["):
        return ListArg(items=tuple(_default(t, where) for t in _split_top(text[1:-1], where)))
    if re.fullmatch(r"-?\d+", text):
        return literal_arg(int(text))
    if text in _ENUM_DEFAULTS:
        return literal_arg(_ENUM_DEFAULTS[text])
    try:
        return literal_arg(float(text))
    except ValueError:
        raise OpSchemaError(f"schema {where!r}: cannot read the default {text!r}") from None


def _parse_argument(text: str, kwarg_only: bool, where: str) -> ArgSchema:
    decl, eq, default_text = text.partition("=")
    type_text, _, name = decl.strip().rpartition(" ")
    if not type_text or not name:
        raise OpSchemaError(f"schema {where!r}: cannot read the argument {text!r}")
    t = _parse_type(type_text.strip(), where)
    default = _default(default_text.strip(), where) if eq else None
    if t.size is not None and default is not None and not isinstance(default, (ListArg, NoneArg)):
        default = ListArg(items=(default,) * t.size)  # `int[2] padding=0` means [0, 0], as torch reports it
    return ArgSchema(
        name=name, kind=t.kind, optional=t.optional, kwarg_only=kwarg_only,
        is_out=kwarg_only and t.writes, default=default, has_default=bool(eq),
        alias=t.alias, writes=t.writes,
    )


def _parse_return(text: str, where: str) -> ReturnSchema:
    head, _, name = text.rpartition(" ")
    type_text = head if head and re.fullmatch(r"\w+", name) else text
    t = _parse_type(type_text.strip(), where)
    return ReturnSchema(alias=t.alias, writes=t.writes)


_HEAD = re.compile(r"(?P<name>[A-Za-z_]\w*::[A-Za-z_]\w*)(?:\.(?P<overload>\w+))?\(")


def parse_schema(text: str) -> OpSchema:
    """The `OpSchema` of one schema string as torch prints it; `OpSchemaError` if it cannot be read."""
    head = _HEAD.match(text)
    arrow = text.rfind(") -> ")
    if head is None or arrow < head.end() - 1:
        raise OpSchemaError(
            f"schema {text!r} is not of the form 'namespace::name.overload(args) -> returns'"
        )
    args: list[ArgSchema] = []
    kwarg_only = False
    for part in _split_top(text[head.end():arrow], text):
        if part == "*":
            kwarg_only = True
        elif part != "...":
            args.append(_parse_argument(part, kwarg_only, text))
    ret_text = text[arrow + len(") -> "):].strip()
    if ret_text.startswith("(") and ret_text.endswith(")"):
        returns = tuple(_parse_return(r, text) for r in _split_top(ret_text[1:-1], text) if r != "...")
    else:
        returns = (_parse_return(ret_text, text),)
    return OpSchema(
        name=head["name"], overload=head["overload"] or "", arguments=tuple(args), returns=returns, text=text,
    )
