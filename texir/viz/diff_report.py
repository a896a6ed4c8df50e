"""What a structural diff returns (`ProgramDiff`, a tuple of `Change`s) and its text report."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import msgspec

__all__ = ["Change", "ChangeKind", "ProgramDiff", "format_diff", "iter_changed_nodes", "summary_line"]

ChangeKind = Literal["added", "removed", "changed"]


class Change(msgspec.Struct, frozen=True, kw_only=True):
    """One difference. `scope` locates it ("graph", "lowered_module m > graph", "method forward >
    operators"); `key` is the canonical node name (%N) or the entry key; `a`/`b` are the lines."""

    scope: str
    kind: ChangeKind
    key: str
    a: str | None = None
    b: str | None = None
    a_name: str | None = None
    """The node's original name on side a, when known (canonical names are positions)."""
    b_name: str | None = None
    b_key: str | None = None
    """The node's canonical name on side b when it differs from `key` (nodes moved)."""
    fields: tuple[str, ...] = ()
    """For changed nodes: which parts differ ("op", "meta", "args", "debug_handle", "provenance")."""
    is_node: bool = False


class ProgramDiff(msgspec.Struct, frozen=True, kw_only=True):
    """The result of a diff; `changes` is in a stable order (scope order of side a, then b)."""

    a_label: str
    b_label: str
    changes: tuple[Change, ...]

    @property
    def equal(self) -> bool:
        return not self.changes

    def counts(self) -> dict[str, int]:
        out = {"nodes_added": 0, "nodes_removed": 0, "nodes_changed": 0, "other": 0}
        for c in self.changes:
            if c.is_node:
                out[f"nodes_{c.kind}"] += 1
            else:
                out["other"] += 1
        return out


def _node_label(c: Change) -> str:
    names = []
    if c.a_name is not None or c.b_name is not None:
        if c.kind == "changed" and c.a_name is not None and c.b_name is not None and c.a_name != c.b_name:
            names.append(f"{c.a_name} -> {c.b_name}")
        else:
            names.append(c.a_name or c.b_name or "")
    pos = c.key if c.b_key is None else f"{c.key} -> {c.b_key}"
    return pos + (f" ({names[0]})" if names and names[0] else "")


def summary_line(diff: ProgramDiff) -> str:
    n = diff.counts()
    total = len(diff.changes)
    head = f"{total} difference{'s' if total != 1 else ''}"
    if not (n["nodes_changed"] or n["nodes_added"] or n["nodes_removed"]):
        return head  # e.g. two .pte files: their differences are tables, not graph nodes
    node_word = "node" if n["nodes_changed"] == 1 else "nodes"
    return (
        f"{head}: {n['nodes_changed']} {node_word} changed, "
        f"{n['nodes_added']} added, {n['nodes_removed']} removed; {n['other']} other"
    )


def _body(line: str | None) -> str:
    """A node line without its leading "%name : " (the label already names the node)."""
    text = line or ""
    return text.split(" : ", 1)[1] if text.startswith("%") and " : " in text else text


def format_diff(diff: ProgramDiff, *, limit: int | None = 200, header: bool = True) -> str:
    """A readable report: a summary line, then the changes grouped by scope."""
    if diff.equal:
        return f"{diff.a_label} and {diff.b_label} are structurally equal\n"
    out = [f"--- {diff.a_label}", f"+++ {diff.b_label}"] if header else []
    out.append(summary_line(diff))
    scope: str | None = None
    shown = 0
    for c in diff.changes:
        if limit is not None and shown >= limit:
            out.append(f"... {len(diff.changes) - shown} more changes (use --json for all)")
            break
        shown += 1
        if c.scope != scope:
            scope = c.scope
            out.append(f"{scope or 'program'}:")
        if c.is_node:
            label = _node_label(c)
            if c.kind == "added":
                out.append(f"  + node {label}: {_body(c.b)}")
            elif c.kind == "removed":
                out.append(f"  - node {label}: {_body(c.a)}")
            else:
                out.append(f"  ~ node {label} [{', '.join(c.fields)}]")
                out.append(f"      - {c.a}")
                out.append(f"      + {c.b}")
        elif c.kind == "added":
            out.append(f"  + {c.b}")
        elif c.kind == "removed":
            out.append(f"  - {c.a}")
        else:
            out.append(f"  ~ {c.key}")
            out.append(f"      - {c.a}")
            out.append(f"      + {c.b}")
    return "\n".join(out) + "\n"


def iter_changed_nodes(diff: ProgramDiff) -> Iterator[Change]:
    return (c for c in diff.changes if c.is_node)
