"""DelegateMappingBuilder: identifier rules, node/handle entries, errors, deterministic output."""

from __future__ import annotations

import subprocess
import sys

import pytest

from texir.errors import LoweringError
from texir.ir import CallFunction, DebugHandleEntry, Output, Placeholder, Provenance, Ref, build_graph
from texir.lowering.debug_mapping import (
    DelegateMappingBuilder,
    DelegateMappingError,
    MissingDebugHandleError,
)


def _call(name: str) -> CallFunction:
    return CallFunction(name=name, target="aten::sin.default", args=(Ref(name="x"),))


SIN = _call("sin")
COS = _call("cos")
NOHANDLE = _call("nohandle")
X = Placeholder(name="x")
OUTPUT = Output(args=(Ref(name="x"),))
# The graph the mapped nodes belong to: it holds their debug handles.
GRAPH = build_graph([
    (X, None, None),
    (SIN, None, Provenance(debug_handle=1)),
    (COS, None, Provenance(debug_handle=2)),
    (NOHANDLE, None, None),
    (OUTPUT, None, None),
])


def _builder(*, generated_identifiers: bool = False) -> DelegateMappingBuilder:
    return DelegateMappingBuilder(graph=GRAPH, generated_identifiers=generated_identifiers)


def test_generated_identifiers_count_from_zero_in_insertion_order() -> None:
    builder = _builder(generated_identifiers=True)
    assert builder.insert_delegate_mapping_entry(nodes=[COS, SIN]) == 0
    assert builder.insert_delegate_mapping_entry(nodes=SIN) == 1
    assert builder.insert_delegate_mapping_entry(handles=[7, None, 3]) == 2
    assert builder.insert_delegate_mapping_entry(handles=5) == 3
    assert builder.get_delegate_mapping() == (
        DebugHandleEntry(identifier=0, debug_handles=(1, 2)),
        DebugHandleEntry(identifier=1, debug_handles=(1,)),
        DebugHandleEntry(identifier=2, debug_handles=(3, 7)),
        DebugHandleEntry(identifier=3, debug_handles=(5,)),
    )
    assert len(builder) == 4


@pytest.mark.parametrize("identifiers", [(10, 3, 7), ("c", "a", "b")])
def test_explicit_identifiers_keep_insertion_order(identifiers: tuple[int | str, ...]) -> None:
    builder = _builder()
    for ident, handle in zip(identifiers, (4, 2, 9)):
        assert builder.insert_delegate_mapping_entry(handles=handle, identifier=ident) == ident
    assert [e.identifier for e in builder.get_delegate_mapping()] == list(identifiers)
    assert [e.debug_handles for e in builder.get_delegate_mapping()] == [(4,), (2,), (9,)]


def test_duplicate_handles_collapse_and_sort() -> None:
    builder = _builder(generated_identifiers=True)
    builder.insert_delegate_mapping_entry(nodes=[COS, SIN, COS])
    assert builder.get_delegate_mapping()[0].debug_handles == (1, 2)


def test_explicit_identifier_on_generated_builder_is_an_error() -> None:
    builder = _builder(generated_identifiers=True)
    with pytest.raises(DelegateMappingError, match="generated identifiers"):
        builder.insert_delegate_mapping_entry(nodes=SIN, identifier="1")
    with pytest.raises(DelegateMappingError, match="generated identifiers"):
        builder.insert_delegate_mapping_entry(handles=1, identifier=0)
    assert builder.get_delegate_mapping() == ()


def test_missing_identifier_on_explicit_builder_is_an_error() -> None:
    builder = _builder()
    with pytest.raises(DelegateMappingError, match="no identifier"):
        builder.insert_delegate_mapping_entry(nodes=SIN)


def test_duplicate_identifier_is_an_error() -> None:
    builder = _builder()
    builder.insert_delegate_mapping_entry(nodes=SIN, identifier="op")
    with pytest.raises(DelegateMappingError, match="'op' was already inserted"):
        builder.insert_delegate_mapping_entry(nodes=COS, identifier="op")
    # The first entry is untouched by the failed insert.
    assert builder.get_delegate_mapping() == (DebugHandleEntry(identifier="op", debug_handles=(1,)),)


@pytest.mark.parametrize("bad", [1.5, True, [1]])
def test_identifier_must_be_int_or_str(bad: object) -> None:
    builder = _builder()
    with pytest.raises(DelegateMappingError, match="int or a str"):
        builder.insert_delegate_mapping_entry(handles=1, identifier=bad)  # type: ignore[arg-type]  # testing a bad identifier


def test_exactly_one_of_nodes_and_handles() -> None:
    builder = _builder(generated_identifiers=True)
    with pytest.raises(DelegateMappingError, match="exactly one"):
        builder.insert_delegate_mapping_entry(nodes=SIN, handles=1)
    with pytest.raises(DelegateMappingError, match="exactly one"):
        builder.insert_delegate_mapping_entry()


def test_node_without_debug_handle_is_an_error_naming_it() -> None:
    builder = _builder(generated_identifiers=True)
    with pytest.raises(MissingDebugHandleError, match="'nohandle'"):
        builder.insert_delegate_mapping_entry(nodes=[SIN, NOHANDLE])
    with pytest.raises(MissingDebugHandleError, match="'x'"):
        builder.insert_delegate_mapping_entry(nodes=X)
    with pytest.raises(LoweringError, match="'output'"):
        builder.insert_delegate_mapping_entry(nodes=OUTPUT)
    # Failed entries consume no generated identifier.
    assert builder.insert_delegate_mapping_entry(nodes=SIN) == 0


def test_nodes_need_the_builders_graph() -> None:
    with pytest.raises(DelegateMappingError, match="'sin'.*without a graph"):
        DelegateMappingBuilder(generated_identifiers=True).insert_delegate_mapping_entry(nodes=SIN)
    with pytest.raises(DelegateMappingError, match="'elsewhere' is not a node of the builder's graph"):
        _builder(generated_identifiers=True).insert_delegate_mapping_entry(nodes=_call("elsewhere"))
    # Handles alone need no graph.
    assert DelegateMappingBuilder(generated_identifiers=True).insert_delegate_mapping_entry(handles=3) == 0


def test_all_none_handles_is_an_error() -> None:
    builder = _builder(generated_identifiers=True)
    with pytest.raises(DelegateMappingError, match="no valid debug handles"):
        builder.insert_delegate_mapping_entry(handles=[None])
    with pytest.raises(DelegateMappingError, match="no valid debug handles"):
        builder.insert_delegate_mapping_entry(nodes=[])
    with pytest.raises(DelegateMappingError, match="must be an int"):
        builder.insert_delegate_mapping_entry(handles=["3"])  # type: ignore[list-item]  # testing a bad handle


def test_mapping_bytes_do_not_depend_on_hash_seed() -> None:
    code = (
        "import msgspec\n"
        "from texir.lowering.debug_mapping import DelegateMappingBuilder\n"
        "b = DelegateMappingBuilder()\n"
        "for i, ident in enumerate(['zeta', 'alpha', 'mid', 'beta']):\n"
        "    b.insert_delegate_mapping_entry(handles=[97 - i * 13, 5 + i, 1000 + i], identifier=ident)\n"
        "print(msgspec.json.encode(b.get_delegate_mapping()).decode())\n"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("0", "1", "12345")
    }
    assert len(outputs) == 1
    assert '"identifier":"zeta","debug_handles":[5,97,1000]' in outputs.pop()
