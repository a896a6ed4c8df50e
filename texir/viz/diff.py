"""Structural diff of programs (or of their canonical text forms): nodes, signature, state, partitions.

Both sides are compared in canonical text form (`format_program(canonicalize(p))`), parsed back into
an indentation outline. Working on the text, rather than on the structs, lets one engine compare a
live Program with a stored snapshot text (the pytest plugin) and with `.pte` views written in the
same outline style. Graph nodes are aligned by their content with references abstracted away (so an
inserted node does not turn every later node into a change), then compared with references mapped
through the alignment; other lines are matched by key (a state target, a compile-spec key, ...).
Pure: no torch, no I/O.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Iterator, Sequence
from typing import Literal

import msgspec

from texir.ir.canonical import canonicalize, canonicalize_with_names
from texir.ir.printer import format_lowered_module, format_program
from texir.ir.types import LoweredBackendModule, Program

__all__ = [
    "Change",
    "ProgramDiff",
    "canonical_module_text",
    "canonical_text",
    "diff_programs",
    "diff_texts",
    "format_diff",
    "module_original_names",
    "original_names",
]

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
    """For changed nodes: which parts differ ("op", "meta", "args", "debug_handle")."""
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


# ------------------------------------------------------------------------------------------------
# Canonical text with original names


# Tensors compare by content hash: whether a payload is attached (a snapshot written without
# data) is not part of what a program is, so the printer's "(no data)" marker is dropped.
_NO_DATA_RE = re.compile(r"( sha256=[0-9a-f]+) \(no data\)$", re.MULTILINE)


def canonical_text(program: Program) -> str:
    """The canonical text form: what snapshots store and diffs compare."""
    return _NO_DATA_RE.sub(r"\1", format_program(canonicalize(program)))


def canonical_module_text(module: LoweredBackendModule) -> str:
    """The canonical text form of a lowered backend module (its program canonicalized)."""
    canon = msgspec.structs.replace(module, original_program=canonicalize(module.original_program))
    return _NO_DATA_RE.sub(r"\1", "lowered_module:\n" + format_lowered_module(canon))


def _graph_names(lines: list[_Line], maps: dict[str, dict[str, str]], path: str, names: dict[int, str]) -> None:
    canonical_to_original = {new: old for old, new in maps.get(path, {}).items()}
    for line in lines:
        m = _NODE_RE.match(line.text)
        if m and m.group(1) in canonical_to_original:
            names[line.lineno] = canonical_to_original[m.group(1)]
        elif line.text.startswith("subgraph ") and line.text.endswith("():"):
            sub = line.text[len("subgraph "):-3]
            _graph_names(line.children, maps, _join_path(path, sub), names)


def _join_path(path: str, name: str) -> str:
    if not path or path.endswith(":"):
        return path + name
    return f"{path}/{name}"


def _program_names(lines: list[_Line], maps: dict[str, dict[str, str]], prefix: str, names: dict[int, str]) -> None:
    for line in lines:
        if line.text == "graph():":
            _graph_names(line.children, maps, prefix, names)
        elif line.text.startswith("lowered_module ") and line.text.endswith(":"):
            _program_names(line.children, maps, f"{prefix}{line.text[len('lowered_module '):-1]}:", names)


def original_names(program: Program, text: str | None = None) -> dict[int, str]:
    """Line number in `canonical_text(program)` (or `text`, if given) -> original name of the
    node defined there, from `canonicalize_with_names`' rename maps."""
    names: dict[int, str] = {}
    _, maps = canonicalize_with_names(program)
    _program_names(_outline(text if text is not None else canonical_text(program)), maps, "", names)
    return names


def module_original_names(module: LoweredBackendModule, text: str | None = None) -> dict[int, str]:
    """As `original_names`, for `canonical_module_text(module)`."""
    names: dict[int, str] = {}
    _, maps = canonicalize_with_names(module.original_program)
    for root in _outline(text if text is not None else canonical_module_text(module)):
        _program_names(root.children, maps, "", names)
    return names


_NODE_RE = re.compile(r"^%(\S+) : (.*?) = (.*)$")
_REF_RE = re.compile(r"%([A-Za-z0-9_.]+)")
_DH_RE = re.compile(r"  # dh=(\S+)$")


