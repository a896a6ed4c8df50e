"""Structural diff of programs: nodes, signature, state, partitions, compared as IR structs.

Both sides are canonicalized (`canonicalize`: node names become positions), then compared field by
field: graph nodes are aligned by their content with references abstracted away (so an inserted
node does not turn every later node into a change), then compared with references mapped through
the alignment; tables are matched by key (a state target, a compile-spec key, a module name).
Stored canonical texts (snapshots) are parsed back into Programs (`texir.ir.parse_program`) and
compared the same way; `.pte` outline texts go to `texir.viz.outline_diff`. Pure: no torch, no I/O.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Mapping, Sequence

import msgspec

from texir.ir.analysis import iter_refs
from texir.ir.canonical import canonicalize
from texir.ir.names import rename_arg, rename_input_spec, rename_node, rename_output_spec
from texir.ir.printer import (
    format_input_spec, format_meta, format_module_call, format_node, format_output_spec, tensor_nbytes,
)
from texir.ir.types import (
    Argument, CallFunction, Graph, LoweredBackendModule, ModuleCallEntry, Node, Output, Program, Provenance, Ref, UserInput,
)
from texir.viz.canonical_text import (
    MODULE_HEADER,
    Names,
    StandIns,
    canonical_module_text,
    canonical_text,
    module_original_names,
    names_of,
    original_names,
    parse_text,
)
from texir.viz.diff_report import Change, ChangeKind, ProgramDiff, format_diff, iter_changed_nodes, summary_line
from texir.viz.outline_diff import diff_outlines

__all__ = [
    "Change",
    "ProgramDiff",
    "canonical_module_text",
    "canonical_text",
    "diff_modules",
    "diff_programs",
    "diff_texts",
    "format_diff",
    "iter_changed_nodes",
    "module_original_names",
    "original_names",
    "summary_line",
]

# ------------------------------------------------------------------------------------------------
# Struct diff


class _Node:
    """A node with what alignment and comparison need, derived from its struct."""

    __slots__ = ("name", "node", "meta", "prov", "text", "refs", "template", "op", "meta_text")

    def __init__(self, node: Node, meta: object, prov: Provenance | None) -> None:
        self.name, self.node, self.meta, self.prov = node.name, node, meta, prov
        self.text = format_node(node, meta, prov)  # type: ignore[arg-type]  # a ValueMeta or None
        self.refs = tuple(r for a in _args(node) for r in iter_refs(a))
        blank = rename_node(node, {r: "" for r in self.refs}, rename_self=False)
        self.template = format_node(blank).split(" = ", 1)[-1]
        self.meta_text = format_meta(meta) if not isinstance(node, Output) else ""  # type: ignore[arg-type]  # as above
        self.op = self.template.split("(", 1)[0]

    def align_key(self) -> str:
        return f"{self.meta_text}|{self.template}"


def _args(node: Node) -> tuple[Argument, ...]:
    if isinstance(node, CallFunction):
        return (*node.args, *(v for _, v in node.kwargs))
    return node.args if isinstance(node, Output) else ()


def _nodes(graph: Graph) -> list[_Node]:
    return [_Node(n, m, p) for n, m, p in graph.entries()]


class _Side:
    def __init__(self, names: Names, blobs: StandIns) -> None:
        self.names, self.blobs = names, blobs


class _Ctx:
    def __init__(self, a: _Side, b: _Side) -> None:
        self.a, self.b = a, b
        self.changes: list[Change] = []

    def add(self, scope: str, kind: ChangeKind, key: str, a: str | None = None, b: str | None = None) -> None:
        self.changes.append(Change(scope=scope, kind=kind, key=key, a=a, b=b))


def _join(scope: str, key: str) -> str:
    return f"{scope} > {key}" if scope else key


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


Pairs = list[tuple[int | None, int | None]]


def _pair_nodes(a: Sequence[_Node], b: Sequence[_Node], roles_a: dict[str, str], roles_b: dict[str, str]) -> Pairs:
    """Alignment of a and b: matched pairs, then replaced blocks paired by op, the rest unpaired.
    Placeholders are told apart by their signature role (parameter w, user input, ...)."""
    pairs: Pairs = []
    lo = 0  # common prefix and suffix first: the usual small edit then costs O(n)
    while lo < min(len(a), len(b)) and a[lo].text == b[lo].text and roles_a.get(a[lo].name) == roles_b.get(b[lo].name):
        lo += 1
    hi = 0
    while hi < len(a) - lo and hi < len(b) - lo and a[-1 - hi].text == b[-1 - hi].text:
        hi += 1
    pairs.extend((i, i) for i in range(lo))
    ka = _struct_keys(a, roles_a)[lo : len(a) - hi]
    kb = _struct_keys(b, roles_b)[lo : len(b) - hi]
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, ka, kb, autojunk=False).get_opcodes():
        if tag == "equal":
            pairs.extend((lo + i1 + k, lo + j1 + k) for k in range(i2 - i1))
            continue
        # Pair nodes of the same op in order; pair the leftovers positionally when both sides
        # have some (a node whose op changed), the rest are added or removed.
        ops_a = [a[lo + i].op + roles_a.get(a[lo + i].name, "") for i in range(i1, i2)]
        ops_b = [b[lo + j].op + roles_b.get(b[lo + j].name, "") for j in range(j1, j2)]
        for t2, p1, p2, q1, q2 in difflib.SequenceMatcher(None, ops_a, ops_b, autojunk=False).get_opcodes():
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
    """Whether two nodes at the same place are one node changed (an op swapped for another of the
    same node kind and type) rather than one removed and another added."""
    return type(a.node) is type(b.node) and (a.meta == b.meta or a.template == b.template)


def _node_fields(na: _Node, nb: _Node, a_to_b: dict[str, str]) -> list[str]:
    fields = []
    if na.op != nb.op:
        fields.append("op")
    if na.meta != nb.meta:
        fields.append("meta")
    if na.op == nb.op and _args(rename_node(na.node, a_to_b, rename_self=False)) != _args(nb.node):
        fields.append("args")
    pa, pb = na.prov or Provenance(), nb.prov or Provenance()
    if pa.debug_handle != pb.debug_handle:
        fields.append("debug_handle")
    if msgspec.structs.replace(pa, debug_handle=None) != msgspec.structs.replace(pb, debug_handle=None):
        fields.append("provenance")
    return fields


def _roles(program: Program) -> dict[str, str]:
    """Canonical placeholder name -> its signature entry ("parameter w")."""
    roles = {}
    for spec in program.signature.inputs:
        if not isinstance(spec, UserInput):
            roles[spec.name] = format_input_spec(spec).partition(": ")[2]
        elif isinstance(spec.arg, Ref):
            roles[spec.arg.name] = "user_input"
    return roles


def _diff_graph(scope: str, ga: Graph, gb: Graph, paths: tuple[str, str], ctx: _Ctx,
                roles: tuple[dict[str, str], dict[str, str]] = ({}, {}),
                aligned: tuple[list[_Node], list[_Node], Pairs] | None = None) -> None:
    a, b, pairs = aligned or _align(ga, gb, roles)
    a_to_b = {a[i].name: b[j].name for i, j in pairs if i is not None and j is not None}
    for i, j in pairs:
        na = a[i] if i is not None else None
        nb = b[j] if j is not None else None
        a_name = ctx.a.names.get((paths[0], na.name)) if na is not None else None
        b_name = ctx.b.names.get((paths[1], nb.name)) if nb is not None else None
        if na is not None and nb is not None:
            fields = _node_fields(na, nb, a_to_b)
            if fields:
                ctx.changes.append(Change(
                    scope=scope, kind="changed", key=f"%{na.name}", a=na.text, b=nb.text, a_name=a_name,
                    b_name=b_name, b_key=None if na.name == nb.name else f"%{nb.name}", fields=tuple(fields),
                    is_node=True))
        elif na is not None:
            ctx.changes.append(Change(scope=scope, kind="removed", key=f"%{na.name}", a=na.text, a_name=a_name, is_node=True))
        elif nb is not None:
            ctx.changes.append(Change(scope=scope, kind="added", key=f"%{nb.name}", b=nb.text, b_name=b_name, is_node=True))
    subs_a = {s.name: s.graph for s in ga.subgraphs}
    subs_b = {s.name: s.graph for s in gb.subgraphs}
    for name in [*subs_a, *(n for n in subs_b if n not in subs_a)]:
        sa, sb = subs_a.get(name), subs_b.get(name)
        if sa is not None and sb is not None:
            inner = tuple(f"{p}{name}" if not p or p.endswith(":") else f"{p}/{name}" for p in paths)
            _diff_graph(_join(scope, f"subgraph {name}"), sa, sb, (inner[0], inner[1]), ctx)
        else:
            kind: ChangeKind = "removed" if sb is None else "added"
            line = f"subgraph {name}(): {len((sa or sb).nodes)} nodes"  # type: ignore[union-attr]  # one is set
            ctx.add(scope, kind, f"subgraph {name}():", line if kind == "removed" else None, line if kind == "added" else None)


def _align(ga: Graph, gb: Graph, roles: tuple[dict[str, str], dict[str, str]]) -> tuple[list[_Node], list[_Node], Pairs]:
    a, b = _nodes(ga), _nodes(gb)
    return a, b, _pair_nodes(a, b, *roles)


def _diff_lines(scope: str, a: list[str], a_mapped: list[str], b: list[str], ctx: _Ctx) -> None:
    """Ordered entries (signature inputs/outputs), compared with side a's references mapped."""
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a_mapped, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        n = min(i2 - i1, j2 - j1)
        for k in range(n):
            ctx.add(scope, "changed", f"[{j1 + k}]", a[i1 + k], b[j1 + k])
        for k in range(i1 + n, i2):
            ctx.add(scope, "removed", f"[{k}]", a[k], None)
        for k in range(j1 + n, j2):
            ctx.add(scope, "added", f"[{k}]", None, b[k])


