"""The expression reader of `texir.ir.parser`: a cursor over one line of IR text that reads
arguments, value metadata and Python literals, failing with a `ParseError` at its line:column."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Final, Literal, NoReturn, TypeVar

from texir.errors import ParseError
from texir.ir.printer import SHORT_DTYPES, contiguous_strides
from texir.ir.types import (
    Argument, BoolArg, CustomObjMeta, DelegateMeta, DeviceArg, Dim, DType, DTypeArg, FloatArg, IntArg, Layout,
    LayoutArg, ListArg, MemoryFormat, MemoryFormatArg, NoneArg, NoneMeta, Ref, ScalarMeta, StrArg, SubgraphMeta,
    SymBoolMeta, SymExprArg, SymFloatMeta, SymIntMeta, TensorMeta, TokenMeta, TupleArg, TupleMeta, ValueMeta,
)

__all__ = ["Cursor", "HEX", "INT", "MAX_INT_DIGITS", "MAX_NESTING", "MAX_RANK", "NAME", "WORD"]

T = TypeVar("T")

NAME = re.compile(r"[^\s,()\[\]{}:=<>%']+")
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
INT = re.compile(r"-?\d+")
_NUMBER = re.compile(r"-?(?:\d+\.\d*(?:e[+-]?\d+)?|\d+e[+-]?\d+|\d+)|-?inf|nan")
HEX = re.compile(r"[0-9a-f]*")
_TORCH_ENUMS: dict[str, Argument] = {
    **{d.value: DTypeArg(value=d) for d in DType},
    **{m.value: LayoutArg(value=m) for m in Layout},
    **{m.value: MemoryFormatArg(value=m) for m in MemoryFormat},
}
_LAYOUTS = tuple(m.value for m in Layout)
_NONE = NoneArg()
_CLOSE = {"(": ")", "[": "]", "{": "}", "<": ">"}
_PLAIN = {q: re.compile(rf"[^{q}\\]*") for q in "'\""}
"""A run of a quoted string up to its closing quote or a backslash."""
_ESCAPE = re.compile(r"\\(?:x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[\\'\"nrt])")
_ESCAPED = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "r": "\r", "t": "\t"}

MAX_NESTING: Final = 64
"""Brackets nested deeper than this on one line are refused (the printer nests a handful)."""
MAX_RANK: Final = 64
"""Tensors of more dimensions are refused: implied strides grow with the square of the rank (ExecuTorch
allows 16)."""
MAX_INT_DIGITS: Final = 640
"""Longer integers are refused before `int()`, whose cost grows with the square of the digits: 640 is
the least limit Python lets an interpreter set on int/str conversion (sys.int_info), so what parses
does not depend on the setting."""


class Cursor:
    """Reads expressions off one line; errors carry the line and column."""

    def __init__(self, text: str, line: int, column: int) -> None:
        self.text, self.pos, self.line, self.column = text, 0, line, column
        self.depth = 0
        """Brackets open around the cursor (`items`), at most `MAX_NESTING`."""

    def fail(self, expected: str) -> NoReturn:
        rest = self.text[self.pos:self.pos + 20] or "end of line"
        raise ParseError(f"expected {expected}, found {rest!r}", line=self.line,
                         column=self.column + self.pos, expected=expected)

    def at(self, prefix: str) -> bool:
        return self.text.startswith(prefix, self.pos)

    def eat(self, prefix: str) -> bool:
        if self.at(prefix):
            self.pos += len(prefix)
            return True
        return False

    def expect(self, prefix: str) -> None:
        if not self.eat(prefix):
            self.fail(repr(prefix))

    def match(self, pattern: re.Pattern[str], expected: str) -> str:
        m = pattern.match(self.text, self.pos)
        if m is None or not m.group():
            self.fail(expected)
        self.pos = m.end()
        return m.group()

    def end(self) -> None:
        if self.pos != len(self.text):
            self.fail("end of line")

    def balanced(self, stop: str) -> str:
        """Raw text up to (not including) `stop` outside brackets: a symbolic expression."""
        depth, start = 0, self.pos
        while self.pos < len(self.text):
            ch = self.text[self.pos]
            if depth == 0 and self.text.startswith(stop, self.pos):
                return self.text[start:self.pos]
            depth += (ch in "([") - (ch in ")]")
            self.pos += 1
        self.fail(repr(stop))

    def rest(self) -> str:
        text, self.pos = self.text[self.pos:], len(self.text)
        return text

    # -- Python literals (strings, ints, None, bools, lists and tuples of them) ---------------
    def string(self) -> str:
        """A quoted string as `repr` spells it: printable characters, the other quote, and the
        escapes repr writes (\\\\, \\', \\", \\n, \\r, \\t, \\xNN, \\uNNNN, \\UNNNNNNNN)."""
        if not (self.at("'") or self.at('"')):
            self.fail("a quoted string")
        quote = self.text[self.pos]
        self.pos += 1
        parts: list[str] = []
        while True:
            run = _PLAIN[quote].match(self.text, self.pos).group()  # type: ignore[union-attr]  # matches the empty run
            if not run.isprintable():
                self.pos += next(i for i, ch in enumerate(run) if not ch.isprintable())
                self.fail("a printable character or an escape (\\xNN) in a quoted string")
            if run:
                parts.append(run)
                self.pos += len(run)
            if self.pos >= len(self.text):
                self.fail(f"closing {quote}")
            if self.eat(quote):
                return "".join(parts)
            escape = _ESCAPE.match(self.text, self.pos)
            if escape is None:
                self.fail("a string escape (\\\\, \\', \\\", \\n, \\r, \\t, \\xNN, \\uNNNN or \\UNNNNNNNN)")
            code = escape.group()[1:]
            if code in _ESCAPED:
                parts.append(_ESCAPED[code])
            else:
                if int(code[1:], 16) > 0x10FFFF:
                    self.fail("a code point up to \\U0010ffff")
                parts.append(chr(int(code[1:], 16)))
            self.pos = escape.end()

    def literal(self) -> object:
        if self.at("'") or self.at('"'):
            return self.string()
        for word, value in (("None", None), ("True", True), ("False", False)):
            if self.eat(word):
                return value
        if self.at("[") or self.at("("):
            close = _CLOSE[self.text[self.pos]]
            items = self.items(close, self.literal)
            return items if close == "]" else tuple(items)
        return self.number()

    def literal_of(self, expected: str, fits: Callable[[object], bool]) -> object:
        """A literal for which `fits` holds (else an error at its first character)."""
        start = self.pos
        value = self.literal()
        if not fits(value):
            self.pos = start
            self.fail(expected)
        return value

    def number(self) -> int | float | str:
        start = self.pos
        text = self.match(_NUMBER, "a number")
        if text in ("inf", "-inf", "nan"):
            return text
        if INT.fullmatch(text):
            return self.to_int(text, start)
        value = float(text)
        # Beyond float range the literal is infinite, which the IR spells as a string (FloatValue).
        return value if math.isfinite(value) else "inf" if value > 0 else "-inf"

    def to_int(self, text: str, start: int) -> int:
        """`text` (digits read from `start`) as an int, refused beyond `MAX_INT_DIGITS` digits."""
        if len(text.lstrip("-")) > MAX_INT_DIGITS:
            self.pos = start
            self.fail(f"an integer of at most {MAX_INT_DIGITS} digits")
        return int(text)

    def items(self, close: str, item: Callable[[], T]) -> list[T]:
        """A bracketed, comma-separated sequence (the cursor is at its opening bracket)."""
        if self.depth >= MAX_NESTING:
            self.fail(f"at most {MAX_NESTING} nested brackets")
        self.depth += 1
        self.pos += 1
        out: list[T] = []
        while not self.eat(close):
            out.append(item())
            if not self.eat(", ") and not self.eat(","):
                self.expect(close)
                break
        self.depth -= 1
        return out

    def integer(self) -> int:
        start = self.pos
        return self.to_int(self.match(INT, "an integer"), start)

    def count(self, what: str) -> int:
        """A non-negative integer (a size, an alignment)."""
        start = self.pos
        value = self.integer()
        if value < 0:
            self.pos = start
            self.fail(what)
        return value

    # -- IR pieces ------------------------------------------------------------------------------
    def arg(self) -> Argument:
        if self.eat("%"):
            return Ref(name=self.match(NAME, "a node name"))
        if self.at("[") or self.at("("):
            close = _CLOSE[self.text[self.pos]]
            items = tuple(self.items(close, self.arg))
            return ListArg(items=items) if close == "]" else TupleArg(items=items)
        if self.eat("torch."):
            word = self.match(NAME, "a dtype, layout or memory format")
            if word not in _TORCH_ENUMS:
                self.pos -= len(word)
                self.fail("a dtype, layout or memory format")
            return _TORCH_ENUMS[word]
        if self.eat("device("):
            value = self.string()
            self.expect(")")
            return DeviceArg(value=value)
        if self.eat("sym"):
            kinds: dict[str, Literal["int", "float", "bool"]] = {"(": "int", "<float>(": "float", "<bool>(": "bool"}
            kind = next((kinds[k] for k in kinds if self.eat(k)), None)
            if kind is None:
                self.fail("'(', '<float>(' or '<bool>('")
            expr = self.balanced(")")
            self.pos += 1
            return SymExprArg(expr=expr, type=kind)
        if self.at("'") or self.at('"'):
            return StrArg(value=self.string())
        for word, arg in (("None", _NONE), ("True", BoolArg(value=True)), ("False", BoolArg(value=False))):
            if self.eat(word):
                return arg
        if not _NUMBER.match(self.text, self.pos):
            self.fail("an argument (%name, literal, [..], (..), torch.X, device(..), sym(..))")
        number = self.number()
        return IntArg(value=number) if isinstance(number, int) else FloatArg(value=number)  # type: ignore[arg-type]  # a float or "inf", "-inf", "nan"

    def dim(self, stop: str) -> Dim:
        start = self.pos
        text = self.balanced(stop)
        if not text:
            self.fail("a dimension")
        return self.to_int(text, start) if INT.fullmatch(text) else text

    def dims(self, close: str) -> tuple[Dim, ...]:
        self.pos += 1
        out: list[Dim] = []
        while not self.eat(close):
            if len(out) == MAX_RANK:
                self.fail(f"at most {MAX_RANK} dimensions")
            out.append(self.dim(", ") if self._more(close) else self.dim(close))
            if not self.eat(", "):
                self.expect(close)
                break
        return tuple(out)

    def _more(self, close: str) -> bool:
        """Whether another top-level ", " comes before `close` (dimension lists)."""
        depth = 0
        for i in range(self.pos, len(self.text)):
            ch = self.text[i]
            if depth == 0 and self.text.startswith(", ", i):
                return True
            if depth == 0 and ch == close:
                return False
            depth += (ch in "([") - (ch in ")]")
        return False

    def meta(self) -> ValueMeta | None:
        if self.eat("?"):
            return None
        if self.at("(") or self.at("["):
            close = _CLOSE[self.text[self.pos]]
            items = tuple(self.items(close, self.meta))
            if any(m is None for m in items):
                self.fail("value metadata (not '?') in a tuple")
            return TupleMeta(items=items, is_list=close == "]")  # type: ignore[arg-type]  # None excluded
        word = self.match(WORD, "value metadata")
        if word == "None":
            return NoneMeta()
        if word == "token":
            return TokenMeta()
        if word in ("SymInt", "SymFloat", "SymBool", "scalar"):
            self.expect("(")
            if word == "scalar":
                value = self.literal_of("a bool, int, float, string or None", _is_scalar)
                self.expect(")")
                return ScalarMeta(value=value)  # type: ignore[arg-type]  # checked by _is_scalar
            start = self.pos
            expr = self.balanced(")")
            self.pos += 1
            if word == "SymInt":
                return SymIntMeta(expr=self.to_int(expr, start) if INT.fullmatch(expr) else expr)
            return SymFloatMeta(expr=expr) if word == "SymFloat" else SymBoolMeta(expr=expr)
        if word in ("obj", "graph", "delegate"):
            self.expect("<")
            name = self.balanced(">")
            self.pos += 1
            if word == "obj":
                return CustomObjMeta(class_fqn=name)
            return SubgraphMeta(graph=name) if word == "graph" else DelegateMeta(module=name)
        dtype = SHORT_DTYPES.get(word) or next((d for d in DType if d.value == word), None)
        if dtype is None or not self.at("["):
            self.pos -= len(word)
            self.fail("value metadata (a dtype and shape, SymInt(..), (..), None, ...)")
        shape = self.dims("]")
        fields: dict[str, object] = {}
        if self.at("{"):
            self.pos += 1
            while True:
                key = self.match(WORD, "strides, offset, layout, device or grad")
                if key == "grad":
                    fields["requires_grad"] = True
                elif key == "strides":
                    self.expect("=")
                    if not self.at("("):
                        self.fail("'('")
                    fields["strides"] = self.dims(")")
                elif key == "offset":
                    self.expect("=")
                    fields["storage_offset"] = self.dim(", " if self._more("}") else "}")
                elif key in ("layout", "device"):
                    self.expect("=")
                    start = self.pos
                    value = self.balanced(", " if self._more("}") else "}")
                    if key == "layout" and value not in _LAYOUTS:
                        self.pos = start
                        self.fail("a layout (" + ", ".join(_LAYOUTS) + ")")
                    fields[key] = Layout(value) if key == "layout" else value
                else:
                    self.pos -= len(key)
                    self.fail("strides, offset, layout, device or grad")
                if not self.eat(", "):
                    self.expect("}")
                    break
        strides = fields.pop("strides", None) or contiguous_strides(shape)
        return TensorMeta(dtype=dtype, shape=shape, strides=strides, **fields)  # type: ignore[arg-type]  # parsed above

    def keyed(self, key: str) -> None:
        self.expect(f"{key}=")


def _is_scalar(value: object) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))
