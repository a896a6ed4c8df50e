"""The snapshot schema may only change together with the right SCHEMA_VERSION bump.

To change the schema: edit the IR, bump `SCHEMA_VERSION` in texir/ir/types.py (new defaulted field
or type: minor; removed field, new required field or a string narrowed to an enum: major; changed
type: forbidden), then run
`TEXIR_UPDATE_SCHEMA=1 pytest tests/test_schema_version.py` to store the new dump.
"""

from __future__ import annotations

import os
from typing import Any, Literal, Union

import msgspec
import pytest

from texir.ir.types import SCHEMA_VERSION
from texir.serialize import schema as S

UPDATE = os.environ.get("TEXIR_UPDATE_SCHEMA") == "1"
HOW = "bump SCHEMA_VERSION in texir/ir/types.py, then run `TEXIR_UPDATE_SCHEMA=1 pytest tests/test_schema_version.py`"


def _load(path: Any) -> dict[str, Any]:
    data: dict[str, Any] = msgspec.json.decode(path.read_bytes())
    return data


def test_schema_matches_stored_dump_or_is_bumped_correctly() -> None:
    current = S.generate_schema()
    rendered = S.render_schema(current)
    path = S.schema_path(SCHEMA_VERSION)
    version = f"{SCHEMA_VERSION[0]}.{SCHEMA_VERSION[1]}"
    if path.exists():
        stored = _load(path)
        if stored != current:
            changes = S.classify_changes(stored, current)
            listing = "\n".join(f"  {c}" for c in changes) or "  (only formatting differs)"
            if not changes and UPDATE:
                path.write_bytes(rendered)
            else:
                pytest.fail(
                    f"the snapshot schema changed but SCHEMA_VERSION is still {version}:\n{listing}\n"
                    f"To fix: {HOW}. A released version's stored schema is never rewritten."
                )
    else:
        older = [v for v in S.stored_versions() if v < SCHEMA_VERSION]
        assert older, f"no stored schema older than {version} in {S.SCHEMA_DIR}; restore v1.0.json from git"
        previous = older[-1]
        changes = S.classify_changes(_load(S.schema_path(previous)), current)
        problem = S.check_bump(previous, SCHEMA_VERSION, changes)
        if problem is not None:
            pytest.fail(problem)
        if not UPDATE:
            pytest.fail(
                f"SCHEMA_VERSION was bumped to {version} but its schema is not stored yet; run "
                "`TEXIR_UPDATE_SCHEMA=1 pytest tests/test_schema_version.py` and commit "
                f"texir/serialize/schema/v{version}.json"
            )
        path.write_bytes(rendered)
    if UPDATE and S.CURRENT_SCHEMA_PATH.read_bytes() != rendered:
        S.CURRENT_SCHEMA_PATH.write_bytes(rendered)
    assert S.CURRENT_SCHEMA_PATH.read_bytes() == rendered, (
        f"{S.CURRENT_SCHEMA_PATH.name} is stale; run `TEXIR_UPDATE_SCHEMA=1 pytest tests/test_schema_version.py`"
    )


def test_stored_dumps_are_rendered_deterministically() -> None:
    # Regenerating in this process gives the same bytes as the checked-in file.
    for version in S.stored_versions():
        path = S.schema_path(version)
        assert S.render_schema(_load(path)) == path.read_bytes(), f"{path.name} is not in canonical form"
    assert S.stored_versions()[0] == (1, 0)


# --------------------------------------------------------------------------------------------------
# The classifier on schemas of small stand-in types (same generator as the real schema).


class Tensor(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="tensor"):
    dtype: str
    shape: tuple[int, ...]


class Scalar(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="scalar"):
    value: int


class NoneV(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="none"):
    pass


