"""`Program.dialect` is a `texir.ir.Dialect`: every reader refuses another string naming the field,
and 2.x snapshots (a free string on the same wire form) still load."""

from __future__ import annotations

import msgspec
import pytest

from tests.test_torch_free import PROGRAM  # a small ATen program as text
from texir.errors import ConversionError, IRError, ParseError, SnapshotError
from texir.ir import DIALECTS, Program, format_program, parse_program, verify
from texir.ir.types import SCHEMA_VERSION
from texir.serialize.snapshot import dumps, loads


def _program(dialect: str = "ATEN") -> Program:
    # (msgspec checks the Literal only on decode, so a test can build a Program with any string)
    return msgspec.structs.replace(parse_program(PROGRAM), dialect=dialect)


def test_the_dialects_are_the_stages_texir_knows() -> None:
    assert DIALECTS == ("ATEN", "TRAINING", "EDGE_PARTITIONABLE", "EDGE")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_dialect_survives_text_and_snapshot(dialect: str) -> None:
    program = _program(dialect)
    verify(program)
    assert parse_program(format_program(program)) == program
    assert loads(dumps(program)) == program
    assert loads(dumps(program, format="msgpack")) == program


def test_verify_refuses_an_unknown_dialect_naming_the_field() -> None:
    with pytest.raises(IRError, match=r"program\.dialect: unknown dialect 'EXIR'; texir's dialects are ATEN, TRAINING"):
        verify(_program("EXIR"))


def test_the_parser_refuses_an_unknown_dialect() -> None:
    text = format_program(_program()).replace("program dialect=ATEN", "program dialect=edge", 1)
    with pytest.raises(ParseError, match=r"expected a program dialect \(ATEN, TRAINING, EDGE_PARTITIONABLE, EDGE\), found 'edge'") as info:
        parse_program(text)
    assert info.value.line == 1 and info.value.column == len("program dialect=") + 1


def test_a_2x_snapshot_loads_and_an_unknown_dialect_is_refused() -> None:
    assert SCHEMA_VERSION == (3, 0)
    current = b'"schema_version":[3,0]'
    data = dumps(_program("EDGE"))
    assert current in data
    old = data.replace(current, b'"schema_version":[2,3]', 1)
    assert loads(old) == _program("EDGE")  # 2.x: same wire form, read by the 3.0 decoder
    assert loads(data.replace(current, b'"schema_version":[2,0]', 1)) == _program("EDGE")
    for version in (b"[2,3]", b"[3,0]"):
        bad = data.replace(current, b'"schema_version":' + version, 1).replace(b'"dialect":"EDGE"', b'"dialect":"EXIR"', 1)
        with pytest.raises(SnapshotError, match=r"Invalid enum value 'EXIR' - at `\$\.program\.dialect` \(texir's dialects are ATEN"):
            loads(bad)
    packed = msgspec.msgpack.decode(dumps(_program(), format="msgpack"))
    packed["schema_version"] = [2, 1]
    packed["program"]["dialect"] = "SOMETHING"
    with pytest.raises(SnapshotError, match=r"\$\.program\.dialect"):
        loads(msgspec.msgpack.encode(packed))


def test_the_torch_import_refuses_an_unknown_dialect() -> None:
    from texir.adapters.fx_import import _dialect  # torch imported here only (this file's other tests need none)

    assert _dialect("TRAINING") == "TRAINING"
    with pytest.raises(ConversionError, match=r"ExportedProgram\.dialect: unknown dialect 'CUSTOM'"):
        _dialect("CUSTOM")
