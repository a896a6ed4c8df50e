"""`parse_program` on hostile text: every reproducer of issue #38's fuzz findings (tests/data/parser)
gets a `ParseError` naming line, column and what was expected; hypothesis mutates real program texts
(brackets, quotes, escapes, long numbers, provenance values, lines dropped, doubled, re-indented) and
only `ParseError` may come out, while whatever parses prints and parses back to itself; nesting is
bounded; inputs of a few MB parse in memory linear in their size."""

from __future__ import annotations

import ast
import functools
import os
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from texir.errors import ParseError
from texir.ir import FloatArg, Program, format_program
from texir.ir.parse_expr import MAX_INT_DIGITS, MAX_NESTING, MAX_RANK
from texir.ir.parser import MAX_GRAPH_NESTING, parse_program
from texir.testing.programs import chain_program

DATA = Path(__file__).parent / "data" / "parser"
GOLDEN = Path(__file__).parent / "golden"


def _stand_in(sha: str, nbytes: int) -> bytes:
    """The one stand-in for every delegate blob the text names only by hash (never `nbytes` long:
    the text may lie); the same bytes each time, so a reprinted program parses back equal."""
    return b"<blob>"


def _parse(text: str) -> Program:
    return parse_program(text, missing_blob=_stand_in)


# -- the reproducers ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Reproducer:
    line: int
    expected: str
    """What the error says was expected."""
    fault: str
    repair: str
    """The text that makes the file wrong, and what mends it (then it parses: the error is the fault's)."""


REPRODUCERS: dict[str, Reproducer] = {
    # issue #38 item 8 first, then what this file's fuzz test found next to them (each a raw exception
    # or a wrongly typed IR on c05e825)
    "nested_brackets.txt": Reproducer(  # RecursionError
        11, f"at most {MAX_NESTING} nested brackets", "[" * 500 + "]" * 500, "[" * MAX_NESTING + "]" * MAX_NESTING),
    "nul_in_string.txt": Reproducer(  # SyntaxError from ast.literal_eval
        11, "a printable character or an escape", "\x00", "\\x00"),
    "escape_named_unicode.txt": Reproducer(11, "a string escape", "\\N", "\\\\N"),  # the same
    "nn_module_stack_string.txt": Reproducer(  # ValueError: not enough values to unpack
        14, "a list of (key, path, type) string triples", "='L'", "=[('L', '', 'M')]"),
    "nn_module_stack_int.txt": Reproducer(  # TypeError: 'int' object is not iterable
        14, "a list of (key, path, type) string triples", "nn_module_stack=0", "nn_module_stack=[]"),
    "source_fn_stack_string.txt": Reproducer(14, "a list of (name, target) string pairs", "='L'", "=[('add', 'L')]"),
    "source_fn_stack_int.txt": Reproducer(
        14, "a list of (name, target) string pairs", "source_fn_stack=0", "source_fn_stack=[]"),
    "long_dim.txt": Reproducer(  # ValueError: Exceeds the limit (4300 digits), in dim
        9, f"an integer of at most {MAX_INT_DIGITS} digits", "3" * 5000, "3" * MAX_INT_DIGITS),
    "long_number.txt": Reproducer(  # the same, in number
        11, f"an integer of at most {MAX_INT_DIGITS} digits", "7" * 5000, "7" * MAX_INT_DIGITS),
    "named_data_scale_key_as_sha256.txt": Reproducer(  # native XNNPACK's scale key in the digest field
        22, "a hex digest", "sha256=scale_", "sha256="),
    "layout_unknown.txt": Reproducer(9, "a layout", "spiral", "sparse_coo"),  # ValueError from the enum
    "scalar_list.txt": Reproducer(  # TypeError: unhashable type: 'list'
        11, "a bool, int, float, string or None", "[1, 2]", "-2.5"),
    "compile_spec_odd_hex.txt": Reproducer(  # ValueError from bytes.fromhex
        15, "an even number of hex digits", "level=1", "level=01"),
    "location_custom_int.txt": Reproducer(  # parsed as an int where the IR holds JSON text
        14, "a quoted string", "custom=0", "custom='0'"),
    "debug_handles_strings.txt": Reproducer(16, "a list of debug handles", "['2']", "[2]"),  # parsed as strings
}


