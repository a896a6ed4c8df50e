"""`texir.ir.parse_program`: the exact inverse of `format_program` on canonical programs (random
programs and every zoo model), payloads by hash, and typed errors with line:column."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from tests.ir_strategies import programs
from tests.text_round_trip import assert_text_round_trip
from tests.zoo import ZOO
from texir.errors import ParseError, TexirError
from texir.ir import Program, canonicalize, format_program
from texir.ir.parser import parse_program, payloads_of
from texir.testing.programs import chain_program, delegated_program


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs())
def test_parse_inverts_format_on_random_programs(program: Program) -> None:
    canonical = canonicalize(program)
    text = format_program(canonical)
    blobs = payloads_of(program)
    assert parse_program(text, payloads=blobs) == canonical
    assert format_program(parse_program(text, payloads=blobs)) == text
    # The text of a non-canonical program parses back to it up to names.
    assert canonicalize(parse_program(format_program(program), payloads=blobs)) == canonical


@pytest.fixture(scope="session")
def zoo_programs() -> dict[str, Program]:
    """Every zoo model's program, exported once per session."""
    pytest.importorskip("torch")
    from tests.zoo import ZOO, cached_export
    from texir.adapters import from_exported_program

    return {m.name: from_exported_program(cached_export(m.name)) for m in ZOO}


def test_parse_inverts_format_on_every_zoo_model(zoo_programs: dict[str, Program]) -> None:
    assert len(zoo_programs) >= 30
    for name, program in zoo_programs.items():
        canonical = canonicalize(program)
        text = format_program(canonical)
        assert parse_program(text, payloads=payloads_of(program)) == canonical, name
        # Without payloads the tensors come back by hash only, as in a snapshot without data.
        bare = parse_program(text)
        assert [e.value.sha256 for e in bare.state] == [e.value.sha256 for e in canonical.state], name
        assert all(e.value.data is None for e in bare.state) and bare.graph == canonical.graph, name


@pytest.mark.parametrize("name", [m.name for m in ZOO])
def test_parse_inverts_format_on_every_zoo_model_lowered_without_partitioner(name: str) -> None:
    """The edge program `lower(ep, [])` gives (the natively delegated ones: tests/test_executorch_backends.py;
    the quantized ones: tests/test_xnnpack_native_quant.py, tests/test_xnnpack_native_8da4w.py)."""
    from tests.zoo import cached_export
    from texir.orchestrate import lower

    # (norms keeps var_mean, outside core ATen: texir refuses it unless told, as ExecuTorch's verifier does)
    assert_text_round_trip(lower(cached_export(name, decompose=False), [], allow_non_core=True).program, name)


def test_delegate_blobs_come_from_payloads() -> None:
    program = canonicalize(delegated_program())
    text = format_program(program)
    with pytest.raises(ParseError, match=r"delegate blob of 'lowered_module_0': no payload for sha256=[0-9a-f]{64}; pass payloads="):
        parse_program(text)
    stand_in = parse_program(text, missing_blob=lambda sha, n: b"?" * n)
    assert stand_in.lowered_modules[0].module.processed_bytes == b"?" * 9
    with pytest.raises(ParseError, match="has 3 bytes, the text says 9"):
        parse_program(text, payloads={k: b"abc" for k in payloads_of(program)})


BAD = [
    ("", 1, "'program dialect=...'"),
    ("program dialect=ATEN\n  inputs:\n    %x: sideways\n", 3, "user_input, parameter"),
    ("program dialect=ATEN\n  inputs:\n  outputs:\ngraph():\n  %x : f32[2, 3 = placeholder\n", 5, "']'"),
    ("program dialect=ATEN\n  inputs:\n  outputs:\ngraph():\n  %x : q99[2] = placeholder\n", 5, "value metadata"),
    ("program dialect=ATEN\n  inputs:\n  outputs:\ngraph():\n  %y : f32[] = aten::relu.default(%x  # dh=1\n", 5, "')'"),
    ("program dialect=ATEN\n  inputs:\n  outputs:\ngraph():\n  %y : f32[] = aten::add.Tensor(alpha=1, %x)\n", 5,
     "a keyword argument"),
    ("program dialect=ATEN\n  inputs:\n  outputs:\ngraph():\n  %y : ? = placeholder\n", 6, "a node line or 'return (...)'"),
    ("program dialect=ATEN\n  inputs:\n  outputs:\ngraph():\n  return ()\nstray\n", 6, "a program section"),
    ("program dialect=ATEN\n  inputs:\n  outputs:\ngraph():\n  return ()\nstate:\n  w : f32[2] sha256=zz\n", 7,
     "a hex digest"),
]


@pytest.mark.parametrize(("text", "line", "expected"), BAD)
def test_parse_errors_name_line_column_and_what_was_expected(text: str, line: int, expected: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_program(text)
    error = info.value
    assert isinstance(error, TexirError)
    assert error.line == line and error.column >= 1 and expected in error.expected
    assert str(error).startswith(f"line {line}, column {error.column}: ")


def test_error_column_points_at_the_bad_token() -> None:
    text = format_program(chain_program()).replace("aten::relu.default(%add)", "aten::relu.default(%add, @)")
    with pytest.raises(ParseError) as info:
        parse_program(text)
    bad_line = text.splitlines()[info.value.line - 1]
    assert bad_line[info.value.column - 1] == "@"