Table = Mapping[str, tuple[object, str]]
"""key -> (what is compared, the line reported)."""


def _diff_table(scope: str, a: Table, b: Table, ctx: _Ctx) -> None:
    for key in [*a, *(k for k in b if k not in a)]:
        ea, eb = a.get(key), b.get(key)
        if ea is not None and eb is not None:
            if ea[0] != eb[0]:
                ctx.add(scope, "changed", key, ea[1], eb[1])
        elif ea is not None:
            ctx.add(scope, "removed", key, ea[1], None)
        elif eb is not None:
            ctx.add(scope, "added", key, None, eb[1])


def _state_table(program: Program) -> Table:
    out: dict[str, tuple[object, str]] = {}
    for entry in program.state:
        v = entry.value
        size = "" if v.nbytes == tensor_nbytes(v.meta) else f" nbytes={v.nbytes}"
        out[entry.target] = ((v.meta, v.sha256, v.nbytes), f"{entry.target} : {format_meta(v.meta)} sha256={v.sha256}{size}")
    return out


def _diff_program(scope: str, pa: Program, pb: Program, paths: tuple[str, str], ctx: _Ctx) -> None:
    if pa.dialect != pb.dialect:
        ctx.add(scope, "changed", "program dialect", f"program dialect={pa.dialect}", f"program dialect={pb.dialect}")
    aligned = _align(pa.graph, pb.graph, (_roles(pa), _roles(pb)))
    a_nodes, b_nodes, pairs = aligned
    a_to_b = {a_nodes[i].name: b_nodes[j].name for i, j in pairs if i is not None and j is not None}
    sa, sb = pa.signature, pb.signature
    _diff_lines(_join(scope, "signature > inputs"), [format_input_spec(s) for s in sa.inputs],
                [format_input_spec(rename_input_spec(s, a_to_b)) for s in sa.inputs],
                [format_input_spec(s) for s in sb.inputs], ctx)
    _diff_lines(_join(scope, "signature > outputs"), [format_output_spec(s) for s in sa.outputs],
                [format_output_spec(rename_output_spec(s, a_to_b)) for s in sa.outputs],
                [format_output_spec(s) for s in sb.outputs], ctx)
    _diff_graph(_join(scope, "graph"), pa.graph, pb.graph, paths, ctx, aligned=aligned)
    _diff_table(_join(scope, "state"), _state_table(pa), _state_table(pb), ctx)
    ranges = [{r.symbol: (r, f"{r.symbol}: [{r.min}, {'inf' if r.max is None else r.max}]"
                          + ("" if r.hint is None else f" hint={r.hint}")) for r in p.range_constraints} for p in (pa, pb)]
    _diff_table(_join(scope, "range_constraints"), ranges[0], ranges[1], ctx)
    calls = [{e.fqn or "<root>": (_mapped_call(e, m), format_module_call(e)) for e in p.module_call_graph}
             for p, m in ((pa, a_to_b), (pb, {}))]
    _diff_table(_join(scope, "module_call_graph"), calls[0], calls[1], ctx)
    notes = [{f"%{m.get(n.node, n.node)} {n.key!r}": (n.value, f"%{n.node} {n.key!r}: {n.value!r}")
              for n in p.backend_meta} for p, m in ((pa, a_to_b), (pb, {}))]
    _diff_table(_join(scope, "backend_meta"), notes[0], notes[1], ctx)
    ma = {m.name: m.module for m in pa.lowered_modules}
    mb = {m.name: m.module for m in pb.lowered_modules}
    for name in [*ma, *(n for n in mb if n not in ma)]:
        la, lb = ma.get(name), mb.get(name)
        key = f"lowered_module {name}"
        if la is not None and lb is not None:
            _diff_module(_join(scope, key), la, lb, (f"{paths[0]}{name}:", f"{paths[1]}{name}:"), ctx)
        elif la is not None:
            ctx.add(scope, "removed", key, f"{key}: {_backend_line(la, ctx.a.blobs)}", None)
        elif lb is not None:
            ctx.add(scope, "added", key, None, f"{key}: {_backend_line(lb, ctx.b.blobs)}")