# ------------------------------------------------------------------------------------------------
# Outline: lines nested by indentation


class _Line:
    __slots__ = ("text", "lineno", "children")

    def __init__(self, text: str, lineno: int) -> None:
        self.text = text
        self.lineno = lineno
        self.children: list[_Line] = []


def _outline(text: str) -> list[_Line]:
    root = _Line("", -1)
    stack: list[tuple[int, _Line]] = [(-1, root)]
    for lineno, raw in enumerate(text.splitlines()):
        if not raw.strip():
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        while stack[-1][0] >= indent:
            stack.pop()
        line = _Line(raw.strip(), lineno)
        stack[-1][1].children.append(line)
        stack.append((indent, line))
    return root.children


def _key(text: str) -> str:
    if text.endswith(":"):
        return text
    m = re.match(r"^(\[[^\]]*\])", text)
    if m:
        return m.group(1)
    best = len(text)
    for sep in (" : ", ": ", " -> ", "="):
        pos = text.find(sep)
        if 0 < pos < best:
            best = pos
    return text[:best]


class _Node:
    __slots__ = ("name", "meta", "rhs", "refs", "template", "dh", "line")

    def __init__(self, line: _Line) -> None:
        self.line = line
        text = line.text
        dh_match = _DH_RE.search(text)
        self.dh = dh_match.group(1) if dh_match else ""
        if dh_match:
            text = text[: dh_match.start()]
        m = _NODE_RE.match(text)
        if m:
            self.name, self.meta, self.rhs = m.group(1), m.group(2), m.group(3)
        else:  # "return (...)"
            self.name, self.meta, self.rhs = "output", "", text
        self.refs = tuple(_REF_RE.findall(self.rhs))
        self.template = _REF_RE.sub("%", self.rhs)

    @property
    def op(self) -> str:
        return self.template.split("(", 1)[0]

    def align_key(self) -> str:
        return f"{self.meta}|{self.template}"


def _is_node(line: _Line) -> bool:
    return bool(_NODE_RE.match(line.text)) or line.text.startswith("return (")


class _Ctx:
    def __init__(self, a_names: dict[int, str], b_names: dict[int, str]) -> None:
        self.a_names = a_names
        self.b_names = b_names
        self.changes: list[Change] = []


def _struct_keys(nodes: Sequence[_Node], roles: dict[str, str], depth: int = 2) -> list[str]:
    """Alignment keys: a node's own content plus, `depth` levels up, the keys of what it reads.
    Own content alone repeats too often in big graphs (difflib then goes quadratic and pairs the
    wrong twins); a bounded depth keeps a change from disturbing keys far downstream."""
    base = [n.align_key() + "|" + roles.get(n.name, "") for n in nodes]
    index = {n.name: i for i, n in enumerate(nodes)}
    keys = base
    for _ in range(depth):
        keys = [
            hashlib.blake2b(
                (base[i] + "<" + ",".join(keys[index[r]] if r in index else "?" for r in n.refs)).encode(),
                digest_size=10,
            ).hexdigest()
            for i, n in enumerate(nodes)
        ]
    return keys