def test_every_reproducer_is_listed() -> None:
    assert {p.name for p in DATA.glob("*.txt")} == {*REPRODUCERS, "float_overflow.txt"}


@pytest.mark.parametrize("name", sorted(REPRODUCERS))
def test_reproducer_is_a_parse_error_at_its_line(name: str) -> None:
    case = REPRODUCERS[name]
    text = (DATA / name).read_bytes().decode("utf-8")
    with pytest.raises(ParseError) as info:
        _parse(text)
    error = info.value
    assert error.line == case.line and case.expected in error.expected, str(error)
    assert str(error).startswith(f"line {case.line}, column {error.column}: expected {error.expected}")
    assert 1 <= error.column <= len(text.splitlines()[case.line - 1]) + 1
    # mended, the file parses (so the error is the fault's) and prints back to itself
    assert case.fault in text
    program = _parse(text.replace(case.fault, case.repair))
    assert _parse(format_program(program)) == program


def test_a_float_beyond_range_parses_as_the_irs_inf() -> None:
    """A float literal too large for a double is infinite: the IR spells that "inf" (FloatValue), so
    the program prints and parses back to itself (a float('inf') printed as 'inf' came back as "inf")."""
    program = _parse((DATA / "float_overflow.txt").read_text())
    relu = next(n for n in program.graph.nodes if n.name == "relu_0")
    assert relu.args[1] == FloatArg(value="inf")  # type: ignore[attr-defined]  # a CallFunction
    assert _parse(format_program(program)) == program


def test_strings_read_as_repr_writes_them() -> None:
    """Every character a string may hold, as `repr` escapes it, reads back exactly."""
    value = "".join(chr(c) for c in (*range(0, 0x300), 0x2028, 0xD800, 0xFFFF, 0x1F600, 0x10FFFF)) + "'\"\\"
    for quoted in (repr(value), repr(value.replace("'", "")), repr(value.replace('"', ""))):
        text = format_program(chain_program()).replace("aten::relu.default(%add)", f"aten::relu.default(%add, {quoted})")
        relu = next(n for n in _parse(text).graph.nodes if n.name == "relu_0")
        assert relu.args[1].value == ast.literal_eval(quoted)  # type: ignore[attr-defined]  # a StrArg
    bad = format_program(chain_program()).replace("aten::relu.default(%add)", "aten::relu.default(%add, '\\U00110000')")
    with pytest.raises(ParseError, match=r"a code point up to"):
        _parse(bad)