def _mapped_call(entry: ModuleCallEntry, a_to_b: dict[str, str]) -> object:
    sig = entry.signature
    if sig is None:
        return entry
    return msgspec.structs.replace(entry, signature=msgspec.structs.replace(
        sig, inputs=tuple(rename_arg(x, a_to_b) for x in sig.inputs),
        outputs=tuple(rename_arg(x, a_to_b) for x in sig.outputs)))


def _backend_line(module: LoweredBackendModule, blobs: StandIns) -> str:
    nbytes, sha = blobs.identity(module.processed_bytes)
    return f"backend={module.backend_id} processed={nbytes}B sha256={sha[:16]}"  # short: a report line


def _module_table(module: LoweredBackendModule) -> Table:
    out: dict[str, tuple[object, str]] = {f"compile_spec {s.key}": (s.value, f"compile_spec {s.key}={s.value.hex()}") for s in module.compile_specs}
    if module.debug_handle_map is not None:
        for e in module.debug_handle_map:
            out[f"debug {e.identifier!r}"] = (e.debug_handles, f"debug {e.identifier!r} -> {list(e.debug_handles)}")
    for d in module.named_data:
        out[f"named_data {d.key!r}"] = ((d.sha256, d.nbytes, d.alignment),
                                        f"named_data {d.key!r}: {d.nbytes}B sha256={d.sha256} alignment={d.alignment}")
    return out