def _pair_nodes(a: Sequence[_Node], b: Sequence[_Node], roles_a: dict[str, str],
                roles_b: dict[str, str]) -> list[tuple[int | None, int | None]]:
    """Alignment of a and b: matched pairs, then replaced blocks paired by op, the rest unpaired.
    Placeholders are told apart by their signature role (parameter w, user input, ...)."""
    pairs: list[tuple[int | None, int | None]] = []
    # Common prefix and suffix first: the usual small edit then costs O(n).
    lo = 0
    while lo < len(a) and lo < len(b) and a[lo].line.text == b[lo].line.text and (
        roles_a.get(a[lo].name) == roles_b.get(b[lo].name)
    ):
        lo += 1
    hi = 0
    while (
        hi < len(a) - lo and hi < len(b) - lo and a[-1 - hi].line.text == b[-1 - hi].line.text
    ):
        hi += 1
    pairs.extend((i, i) for i in range(lo))
    ka = _struct_keys(a, roles_a)[lo : len(a) - hi]
    kb = _struct_keys(b, roles_b)[lo : len(b) - hi]
    matcher = difflib.SequenceMatcher(None, ka, kb, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            pairs.extend((lo + i1 + k, lo + j1 + k) for k in range(i2 - i1))
            continue
        # Pair nodes of the same op in order; pair the leftovers positionally when both sides
        # have some (a node whose op changed), the rest are added or removed.
        ops_a = [a[lo + i].op + roles_a.get(a[lo + i].name, "") for i in range(i1, i2)]
        ops_b = [b[lo + j].op + roles_b.get(b[lo + j].name, "") for j in range(j1, j2)]
        sub = difflib.SequenceMatcher(None, ops_a, ops_b, autojunk=False)
        for t2, p1, p2, q1, q2 in sub.get_opcodes():
            n = min(p2 - p1, q2 - q1) if t2 != "equal" else p2 - p1
            for k in range(n):
                ia, jb = lo + i1 + p1 + k, lo + j1 + q1 + k
                if t2 == "equal" or _plausible(a[ia], b[jb]):
                    pairs.append((ia, jb))
                else:
                    pairs.extend(((ia, None), (None, jb)))
            pairs.extend((lo + i1 + p1 + k, None) for k in range(n, p2 - p1))
            pairs.extend((None, lo + j1 + q1 + k) for k in range(n, q2 - q1))
    pairs.extend((len(a) - hi + k, len(b) - hi + k) for k in range(hi))
    return pairs


def _plausible(a: _Node, b: _Node) -> bool:
    """Whether two nodes at the same place are one node changed (an op swapped for another
    of the same node kind and type) rather than one removed and another added."""
    call_a, call_b = "(" in a.template, "(" in b.template
    return call_a == call_b and (a.meta == b.meta or a.template == b.template)


def _map_refs(text: str, a_to_b: dict[str, str]) -> str:
    return _REF_RE.sub(lambda m: "%" + a_to_b.get(m.group(1), "?" + m.group(1)), text)


def _diff_nodes(scope: str, a: list[_Node], b: list[_Node],
                pairs: list[tuple[int | None, int | None]], a_to_b: dict[str, str],
                ctx: _Ctx) -> None:
    for i, j in pairs:
        na = a[i] if i is not None else None
        nb = b[j] if j is not None else None
        if na is not None and nb is not None:
            mapped = _map_refs(na.rhs, a_to_b)
            fields = []
            if na.op != nb.op:
                fields.append("op")
            if na.meta != nb.meta:
                fields.append("meta")
            if na.op == nb.op and mapped != nb.rhs:
                fields.append("args")
            if na.dh != nb.dh:
                fields.append("debug_handle")
            if not fields:
                continue
            ctx.changes.append(
                Change(
                    scope=scope, kind="changed", key=f"%{na.name}", a=na.line.text, b=nb.line.text,
                    a_name=ctx.a_names.get(na.line.lineno), b_name=ctx.b_names.get(nb.line.lineno),
                    b_key=None if na.name == nb.name else f"%{nb.name}", fields=tuple(fields),
                    is_node=True,
                )
            )
        elif na is not None:
            ctx.changes.append(
                Change(scope=scope, kind="removed", key=f"%{na.name}", a=na.line.text,
                       a_name=ctx.a_names.get(na.line.lineno), is_node=True)
            )
        elif nb is not None:
            ctx.changes.append(
                Change(scope=scope, kind="added", key=f"%{nb.name}", b=nb.line.text,
                       b_name=ctx.b_names.get(nb.line.lineno), is_node=True)
            )


def _diff_sequence(scope: str, a: list[_Line], b: list[_Line], a_to_b: dict[str, str],
                   ctx: _Ctx) -> None:
    """Ordered entries that name nodes (signature inputs/outputs): aligned with refs mapped."""
    ta = [_map_refs(x.text, a_to_b) for x in a]
    tb = [x.text for x in b]
    matcher = difflib.SequenceMatcher(None, ta, tb, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        n = min(i2 - i1, j2 - j1)
        for k in range(n):
            ctx.changes.append(Change(scope=scope, kind="changed", key=f"[{j1 + k}]",
                                      a=a[i1 + k].text, b=b[j1 + k].text))
        for k in range(i1 + n, i2):
            ctx.changes.append(Change(scope=scope, kind="removed", key=f"[{k}]", a=a[k].text))
        for k in range(j1 + n, j2):
            ctx.changes.append(Change(scope=scope, kind="added", key=f"[{k}]", b=b[k].text))


_INDEX_RE = re.compile(r"^\[(\d+)\] ")


def _diff_indexed(scope: str, a: list[_Line], b: list[_Line], ctx: _Ctx) -> None:
    """Index-numbered tables (.pte values, delegates, instructions): aligned by content, so one
    inserted entry is one addition, not a change at every later index."""
    ta = [_INDEX_RE.sub("", x.text) for x in a]
    tb = [_INDEX_RE.sub("", x.text) for x in b]
    matcher = difflib.SequenceMatcher(None, ta, tb, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        n = i2 - i1 if tag == "equal" else min(i2 - i1, j2 - j1)
        for k in range(n):
            la, lb = a[i1 + k], b[j1 + k]
            ka, kb = _key(la.text), _key(lb.text)
            key = ka if ka == kb else f"{ka} -> {kb}"
            if tag != "equal":
                ctx.changes.append(Change(scope=scope, kind="changed", key=key, a=la.text, b=lb.text))
            if la.children or lb.children:
                _diff_level(_join(scope, _key(lb.text)), la.children, lb.children, ctx)
        if tag == "equal":
            continue
        for k in range(i1 + n, i2):
            ctx.changes.append(Change(scope=scope, kind="removed", key=_key(a[k].text), a=_summary(a[k])))
        for k in range(j1 + n, j2):
            ctx.changes.append(Change(scope=scope, kind="added", key=_key(b[k].text), b=_summary(b[k])))


def _keyed(lines: list[_Line]) -> dict[str, _Line]:
    out: dict[str, _Line] = {}
    for line in lines:
        key = _key(line.text)
        unique, n = key, 1
        while unique in out:
            n += 1
            unique = f"{key} #{n}"
        out[unique] = line
    return out


def _roles(level: list[_Line]) -> dict[str, str]:
    """Canonical placeholder name -> its signature entry ("parameter w"), from a program header."""
    roles: dict[str, str] = {}
    for line in level:
        if line.text.startswith("program "):
            for section in line.children:
                if section.text == "inputs:":
                    for entry in section.children:
                        name, _, role = entry.text.partition(": ")
                        roles[name.lstrip("%")] = role
    return roles


_GRAPH_KEY = "graph():"


def _diff_level(scope: str, a: list[_Line], b: list[_Line], ctx: _Ctx,
                a_to_b: dict[str, str] | None = None,
                roles: tuple[dict[str, str], dict[str, str]] = ({}, {}),
                node_pairs: tuple[list[_Node], list[_Node], list[tuple[int | None, int | None]]]
                | None = None) -> None:
    if node_pairs is not None:
        a_nodes, b_nodes, pairs = node_pairs
    else:
        a_nodes = [_Node(x) for x in a if _is_node(x)]
        b_nodes = [_Node(x) for x in b if _is_node(x)]
        pairs = _pair_nodes(a_nodes, b_nodes, *roles) if a_nodes or b_nodes else []
    if a_nodes or b_nodes:
        mapping = {a_nodes[i].name: b_nodes[j].name for i, j in pairs
                   if i is not None and j is not None}
        _diff_nodes(scope, a_nodes, b_nodes, pairs, mapping, ctx)
    rest_a = [x for x in a if not _is_node(x)]
    rest_b = [x for x in b if not _is_node(x)]
    if (rest_a or rest_b) and all(_INDEX_RE.match(x.text) for x in (*rest_a, *rest_b)):
        _diff_indexed(scope, rest_a, rest_b, ctx)
        return
    ka = _keyed(rest_a)
    kb = _keyed(rest_b)
    # The node alignment of this level's graph maps references in its signature.
    level_map: dict[str, str] = {}
    graph_pairs: tuple[list[_Node], list[_Node], list[tuple[int | None, int | None]]] | None = None
    ga, gb = ka.get(_GRAPH_KEY), kb.get(_GRAPH_KEY)
    if ga is not None and gb is not None:
        na = [_Node(x) for x in ga.children if _is_node(x)]
        nb = [_Node(x) for x in gb.children if _is_node(x)]
        pairs_ab = _pair_nodes(na, nb, _roles(a), _roles(b))
        graph_pairs = (na, nb, pairs_ab)
        level_map = {na[i].name: nb[j].name for i, j in pairs_ab if i is not None and j is not None}
    # This level's own lines first, then the sections below it, so each scope is reported once.
    nested: list[tuple[str, _Line, _Line]] = []
    for key in [*ka, *(k for k in kb if k not in ka)]:
        la, lb = ka.get(key), kb.get(key)
        if la is not None and lb is not None:
            if la.text != lb.text:
                ctx.changes.append(Change(scope=scope, kind="changed", key=key, a=la.text, b=lb.text))
            if la.children or lb.children:
                nested.append((key, la, lb))
        elif la is not None:
            ctx.changes.append(Change(scope=scope, kind="removed", key=key, a=_summary(la)))
        elif lb is not None:
            ctx.changes.append(Change(scope=scope, kind="added", key=key, b=_summary(lb)))
    for key, la, lb in nested:
        inner = _join(scope, key)
        if key in ("inputs:", "outputs:") and a_to_b is not None:
            _diff_sequence(inner, la.children, lb.children, a_to_b, ctx)
        elif key == _GRAPH_KEY:
            _diff_level(inner, la.children, lb.children, ctx, roles=(_roles(a), _roles(b)),
                        node_pairs=graph_pairs)
        else:
            _diff_level(inner, la.children, lb.children, ctx, level_map or a_to_b)


def _summary(line: _Line) -> str:
    """A section's header plus its first line (a lowered module's backend and blob hash)."""
    if line.children and not line.children[0].children:
        return f"{line.text} {line.children[0].text}"
    return line.text


_SCOPE_LABELS = (("program ", "signature"), ("graph()", "graph"))


def _join(scope: str, key: str) -> str:
    key = key.rstrip(":")
    for prefix, label in _SCOPE_LABELS:
        if key.startswith(prefix):
            key = label
            break
    key = key.removesuffix("()")
    return f"{scope} > {key}" if scope else key


def diff_texts(
    a: str,
    b: str,
    *,
    a_label: str = "a",
    b_label: str = "b",
    a_names: dict[int, str] | None = None,
    b_names: dict[int, str] | None = None,
) -> ProgramDiff:
    """Structural diff of two canonical texts (see `canonical_text`). `a_names`/`b_names` map a
    text's line numbers to original node names (see `original_names`) for readable output."""
    ctx = _Ctx(a_names or {}, b_names or {})
    if a != b:  # equal texts (a passing snapshot test) need no parsing
        _diff_level("", _outline(a), _outline(b), ctx)
    return ProgramDiff(a_label=a_label, b_label=b_label, changes=tuple(ctx.changes))


def diff_programs(a: Program, b: Program, *, a_label: str = "a", b_label: str = "b") -> ProgramDiff:
    """Structural diff of two programs in canonical form (names do not matter, content does)."""
    canon_a, canon_b = canonicalize(a), canonicalize(b)
    text_a = _NO_DATA_RE.sub(r"\1", format_program(canon_a))
    text_b = _NO_DATA_RE.sub(r"\1", format_program(canon_b))
    result = diff_texts(
        text_a, text_b, a_label=a_label, b_label=b_label,
        a_names=original_names(a, text_a) if text_a != text_b else None,
        b_names=original_names(b, text_b) if text_a != text_b else None,
    )
    # The printer does not show the module call graph; compare it here so no difference hides.
    ca, cb = canon_a.module_call_graph, canon_b.module_call_graph
    if ca != cb:
        extra = Change(
            scope="", kind="changed", key="module_call_graph",
            a=f"{len(ca)} entries: {', '.join(e.fqn or '<root>' for e in ca)}",
            b=f"{len(cb)} entries: {', '.join(e.fqn or '<root>' for e in cb)}",
        )
        result = msgspec.structs.replace(result, changes=(*result.changes, extra))
    return result


# ------------------------------------------------------------------------------------------------
# Text report


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
    m = _NODE_RE.match(text)
    return text[text.index(" : ") + 3:] if m else text


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
