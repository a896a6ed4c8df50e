"""The IR text round trip the tests assert on every program they lower: the printed text of a
program parses back to its canonical form (`texir.ir.parse_program` inverts `format_program`)."""

from __future__ import annotations

from texir.ir import Program, canonicalize, format_program
from texir.ir.parser import parse_program, payloads_of

__all__ = ["assert_text_round_trip"]


def assert_text_round_trip(program: Program, what: str) -> None:
    """``parse_program(format_program(p)) == canonicalize(p)``, payloads given by hash, for `p`
    canonical and as it is (names kept: its text parses back to it up to canonical names)."""
    canonical = canonicalize(program)
    payloads = payloads_of(program)
    assert parse_program(format_program(canonical), payloads=payloads) == canonical, what
    assert canonicalize(parse_program(format_program(program), payloads=payloads)) == canonical, what