def _diff_module(scope: str, ma: LoweredBackendModule, mb: LoweredBackendModule, paths: tuple[str, str], ctx: _Ctx) -> None:
    line_a, line_b = _backend_line(ma, ctx.a.blobs), _backend_line(mb, ctx.b.blobs)
    if (ma.backend_id, ctx.a.blobs.identity(ma.processed_bytes)) != (mb.backend_id, ctx.b.blobs.identity(mb.processed_bytes)):
        ctx.add(scope, "changed", "backend", line_a, line_b)
    _diff_table(scope, _module_table(ma), _module_table(mb), ctx)
    _diff_program(scope, ma.original_program, mb.original_program, paths, ctx)


def _result(ctx: _Ctx, a_label: str, b_label: str) -> ProgramDiff:
    return ProgramDiff(a_label=a_label, b_label=b_label, changes=tuple(ctx.changes))


def diff_programs(a: Program, b: Program, *, a_label: str = "a", b_label: str = "b") -> ProgramDiff:
    """Structural diff of two programs in canonical form (names do not matter, content does)."""
    ctx = _Ctx(_Side(names_of(a), StandIns()), _Side(names_of(b), StandIns()))
    ca, cb = canonicalize(a), canonicalize(b)
    if ca != cb:
        _diff_program("", ca, cb, ("", ""), ctx)
    return _result(ctx, a_label, b_label)


