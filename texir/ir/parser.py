"""`parse_program(text) -> Program`: the inverse of `format_program`.

``parse_program(format_program(p), payloads=payloads_of(p)) == canonicalize(p)`` for every canonical
program (and the text of a non-canonical program parses back to it, names kept). A hand-written
recursive descent: the outline (indentation) picks the section, a cursor reads each line's
expressions. What the text does not spell out (see `texir.ir.printer`): stack traces, which parse
as absent, and payload bytes, named by SHA-256 and taken from `payloads`: a missing tensor or
named-data payload parses as absent (like a snapshot written without data); a missing delegate blob
is an error unless `missing_blob` makes a stand-in. Bad text raises `ParseError` with line:column.
What the grammar assumes of a program (every traced program meets it): node, target and module
names hold no spaces or brackets, a symbolic size is never all digits (those read as ints), and the
output node is named "output" (as `canonicalize` names it).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Final

from texir.errors import ParseError
from texir.ir.blob import Blob
from texir.ir.builder import GraphBuilder
from texir.ir.parse_expr import HEX, NAME, WORD, Cursor
from texir.ir.parse_lines import (
    read_backend_meta, read_input_spec, read_module_call, read_output_spec, read_quoted, read_range_constraint,
)
from texir.ir.printer import tensor_nbytes
from texir.ir.types import (
    DIALECTS, Argument, BackendNodeMeta, CallFunction, CompileSpec, DebugHandleEntry, Dialect, GetAttr, Graph,
    GraphSignature, Location, LoweredBackendModule, ModuleCallEntry, ModuleFrame, NamedDataEntry,
    NamedLoweredModule, Node, Output, Placeholder, Program, Provenance, RangeConstraint, SourceFn,
    StateEntry, Subgraph, TensorData, TensorMeta, TupleArg, ValueMeta,
)

__all__ = ["parse_lowered_module", "parse_program", "payloads_of"]

Payloads = Mapping[str, bytes | Blob]

_TARGET = re.compile(r"[^\s(]+")
_KEYWORD = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=")
_BACKEND = re.compile(r"\S+")
MAX_GRAPH_NESTING: Final = 32
"""Subgraphs and lowered modules nested deeper than this are refused (a program nests a few)."""


def payloads_of(program: Program) -> dict[str, Blob]:
    """Every payload `program` holds (state, named data, delegate blobs, nested programs too), by
    SHA-256: what `parse_program` needs to rebuild the bytes the text names by hash."""
    out: dict[str, Blob] = {}
    for entry in program.state:
        if entry.value.data is not None:
            out[entry.value.sha256] = entry.value.data
    for lowered in program.lowered_modules:
        module = lowered.module
        blob = Blob(module.processed_bytes)
        out[blob.digest()] = blob
        for item in module.named_data:
            if item.data is not None:
                out[item.sha256] = item.data
        out.update(payloads_of(module.original_program))
    return out


class _Line:
    __slots__ = ("lineno", "indent", "text")

    def __init__(self, lineno: int, indent: int, text: str) -> None:
        self.lineno, self.indent, self.text = lineno, indent, text

    def cursor(self) -> Cursor:
        return Cursor(self.text, self.lineno, self.indent + 1)


class _Parser:
    def __init__(self, text: str, blobs: Payloads, missing_blob: Callable[[str, int], bytes] | None,
                 node_lines: dict[tuple[str, str], int] | None) -> None:
        self.lines = [
            _Line(i + 1, len(raw) - len(raw.lstrip(" ")), raw.strip())
            for i, raw in enumerate(text.splitlines()) if raw.strip()
        ]
        self.pos = 0
        self.blobs = blobs
        self.missing_blob = missing_blob
        self.node_lines = node_lines
        self.metas: dict[str, ValueMeta | None] = {}
        self.depth = 0
        """Graphs (subgraphs, lowered modules' programs) open around the parser."""

    def finish(self) -> None:
        if self.pos != len(self.lines):
            line = self.lines[self.pos]
            raise ParseError(f"unexpected {line.text[:30]!r}", line=line.lineno, column=line.indent + 1,
                             expected="a program section (state:, range_constraints:, lowered_module ...:) or end of text")

    def peek(self, indent: int, prefix: str = "") -> _Line | None:
        if self.pos < len(self.lines):
            line = self.lines[self.pos]
            if line.indent == indent and line.text.startswith(prefix):
                return line
        return None

    def take(self, indent: int, what: str, prefix: str = "") -> _Line:
        line = self.peek(indent, prefix)
        if line is None:
            if self.pos >= len(self.lines):
                raise ParseError(f"expected {what}, found end of text", line=len(self.lines) + 1,
                                 column=1, expected=what)
            bad = self.lines[self.pos]
            raise ParseError(f"expected {what} at indent {indent}, found {bad.text[:30]!r} at indent "
                             f"{bad.indent}", line=bad.lineno, column=bad.indent + 1, expected=what)
        self.pos += 1
        return line

    def block(self, indent: int) -> list[_Line]:
        out = []
        while (line := self.peek(indent)) is not None:
            self.pos += 1
            out.append(line)
        return out

    def blob(self, line: _Line, sha: str, nbytes: int, what: str, required: bool) -> bytes | Blob | None:
        data = self.blobs.get(sha)
        if data is None and required:
            if self.missing_blob is not None:
                return self.missing_blob(sha, nbytes)
            raise ParseError(f"{what}: no payload for sha256={sha}; pass payloads= (texir.ir.payloads_of "
                             "of the program the text was printed from)", line=line.lineno,
                             column=line.indent + 1, expected="a payload")
        if data is not None and len(data) != nbytes:
            raise ParseError(f"{what}: the payload for sha256={sha} has {len(data)} bytes, the text says "
                             f"{nbytes}", line=line.lineno, column=line.indent + 1, expected=f"{nbytes} bytes")
        return data

    # -- program ------------------------------------------------------------------------------
    def program(self, indent: int, path: str) -> Program:
        c = self.take(indent, "'program dialect=...'", "program ").cursor()
        c.expect("program dialect=")
        dialect = self.dialect(c)
        self.take(indent + 2, "'inputs:'", "inputs:")
        inputs = tuple(read_input_spec(line.cursor()) for line in self.block(indent + 4))
        self.take(indent + 2, "'outputs:'", "outputs:")
        outputs = tuple(read_output_spec(line.cursor()) for line in self.block(indent + 4))
        self.take(indent, "'graph():'", "graph():")
        graph = self.graph(indent + 2, path)
        state: tuple[StateEntry, ...] = ()
        range_constraints: tuple[RangeConstraint, ...] = ()
        calls: tuple[ModuleCallEntry, ...] = ()
        backend_meta: tuple[BackendNodeMeta, ...] = ()
        if self.peek(indent, "state:") and self.take(indent, "state:"):
            state = tuple(self.state_entry(line) for line in self.block(indent + 2))
        if self.peek(indent, "range_constraints:") and self.take(indent, "range_constraints:"):
            range_constraints = tuple(read_range_constraint(line.cursor()) for line in self.block(indent + 2))
        if self.peek(indent, "module_call_graph:") and self.take(indent, "module_call_graph:"):
            calls = tuple(read_module_call(line.cursor()) for line in self.block(indent + 2))
        if self.peek(indent, "backend_meta:") and self.take(indent, "backend_meta:"):
            backend_meta = tuple(read_backend_meta(line.cursor()) for line in self.block(indent + 2))
        op_schemas: tuple[str, ...] = ()
        if self.peek(indent, "op_schemas:") and self.take(indent, "op_schemas:"):
            op_schemas = tuple(read_quoted(line.cursor()) for line in self.block(indent + 2))
        lowered = []
        while line := self.peek(indent, "lowered_module "):
            self.pos += 1
            if not line.text.endswith(":"):
                line.cursor().fail("'lowered_module NAME:'")
            name = line.text[len("lowered_module "):-1]
            with self.nested(line, f"lowered_module {name}"):
                lowered.append(NamedLoweredModule(name=name, module=self.lowered(indent + 4, f"{path}{name}:")))
        return Program(
            graph=graph, signature=GraphSignature(inputs=inputs, outputs=outputs), state=state,
            range_constraints=range_constraints, module_call_graph=calls, lowered_modules=tuple(lowered),
            dialect=dialect, backend_meta=backend_meta, op_schemas=op_schemas,
        )

    @staticmethod
    def dialect(c: Cursor) -> Dialect:
        start = c.pos
        text = c.rest()
        for known in DIALECTS:  # (a loop, not `in`, so mypy narrows the str to the Literal)
            if text == known:
                return known
        c.pos = start
        c.fail(f"a program dialect ({', '.join(DIALECTS)})")

    # -- graph --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def nested(self, line: _Line, what: str) -> Iterator[None]:
        """One more level of nesting for the `with` block, refused past `MAX_GRAPH_NESTING`."""
        if self.depth >= MAX_GRAPH_NESTING:
            raise ParseError(f"{what} nested deeper than {MAX_GRAPH_NESTING} levels", line=line.lineno,
                             column=line.indent + 1, expected=f"at most {MAX_GRAPH_NESTING} nested graphs")
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def graph(self, indent: int, path: str) -> Graph:
        entries: list[tuple[Node, ValueMeta | None, int | None]] = []
        while (line := self.peek(indent)) is not None and line.text.startswith(("%", "return (")):
            self.pos += 1
            entries.append(self.node(line))
            if self.node_lines is not None:
                self.node_lines[(path, entries[-1][0].name)] = line.lineno
        if not entries or not isinstance(entries[-1][0], Output):
            self.take(indent, "a node line or 'return (...)'", "return (")
        provs: dict[str, dict[str, object]] = {}
        locations: list[Location] = []
        if self.peek(indent, "provenance:") and self.take(indent, "provenance:"):
            for line in self.block(indent + 2):
                self.provenance_line(line, locations, provs)
        builder = GraphBuilder()
        for node, meta, handle in entries:
            fields = provs.pop(node.name, {})
            if handle is not None:
                fields["debug_handle"] = handle
            builder.add(node, meta, _provenance(fields, locations) if fields else None)
        if provs:
            raise ParseError(f"provenance names unknown node %{next(iter(provs))}", line=self.lines[self.pos - 1].lineno,
                             column=1, expected="a node of this graph")
        subgraphs = []
        while line := self.peek(indent, "subgraph "):
            self.pos += 1
            if not line.text.endswith("():"):
                line.cursor().fail("'subgraph NAME():'")
            name = line.text[len("subgraph "):-3]
            sub_path = path + name if not path or path.endswith(":") else f"{path}/{name}"
            with self.nested(line, f"subgraph {name}"):
                subgraphs.append(Subgraph(name=name, graph=self.graph(indent + 2, sub_path)))
        return builder.build(subgraphs)

    def node(self, line: _Line) -> tuple[Node, ValueMeta | None, int | None]:
        c = line.cursor()
        if c.eat("return "):
            results = c.arg()
            c.end()
            if not isinstance(results, TupleArg):
                c.fail("a parenthesized tuple of results")
            return Output(args=results.items), None, None
        c.expect("%")
        name = c.match(NAME, "a node name")
        c.expect(" : ")
        # Graphs repeat a few dozen metas over many nodes: parse each spelling once. The cache
        # holds only spellings that parsed to exactly the text before the first " = ".
        end = c.text.find(" = ", c.pos)
        spelling = c.text[c.pos:end]
        if spelling in self.metas:
            meta, c.pos = self.metas[spelling], end
        else:
            meta = c.meta()
            if c.pos == end:
                self.metas[spelling] = meta
        c.expect(" = ")
        if c.eat("placeholder"):
            c.end()
            return Placeholder(name=name), meta, None
        if c.eat("get_attr "):
            return GetAttr(name=name, target=c.rest()), meta, None
        target = c.match(_TARGET, "an op target")
        if not c.at("("):
            c.fail("'(' after the op target")
        args: list[Argument] = []
        kwargs: list[tuple[str, Argument]] = []
        c.pos += 1
        while not c.eat(")"):
            m = _KEYWORD.match(c.text, c.pos)
            if m is not None:
                c.pos = m.end()
                kwargs.append((m.group(1), c.arg()))
            elif kwargs:
                c.fail("a keyword argument (positional ones come first)")
            else:
                args.append(c.arg())
            if not c.eat(", "):
                c.expect(")")
                break
        handle = None
        if c.eat("  # dh="):
            handle = c.integer()
        c.end()
        return CallFunction(name=name, target=target, args=tuple(args), kwargs=tuple(kwargs)), meta, handle

    def provenance_line(self, line: _Line, locations: list[Location], provs: dict[str, dict[str, object]]) -> None:
        c = line.cursor()
        if c.eat("loc "):
            if c.integer() != len(locations):
                c.fail(f"location number {len(locations)}")
            c.expect(":")
            fields: dict[str, object] = {}
            while c.eat(" "):
                key = c.match(WORD, "nn_module_stack, source_fn_stack, torch_fn_type or custom")
                c.expect("=")
                if key == "nn_module_stack":
                    frames = c.literal_of("a list of (key, path, type) string triples", _string_tuples(3))
                    fields[key] = tuple(ModuleFrame(key=k, path=p, type=t) for k, p, t in frames)  # type: ignore[attr-defined]  # checked: a list of triples
                elif key == "source_fn_stack":
                    fns = c.literal_of("a list of (name, target) string pairs", _string_tuples(2))
                    fields[key] = tuple(SourceFn(name=n, target=t) for n, t in fns)  # type: ignore[attr-defined]  # checked: a list of pairs
                elif key in ("torch_fn_type", "custom"):
                    fields[key] = c.string()
                else:
                    c.pos -= len(key) + 1
                    c.fail("nn_module_stack, source_fn_stack, torch_fn_type or custom")
            c.end()
            locations.append(Location(**fields))  # type: ignore[arg-type]  # parsed above
            return
        c.expect("%")
        name = c.match(NAME, "a node name")
        c.expect(":")
        prov: dict[str, object] = {}
        while c.eat(" "):
            key = c.match(WORD, "dh, ancestor, fn or loc")
            c.expect("=")
            if key in ("dh", "loc"):
                value = c.integer()
                if key == "loc" and not 0 <= value < len(locations):
                    c.fail(f"a location number below {len(locations)}")
                prov["debug_handle" if key == "dh" else "loc"] = value
            elif key in ("ancestor", "fn"):
                prov[key] = c.string()
            else:
                c.pos -= len(key) + 1
                c.fail("dh, ancestor, fn or loc")
        c.end()
        provs[name] = prov

    # -- tables -------------------------------------------------------------------------------
    def state_entry(self, line: _Line) -> StateEntry:
        c = line.cursor()
        target = c.balanced(" : ")
        c.pos += 3
        meta = c.meta()
        if not isinstance(meta, TensorMeta):
            c.fail("a tensor type")
        c.expect(" sha256=")
        sha = c.match(HEX, "a hex digest")
        nbytes = tensor_nbytes(meta)
        if c.eat(" nbytes="):
            nbytes = c.count("a byte count")
        if nbytes is None:
            c.fail("' nbytes=' (the shape is symbolic)")
        absent = c.eat(" (no data)")
        c.end()
        data = None if absent else self.blob(line, sha, nbytes, f"state {target!r}", required=False)
        blob = None if data is None else data if isinstance(data, Blob) else Blob(data, digest=sha)
        return StateEntry(target=target, value=TensorData(meta=meta, sha256=sha, nbytes=nbytes, data=blob))

    def lowered(self, indent: int, path: str) -> LoweredBackendModule:
        line = self.take(indent, "'backend=... processed=...B sha256=...'", "backend=")
        c = line.cursor()
        c.expect("backend=")
        backend = c.match(_BACKEND, "a backend id")
        c.expect(" processed=")
        nbytes = c.count("a byte count")
        c.expect("B sha256=")
        sha = c.match(HEX, "a hex digest")
        c.end()
        processed = self.blob(line, sha, nbytes, f"delegate blob of {path.rstrip(':') or 'the module'!r}", required=True)
        specs, debug, named = [], [], []
        debug_map: tuple[DebugHandleEntry, ...] | None = None
        info: str | None = None
        while (entry := self.peek(indent)) is not None and not entry.text.startswith("program "):
            self.pos += 1
            line, c = entry, entry.cursor()
            if c.eat("compile_spec "):
                key = c.balanced("=")
                c.pos += 1
                start = c.pos
                value = c.match(HEX, "hex bytes") if c.pos < len(c.text) else ""
                c.end()
                if len(value) % 2:
                    c.pos = start
                    c.fail("an even number of hex digits")
                specs.append(CompileSpec(key=key, value=bytes.fromhex(value)))
            elif c.eat("debug (empty)"):
                c.end()
                debug_map = ()
            elif c.eat("debug "):
                ident = c.literal_of("a backend identifier (an int or a quoted string)", _is_identifier)
                c.expect(" -> ")
                handles = c.literal_of("a list of debug handles", _is_int_list)
                c.end()
                debug.append(DebugHandleEntry(identifier=ident, debug_handles=tuple(handles)))  # type: ignore[arg-type]  # checked above
            elif c.eat("named_data "):
                key = c.string()
                c.expect(": ")
                size = c.count("a byte count")
                c.expect("B sha256=")
                digest = c.match(HEX, "a hex digest")
                c.expect(" alignment=")
                alignment = c.count("an alignment")
                absent = c.eat(" (no data)")
                c.end()
                data = None if absent else self.blob(line, digest, size, f"named data {key!r}", required=False)
                named.append(NamedDataEntry(key=key, sha256=digest, nbytes=size, alignment=alignment,
                                            data=data if data is None or isinstance(data, Blob) else Blob(data, digest=digest)))
            elif c.eat("delegate_info "):
                info = c.string()
                c.end()
            else:
                c.fail("compile_spec, debug, named_data or delegate_info")
        if debug:
            debug_map = tuple(debug)
        original = self.program(indent, path)
        return LoweredBackendModule(
            backend_id=backend, processed_bytes=processed.tobytes() if isinstance(processed, Blob) else bytes(processed or b""),
            compile_specs=tuple(specs), original_program=original, debug_handle_map=debug_map,
            named_data=tuple(named), delegate_info=info,
        )


def _string_tuples(arity: int) -> Callable[[object], bool]:
    def fits(value: object) -> bool:
        return isinstance(value, list) and all(
            isinstance(t, tuple) and len(t) == arity and all(isinstance(x, str) for x in t) for t in value)
    return fits


def _is_identifier(value: object) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _is_int_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in value)