class Node(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    meta: Union[Tensor, Scalar, None] = None
    mode: Literal["a", "b"] = "a"


def _schema(*types: Any) -> dict[str, Any]:
    return S.generate_schema(types, version=(1, 0))


BASE = _schema(Node)


def _levels(new: dict[str, Any]) -> set[str]:
    return {c.level for c in S.classify_changes(BASE, new)}


def _node_variant(**fields: tuple[Any, ...]) -> dict[str, Any]:
    """The schema of a `Node` whose fields are `name=(type,)` or `name=(type, default)`."""
    spec = [(name, field[0], field[1]) if len(field) > 1 else (name, field[0]) for name, field in fields.items()]
    node = msgspec.defstruct("Node", spec, frozen=True, kw_only=True)
    return _schema(node)


BASE_FIELDS: dict[str, tuple[Any, ...]] = {
    "name": (str,),
    "meta": (Union[Tensor, Scalar, None], None),
    "mode": (Literal["a", "b"], "a"),
}


def test_identical_schema_has_no_changes() -> None:
    assert S.classify_changes(BASE, _node_variant(**BASE_FIELDS)) == ()


def test_new_defaulted_field_is_minor() -> None:
    changes = S.classify_changes(BASE, _node_variant(**BASE_FIELDS, extra=(int, 0)))
    assert [(c.level, c.path) for c in changes] == [("minor", "Node.extra")]
    assert S.check_bump((1, 0), (1, 1), changes) is None
    message = S.check_bump((1, 0), (1, 0), changes)
    assert message is not None and "minor bump" in message and "1.1" in message
    assert "TEXIR_UPDATE_SCHEMA=1" in message


def test_a_string_narrowed_to_literal_values_is_major() -> None:
    base = _node_variant(**BASE_FIELDS, kind=(str, "x"))
    narrowed = _node_variant(**BASE_FIELDS, kind=(Literal["x", "y"], "x"))
    changes = S.classify_changes(base, narrowed)
    assert [(c.level, c.path) for c in changes] == [("major", "Node.kind")]
    assert "'x', 'y'" in changes[0].what
    assert S.check_bump((1, 0), (2, 0), changes) is None
    # Another type than a string (or another default) is still a forbidden or major change of its own.
    assert "forbidden" in {c.level for c in S.classify_changes(_node_variant(**BASE_FIELDS, kind=(int, 0)), narrowed)}


def test_new_required_field_is_major() -> None:
    changes = S.classify_changes(BASE, _node_variant(**BASE_FIELDS, extra=(int,)))
    assert {c.level for c in changes} == {"major"}
    assert S.check_bump((1, 0), (2, 0), changes) is None
    assert S.check_bump((1, 0), (1, 1), changes) is not None


def test_removed_field_is_major() -> None:
    fields = dict(BASE_FIELDS)
    del fields["mode"]
    changes = S.classify_changes(BASE, _node_variant(**fields))
    assert [(c.level, c.path, c.what) for c in changes] == [("major", "Node.mode", "field removed")]


def test_changed_field_type_is_forbidden() -> None:
    fields = dict(BASE_FIELDS, name=(int,))
    changes = S.classify_changes(BASE, _node_variant(**fields))
    assert _levels(_node_variant(**fields)) == {"forbidden"}
    message = S.check_bump((1, 0), (2, 0), changes)
    assert message is not None and "forbidden" in message and "Node.name" in message


def test_new_union_variant_is_minor_and_removed_variant_major() -> None:
    widened = dict(BASE_FIELDS, meta=(Union[Tensor, Scalar, NoneV, None], None))
    assert _levels(_node_variant(**widened)) == {"minor"}
    narrowed = dict(BASE_FIELDS, meta=(Union[Tensor, None], None))
    assert "major" in _levels(_node_variant(**narrowed))


def test_new_enum_value_is_minor_and_removed_value_major() -> None:
    assert _levels(_node_variant(**dict(BASE_FIELDS, mode=(Literal["a", "b", "c"], "a")))) == {"minor"}
    assert _levels(_node_variant(**dict(BASE_FIELDS, mode=(Literal["a"], "a")))) == {"major"}


def test_losing_or_changing_a_default_is_major_gaining_one_minor() -> None:
    assert _levels(_node_variant(**dict(BASE_FIELDS, mode=(Literal["a", "b"],)))) == {"major"}
    assert _levels(_node_variant(**dict(BASE_FIELDS, mode=(Literal["a", "b"], "b")))) == {"major"}
    assert _levels(_node_variant(**dict(BASE_FIELDS, name=(str, "")))) == {"minor"}


def test_field_inside_a_nested_struct_is_classified() -> None:
    class Tensor2(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="tensor"):
        dtype: str
        shape: tuple[int, ...]
        device: str = "cpu"

    fields = dict(BASE_FIELDS, meta=(Union[Tensor2, Scalar, None], None))
    new = _node_variant(**fields)
    # The stand-in has a different class name; rename it so it is the same type for the schema.
    text = msgspec.json.encode(new).decode().replace("Tensor2", "Tensor")
    changes = S.classify_changes(BASE, msgspec.json.decode(text))
    assert [(c.level, c.path) for c in changes] == [("minor", "Tensor.device")]
