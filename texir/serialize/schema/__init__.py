"""The snapshot schema as JSON Schema, its checked-in dumps (one per version) and change classification.

`tests/test_schema_version.py` regenerates the schema and compares it with the dump stored for
`SCHEMA_VERSION`; a difference fails unless the version was bumped as the change requires:

- a new field with a default, a new type, a new union variant or enum value: minor bump;
- a removed field, type, variant or enum value, a new required field, a field that lost its default or
  whose default changed, a string field narrowed to an enum of strings: major bump;
- a changed field type: forbidden (add a new field instead).

Descriptions (docstrings) are left out of the dump, so rewording prose needs no bump.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final, Literal

import msgspec

from texir.ir.blob import Blob
from texir.ir.types import SCHEMA_VERSION
from texir.serialize.snapshot import LoweredModuleSnapshot, ProgramSnapshot

__all__ = [
    "CURRENT_SCHEMA_PATH",
    "SCHEMA_DIR",
    "SchemaChange",
    "check_bump",
    "classify_changes",
    "generate_schema",
    "render_schema",
    "schema_path",
    "stored_versions",
]

SCHEMA_DIR: Final = Path(__file__).resolve().parent
CURRENT_SCHEMA_PATH: Final = SCHEMA_DIR / "program.schema.json"
"""The schema of the current SCHEMA_VERSION (a copy of the newest ``v<major>.<minor>.json``)."""

Level = Literal["none", "minor", "major", "forbidden"]
_RANK: Final[dict[str, int]] = {"none": 0, "minor": 1, "major": 2, "forbidden": 3}


class SchemaChange(msgspec.Struct, frozen=True, kw_only=True):
    """One difference between two schema dumps and the bump it needs."""

    level: Level
    path: str
    what: str

    def __str__(self) -> str:
        return f"[{self.level}] {self.path}: {self.what}"


def _schema_hook(typ: type) -> dict[str, Any]:
    if typ is Blob:
        # JSON: base64 string; msgpack: extension type 1 holding the raw bytes.
        return {"type": "string", "contentEncoding": "base64"}
    raise NotImplementedError(f"no JSON schema for {typ!r}")


def _strip_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [_strip_descriptions(v) for v in node]
    return node


def generate_schema(
    types: Iterable[Any] | None = None, *, version: tuple[int, int] = SCHEMA_VERSION
) -> dict[str, Any]:
    """The JSON Schema of the snapshot envelopes (or of `types`), without descriptions."""
    if types is None:
        types = (ProgramSnapshot, LoweredModuleSnapshot)
    roots, defs = msgspec.json.schema_components(tuple(types), schema_hook=_schema_hook)
    schema = {
        "schema_version": [version[0], version[1]],
        "roots": _strip_descriptions(list(roots)),
        "$defs": _strip_descriptions(dict(defs)),
    }
    # Through JSON and back, so defaults read as they are stored (tuples become lists).
    normalized: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(schema))
    return normalized


def render_schema(schema: Mapping[str, Any]) -> bytes:
    """Deterministic, pretty-printed JSON (sorted keys, two-space indent, trailing newline)."""
    compact = msgspec.json.encode(schema, order="sorted")
    return msgspec.json.format(compact, indent=2) + b"\n"


def schema_path(version: tuple[int, int]) -> Path:
    return SCHEMA_DIR / f"v{version[0]}.{version[1]}.json"


def stored_versions() -> list[tuple[int, int]]:
    """Versions with a stored dump, ascending."""
    found = []
    for path in SCHEMA_DIR.glob("v*.json"):
        match = re.fullmatch(r"v(\d+)\.(\d+)\.json", path.name)
        if match:
            found.append((int(match.group(1)), int(match.group(2))))
    return sorted(found)


# --------------------------------------------------------------------------------------------------
# Classification


def _describe(node: Any) -> str:
    return msgspec.json.encode(node, order="sorted").decode()[:120]


def _compare_alternatives(old: list[Any], new: list[Any], path: str) -> list[SchemaChange]:
    changes: list[SchemaChange] = []
    unmatched_new = [alt for alt in new if alt not in old]
    for alt in old:
        if alt in new:
            continue
        # An alternative that itself widened (e.g. a nested union gaining a variant) still matches.
        best: list[SchemaChange] | None = None
        for i, candidate in enumerate(unmatched_new):
            sub = _compare(alt, candidate, path)
            if max((_RANK[c.level] for c in sub), default=0) <= _RANK["minor"]:
                best = sub
                del unmatched_new[i]
                break
        if best is None:
            changes.append(SchemaChange(level="major", path=path, what=f"alternative removed: {_describe(alt)}"))
        else:
            changes.extend(best)
    for alt in unmatched_new:
        changes.append(SchemaChange(level="minor", path=path, what=f"alternative added: {_describe(alt)}"))
    return changes


def _compare_mapping(old: dict[str, Any], new: dict[str, Any], path: str) -> list[SchemaChange]:
    # A discriminator's tag -> type table: new tags are new variants, removed tags remove variants.
    changes: list[SchemaChange] = []
    for tag in sorted(old.keys() - new.keys()):
        changes.append(SchemaChange(level="major", path=path, what=f"variant {tag!r} removed"))
    for tag in sorted(new.keys() - old.keys()):
        changes.append(SchemaChange(level="minor", path=path, what=f"variant {tag!r} added"))
    for tag in sorted(old.keys() & new.keys()):
        if old[tag] != new[tag]:
            changes.append(
                SchemaChange(level="forbidden", path=path, what=f"variant {tag!r} now means {new[tag]!r}")
            )
    return changes


def _compare_properties(old: dict[str, Any], new: dict[str, Any], path: str) -> list[SchemaChange]:
    old_props: dict[str, Any] = old.get("properties", {})
    new_props: dict[str, Any] = new.get("properties", {})
    old_required = set(old.get("required", ()))
    new_required = set(new.get("required", ()))
    changes: list[SchemaChange] = []
    for name in old_props:
        if name not in new_props:
            changes.append(SchemaChange(level="major", path=f"{path}.{name}", what="field removed"))
    for name in new_props:
        if name not in old_props:
            if name in new_required:
                changes.append(SchemaChange(level="major", path=f"{path}.{name}", what="new required field"))
            else:
                changes.append(SchemaChange(level="minor", path=f"{path}.{name}", what="new field with a default"))
    for name in old_props:
        if name not in new_props:
            continue
        field_path = f"{path}.{name}"
        o, n = dict(old_props[name]), dict(new_props[name])
        o_default, n_default = o.pop("default", _MISSING), n.pop("default", _MISSING)
        was_required, is_required = name in old_required, name in new_required
        if is_required and not was_required:
            changes.append(SchemaChange(level="major", path=field_path, what="field became required"))
        elif was_required and not is_required:
            changes.append(SchemaChange(level="minor", path=field_path, what="field gained a default"))
        elif o_default != n_default and not (o_default is _MISSING or n_default is _MISSING):
            changes.append(
                SchemaChange(
                    level="major", path=field_path, what=f"default changed from {o_default!r} to {n_default!r}"
                )
            )
        changes.extend(_compare(o, n, field_path))
    return changes


_MISSING: Final[Any] = object()
_STRUCTURAL_KEYS: Final = frozenset({"properties", "required"})


def _narrowed_to_enum(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """A string field that now takes only some strings (`str` -> `Literal[...]`): the wire form is the
    same, but snapshots holding another value are refused, as for a removed enum value."""
    rest_old = {k: v for k, v in old.items() if k != "type"}
    rest_new = {k: v for k, v in new.items() if k != "enum"}
    values = new.get("enum")
    return (
        old.get("type") == "string" and "enum" not in old and "type" not in new and rest_old == rest_new
        and isinstance(values, list) and all(isinstance(v, str) for v in values)
    )


def _compare(old: Any, new: Any, path: str) -> list[SchemaChange]:
    if old == new:
        return []
    if not (isinstance(old, dict) and isinstance(new, dict)):
        if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
            out: list[SchemaChange] = []
            for i, (a, b) in enumerate(zip(old, new)):
                out.extend(_compare(a, b, f"{path}[{i}]"))
            return out
        return [SchemaChange(level="forbidden", path=path, what=f"type changed: {_describe(old)} -> {_describe(new)}")]
    if _narrowed_to_enum(old, new):
        values = ", ".join(repr(v) for v in new["enum"])
        return [SchemaChange(level="major", path=path, what=f"string narrowed to the values {values}")]
    changes: list[SchemaChange] = []
    if "properties" in old or "properties" in new:
        changes.extend(_compare_properties(old, new, path))
    for key in sorted((old.keys() | new.keys()) - _STRUCTURAL_KEYS):
        o, n = old.get(key, _MISSING), new.get(key, _MISSING)
        if o == n:
            continue
        if o is _MISSING or n is _MISSING:
            changes.append(
                SchemaChange(
                    level="forbidden",
                    path=path,
                    what=f"type changed: {key!r} {'added' if o is _MISSING else 'removed'}",
                )
            )
        elif key == "anyOf" and isinstance(o, list) and isinstance(n, list):
            changes.extend(_compare_alternatives(o, n, path))
        elif key == "enum" and isinstance(o, list) and isinstance(n, list):
            for value in o:
                if value not in n:
                    changes.append(SchemaChange(level="major", path=path, what=f"enum value {value!r} removed"))
            for value in n:
                if value not in o:
                    changes.append(SchemaChange(level="minor", path=path, what=f"enum value {value!r} added"))
        elif key == "mapping" and isinstance(o, dict) and isinstance(n, dict):
            changes.extend(_compare_mapping(o, n, path))
        else:
            changes.extend(_compare(o, n, f"{path}.{key}" if isinstance(o, dict) else path))
    return changes


def classify_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[SchemaChange, ...]:
    """Every difference between two schema dumps (from `generate_schema`), with the bump it needs."""
    changes: list[SchemaChange] = []
    old_defs: dict[str, Any] = dict(old.get("$defs", {}))
    new_defs: dict[str, Any] = dict(new.get("$defs", {}))
    for name in sorted(old_defs.keys() - new_defs.keys()):
        changes.append(SchemaChange(level="major", path=name, what="type removed"))
    for name in sorted(new_defs.keys() - old_defs.keys()):
        changes.append(SchemaChange(level="minor", path=name, what="type added"))
    for name in sorted(old_defs.keys() & new_defs.keys()):
        changes.extend(_compare(old_defs[name], new_defs[name], name))
    changes.extend(_compare(old.get("roots"), new.get("roots"), "roots"))
    return tuple(changes)


def _needed(changes: Iterable[SchemaChange]) -> Level:
    worst: Level = "none"
    for change in changes:
        if _RANK[change.level] > _RANK[worst]:
            worst = change.level
    return worst


def check_bump(
    old_version: tuple[int, int], new_version: tuple[int, int], changes: Iterable[SchemaChange]
) -> str | None:
    """None if going from `old_version` to `new_version` is the right bump for `changes`, else a
    message saying what the version must be."""
    changes = tuple(changes)
    needed = _needed(changes)
    listing = "\n".join(f"  {c}" for c in changes)
    old_text = f"{old_version[0]}.{old_version[1]}"
    new_text = f"{new_version[0]}.{new_version[1]}"
    if needed == "forbidden":
        return (
            f"forbidden schema change (a field's type changed); keep the old field and add a new one "
            f"with a default instead:\n{listing}"
        )
    if needed == "major":
        expected = (old_version[0] + 1, 0)
    elif needed == "minor":
        expected = (old_version[0], old_version[1] + 1)
    else:
        expected = old_version
    if new_version == expected:
        return None
    return (
        f"the schema change needs a {needed} bump: SCHEMA_VERSION must go from {old_text} to "
        f"{expected[0]}.{expected[1]} (it is {new_text}); set SCHEMA_VERSION = {expected} in "
        f"texir/ir/types.py and run `TEXIR_UPDATE_SCHEMA=1 pytest tests/test_schema_version.py`:\n{listing}"
    )