def _provenance(fields: dict[str, object], locations: list[Location]) -> Provenance:
    loc_index = fields.get("loc")
    where = locations[loc_index] if isinstance(loc_index, int) else Location()
    fn = fields.get("fn")
    return Provenance(
        debug_handle=fields.get("debug_handle"),  # type: ignore[arg-type]  # an int
        ancestor=fields.get("ancestor"),  # type: ignore[arg-type]  # a str
        nn_module_stack=where.nn_module_stack,
        source_fn_stack=where.source_fn_stack,
        torch_fn=None if fn is None or where.torch_fn_type is None else (fn, where.torch_fn_type),  # type: ignore[arg-type]  # a str
        custom=where.custom,
    )


def parse_program(
    text: str,
    *,
    payloads: Payloads | None = None,
    missing_blob: Callable[[str, int], bytes] | None = None,
    node_lines: dict[tuple[str, str], int] | None = None,
) -> Program:
    """The Program `text` (as `format_program` prints it) describes.

    `payloads` maps SHA-256 (hex) to the bytes the text names by hash (see `payloads_of`);
    `missing_blob(sha256, nbytes)` makes a stand-in for a delegate blob `payloads` lacks (else
    that is an error); `node_lines`, if given, is filled with (graph path, node name) -> 1-based
    line number (paths as in `canonicalize_with_names`). Raises `ParseError` on bad text."""
    parser = _Parser(text, payloads or {}, missing_blob, node_lines)
    program = parser.program(0, "")
    parser.finish()
    return program


def parse_lowered_module(
    text: str,
    *,
    payloads: Payloads | None = None,
    missing_blob: Callable[[str, int], bytes] | None = None,
    node_lines: dict[tuple[str, str], int] | None = None,
) -> LoweredBackendModule:
    """The lowered backend module `text` (as `format_lowered_module` prints it) describes; the
    keywords are those of `parse_program` (its program's graph path is '')."""
    parser = _Parser(text, payloads or {}, missing_blob, node_lines)
    module = parser.lowered(2, "")
    parser.finish()
    return module