def _nested_graphs(depth: int, lowered: bool) -> str:
    """A program holding `depth` levels of subgraphs (or of lowered modules) one in another."""
    lines = ["program dialect=ATEN", "  inputs:", "  outputs:", "graph():", "  return ()"]
    for level in range(1, depth + 1):
        if lowered:
            pad = " " * (4 * level)
            lines += [f"{pad[4:]}lowered_module m{level}:", f"{pad}backend=B processed=6B sha256={'0' * 64}",
                      f"{pad}program dialect=ATEN", f"{pad}  inputs:", f"{pad}  outputs:", f"{pad}graph():",
                      f"{pad}  return ()"]
        else:
            pad = "  " * level
            lines += [f"{pad}subgraph g{level}():", f"{pad}  return ()"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("lowered", [False, True], ids=["subgraphs", "lowered_modules"])
def test_graph_nesting_is_bounded(lowered: bool) -> None:
    ok = _parse(_nested_graphs(MAX_GRAPH_NESTING, lowered))
    assert _parse(format_program(ok)) == ok
    # 1000 subgraphs or 400 lowered modules in one another were a RecursionError
    for depth in (MAX_GRAPH_NESTING + 1, 400 if lowered else 1000):
        with pytest.raises(ParseError, match=rf"nested deeper than {MAX_GRAPH_NESTING} levels") as info:
            _parse(_nested_graphs(depth, lowered))
        assert info.value.expected == f"at most {MAX_GRAPH_NESTING} nested graphs"


# -- large inputs: memory linear in the size ---------------------------------------------------------


def _large_inputs() -> dict[str, str]:
    base = format_program(chain_program())
    call = "aten::relu.default(%add)"
    n = 20_000

    def arg(text: str) -> str:
        return base.replace(call, f"aten::relu.default(%add, {text})")

    nested = "[" * (MAX_NESTING - 1) + "]" * (MAX_NESTING - 1)  # inside the list below: at the limit
    return {
        "long int list": arg("[" + ", ".join(["12345"] * n) + "]"),
        "nested lists at the limit": arg("[" + ", ".join([nested] * (n // 64)) + "]"),
        "string of escapes": arg("'" + "\\x00\\u2028\\n" * n + "'"),
        "long symbolic dim": base.replace("%x : f32[2, 3]", "%x : f32[2, " + "(s0)+" * n + "1]"),
        # (dims above MAX_RANK are refused: the strides implied by 20,000 dims of 2 took 170 MB)
        "many dims": base.replace("%x : f32[2, 3]", "%x : f32[" + ", ".join(["2"] * n) + "]"),
        "many symbolic dims at the limit": base.replace("%x : f32[2, 3]", "%x : f32[" + ", ".join(
            ["(s0)+" * (n // MAX_RANK) + "s1"] * MAX_RANK) + "]"),
        "unclosed dims": base.replace("%x : f32[2, 3]", "%x : f32[" + "(, " * n),
        "many nodes": base.replace("  return (%relu_0,)\n", "".join(
            f"  %n{i} : f32[2, 3] = aten::relu.default(%add)  # dh={i}\n" for i in range(n // 10)) + "  return (%relu_0,)\n"),
        "unclosed string": arg("'" + "\\'" * n),
        "long digits": arg("1" * n + ".5"),
    }


@pytest.mark.parametrize("name", sorted(_large_inputs()))
def test_large_inputs_parse_in_memory_linear_in_their_size(name: str) -> None:
    """Megabyte lines of each construct: parsed or refused with a ParseError, peak memory a bounded
    multiple of the text (a quadratic step would not finish)."""
    text = _large_inputs()[name]
    tracemalloc.start()
    try:
        try:
            _parse(text)
        except ParseError:
            pass
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * len(text) + (4 << 20), f"{name}: {peak} bytes for {len(text)} characters"


# -- hypothesis -------------------------------------------------------------------------------------


@functools.cache
def _seeds() -> tuple[str, ...]:
    """Texts holding every construct of the grammar: a kitchen sink (every input/output kind, value
    metadata and argument form, a cond subgraph, a lowered module with compile specs, debug map and
    named data, backend notes, op schemas), zoo models with cond and symbolic shapes, a lowering."""
    texts = [
        (GOLDEN.parent / "data" / "parser_fuzz_seed.txt").read_text(),
        (GOLDEN / "ir" / "cond_closure_nested.txt").read_text(),
        (GOLDEN / "ir" / "dynamic_seq.txt").read_text(),
        (GOLDEN / "edge" / "compact_debug_handles" / "before.txt").read_text(),
        (GOLDEN / "lowering" / "dynamic.txt").read_text().split("# after\n")[1],
    ]
    for text in texts:
        _parse(text)  # each seed is valid
    return tuple(texts)


_TOKENS = (
    "[", "]", "(", ")", "{", "}", "<", ">", "'", '"', "\\", "%", ":", "=", ",", ", ", " ", "\n", "\x00", "\t",
    "\u2028", "é", "#", "\\N", "\\x", "\\U0011ffff", "\\u12", "-", ".", "e", "e+", "inf", "nan", "None", "True",
    "0", "-1", "9" * 21, "9" * 5000, "1e999", "sym(", "sym<float>(", "torch.", "torch.float32", "device(",
    "SymInt(", "scalar(", "obj<", "graph<", "delegate<", "{strides=(", "offset=", "layout=", "device=", "grad",
    "nn_module_stack=", "source_fn_stack=", "custom=", "torch_fn_type=", "'L'", "[('a',)]", "[('a', 'b', 'c')]",
    "loc 0:", "dh=", "fn=", "ancestor=", "subgraph g():", "lowered_module m:", "program dialect=X", "graph():",
    "return (", "  ", "    ", " = ", " : ", "  # dh=", "sha256=", "nbytes=", "processed=", "B", "alignment=",
    "debug ", "debug (empty)", "named_data ", "compile_spec ", "hint=", "inf]", "state:", "provenance:",
    "range_constraints:", "module_call_graph:", "backend_meta:", "op_schemas:", " (no data)", " (non-persistent)",
    "placeholder", "get_attr ", "user_input", "parameter ", "buffer ", "forward_arg_names=", "inputs=", "-> ",
)
_EXAMPLES = int(os.environ.get("TEXIR_FUZZ_EXAMPLES", "150"))
"""Examples per test: 150 in `make test` (derandomized: the same inputs every run), `make fuzz` sets
TEXIR_FUZZ_EXAMPLES (random inputs each run)."""
_SETTINGS = settings(max_examples=_EXAMPLES, deadline=None, derandomize="TEXIR_FUZZ_EXAMPLES" not in os.environ,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _check(text: str) -> None:
    """Only a ParseError (with a position and what was expected) or a program that prints and parses
    back to itself."""
    try:
        program = _parse(text)
    except ParseError as error:
        assert error.line >= 1 and error.column >= 1 and error.expected
        return
    assert _parse(format_program(program)) == program


@_SETTINGS
@given(seed=st.integers(0, 4), data=st.data())
def test_inserted_tokens(seed: int, data: st.DataObject) -> None:
    text = _seeds()[seed]
    edits = data.draw(st.lists(st.tuples(st.integers(0, len(text)), st.sampled_from(_TOKENS),
                                         st.sampled_from((1, 1, 1, 2, 3, 80, 700))), min_size=1, max_size=6))
    for pos, token, times in edits:
        pos = min(pos, len(text))
        text = text[:pos] + token * times + text[pos:]
    _check(text)


@_SETTINGS
@given(seed=st.integers(0, 4), data=st.data())
def test_replaced_and_deleted_characters(seed: int, data: st.DataObject) -> None:
    text = _seeds()[seed]
    edits = data.draw(st.lists(st.tuples(st.integers(0, len(text) - 1), st.integers(0, 24),
                                         st.characters(codec="utf-8")), min_size=1, max_size=8))
    for pos, cut, char in edits:
        pos = min(pos, len(text))
        text = text[:pos] + (char if cut % 3 == 0 else "") + text[pos + cut // 3 + 1:]
    _check(text)


@_SETTINGS
@given(seed=st.integers(0, 4), data=st.data())
def test_line_edits(seed: int, data: st.DataObject) -> None:
    """Lines dropped, doubled, swapped and re-indented: sections and nesting out of place."""
    lines = _seeds()[seed].split("\n")
    n = len(lines)
    edits = data.draw(st.lists(st.tuples(st.sampled_from(("drop", "double", "swap", "indent")),
                                         st.integers(0, n - 1), st.integers(0, n - 1), st.integers(0, 6)),
                               min_size=1, max_size=6))
    for op, a, b, indent in edits:
        a, b = a % len(lines), b % len(lines)
        if op == "drop" and len(lines) > 1:
            del lines[a]
        elif op == "double":
            lines.insert(b, lines[a])
        elif op == "swap":
            lines[a], lines[b] = lines[b], lines[a]
        else:
            lines[a] = " " * indent + lines[a].lstrip(" ")
    _check("\n".join(lines))


@_SETTINGS
@given(head=st.sampled_from(("", "program dialect=ATEN\n  inputs:\n", "program dialect=ATEN\n  inputs:\n  outputs:\ngraph():\n  ")),
       body=st.text(max_size=300))
def test_arbitrary_text(head: str, body: str) -> None:
    _check(head + body)