def diff_modules(a: LoweredBackendModule, b: LoweredBackendModule, *, a_label: str = "a",
                 b_label: str = "b") -> ProgramDiff:
    """Structural diff of two lowered backend modules (their programs in canonical form)."""
    ctx = _Ctx(_Side(names_of(a.original_program), StandIns()), _Side(names_of(b.original_program), StandIns()))
    ca = msgspec.structs.replace(a, original_program=canonicalize(a.original_program))
    cb = msgspec.structs.replace(b, original_program=canonicalize(b.original_program))
    if ca != cb:
        _diff_module("lowered_module", ca, cb, ("", ""), ctx)
    return _result(ctx, a_label, b_label)


def diff_texts(
    a: str,
    b: str,
    *,
    a_label: str = "a",
    b_label: str = "b",
    a_names: dict[int, str] | None = None,
    b_names: dict[int, str] | None = None,
) -> ProgramDiff:
    """Structural diff of two canonical text views (see `texir.viz.views.text_view`): program and
    lowered-module texts are parsed and compared as structs, `.pte` outlines line by line.
    `a_names`/`b_names` map a text's (0-based) line numbers to original node names."""
    sides: list[_Side] = []
    ctx = _Ctx(_Side({}, StandIns()), _Side({}, StandIns()))
    if a == b:  # equal texts (a passing snapshot test) need no parsing
        return _result(ctx, a_label, b_label)
    kinds = {t.startswith("program ") + 2 * t.startswith(MODULE_HEADER) for t in (a, b)}
    if len(kinds) != 1 or kinds == {0}:
        diff_outlines(a, b, lambda scope, kind, key, x, y: ctx.add(scope, kind, key, x, y))  # type: ignore[arg-type]  # kind is a ChangeKind
        return _result(ctx, a_label, b_label)
    module = kinds == {2}
    parsed = []
    for text, by_line in ((a, a_names or {}), (b, b_names or {})):
        lines: dict[tuple[str, str], int] = {}
        blobs = StandIns()
        parsed.append(parse_text(text, module, lines, blobs))
        sides.append(_Side({key: by_line[n - 1] for key, n in lines.items() if n - 1 in by_line}, blobs))
    ctx = _Ctx(sides[0], sides[1])
    pa, pb = parsed
    if isinstance(pa, LoweredBackendModule) and isinstance(pb, LoweredBackendModule):
        _diff_module("lowered_module", pa, pb, ("", ""), ctx)
    elif isinstance(pa, Program) and isinstance(pb, Program):
        _diff_program("", pa, pb, ("", ""), ctx)
    return _result(ctx, a_label, b_label)
