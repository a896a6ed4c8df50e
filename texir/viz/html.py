"""`write_html(obj, path)`: one self-contained HTML page drawing a program's graph.

The layout is computed here, in O(nodes + edges): longest-path layering over the (already
topological) node order, then one barycenter pass ordering each layer by its predecessors' mean
position. The page (inline CSS and JS from `texir/viz/static`, no network at view time) draws on
a canvas, only what is in view, with zoom, pan, search, hover and click details, so it stays usable
at tens of thousands of nodes. Partitions (lowered modules, .pte delegates) get one colour per tag;
inputs and outputs are coloured by kind. Each lowered module's graph is a page of its own, reachable
from its delegate call.
"""

from __future__ import annotations

import html as html_lib
import json
import os
from importlib import resources
from typing import Any

import msgspec

from texir._io import atomic_write
from texir.errors import TexirError
from texir.ir.analysis import iter_refs, node_inputs
from texir.ir.names import CALL_DELEGATE, GETITEM
from texir.ir.printer import format_arg, format_input_spec, format_meta, format_output_spec
from texir.ir.types import (
    BufferInput,
    BufferMutation,
    CallFunction,
    ConstantTensorInput,
    GetAttr,
    Graph,
    LoweredBackendModule,
    Output,
    ParameterInput,
    Placeholder,
    Program,
    Ref,
    UserInput,
    UserOutput,
)
from texir.serialize.pte import schema as s
from texir.viz.pte_view import _instruction, _operator, _value

__all__ = ["HtmlStats", "KINDS", "PALETTE", "build_model", "layout", "partition_color", "render_html", "write_html"]

# Kind index -> (name, colour). The page's legend and colours come from this table.
KINDS: tuple[tuple[str, str], ...] = (
    ("user input", "#4caf50"),
    ("parameter", "#ff9800"),
    ("buffer", "#9c27b0"),
    ("constant", "#8d6e63"),
    ("other input", "#9e9e9e"),
    ("op", "#dfe6ee"),
    ("delegate call", "#263238"),
    ("get_attr", "#b0bec5"),
    ("getitem", "#eceff1"),
    ("user output", "#1e88e5"),
    ("buffer mutation", "#e53935"),
    ("other output", "#607d8b"),
)
_K = {name: i for i, (name, _) in enumerate(KINDS)}

PALETTE: tuple[str, ...] = (
    "#66c2a5", "#fc8d62", "#8da0cb", "#e78ac3", "#a6d854", "#ffd92f", "#e5c494", "#b3b3b3",
    "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#80b1d3",
)



def partition_color(index: int) -> str:
    """A colour per partition that stays distinct past the palette: the palette first, then hues
    a golden angle apart at alternating lightness (no two partitions share a colour)."""
    if index < len(PALETTE):
        return PALETTE[index]
    k = index - len(PALETTE)
    hue = (k * 137.508) % 360
    light = (42, 58, 72)[k % 3]
    return f"hsl({hue:.1f}, 70%, {light}%)"


NODE_W, NODE_H, DX, DY = 150, 28, 175, 64


class HtmlStats(msgspec.Struct, frozen=True):
    graphs: int
    nodes: int
    """Nodes of the main graph, as drawn (output specs count one each)."""
    edges: int
    partitions: int
    bytes: int


def layout(count: int, preds: list[list[int]]) -> tuple[list[int], list[int]]:
    """(layer, x) per node. `preds[i]` holds indices < i (the node order is topological)."""
    layer = [0] * count
    for i in range(count):
        best = -1
        for p in preds[i]:
            if layer[p] > best:
                best = layer[p]
        layer[i] = best + 1
    # Sources (placeholders, get_attr) sit just above their first user instead of all on top,
    # which keeps a delegate's get_attr beside its call.
    first_use = [count] * count
    for i in range(count):
        for p in preds[i]:
            if layer[i] < first_use[p]:
                first_use[p] = layer[i]
    for i in range(count):
        if not preds[i] and first_use[i] < count:
            layer[i] = max(0, first_use[i] - 1)
    rows: dict[int, list[int]] = {}
    for i in range(count):
        rows.setdefault(layer[i], []).append(i)
    pos = [0.0] * count
    xs = [0] * count
    for depth in sorted(rows):
        row = rows[depth]
        keys = []
        for i in row:
            ps = preds[i]
            keys.append((sum(pos[p] for p in ps) / len(ps) if ps else float(i), i))
        keys.sort()
        half = (len(keys) - 1) / 2
        for order, (_, i) in enumerate(keys):
            pos[i] = float(order)
            xs[i] = int((order - half) * DX)
    return layer, xs


class _GraphBuilder:
    def __init__(self, name: str) -> None:
        self.name = name
        self.labels: list[str] = []
        self.kinds: list[int] = []
        self.parts: list[int] = []
        self.details: list[str] = []
        self.links: list[int] = []
        self.preds: list[list[int]] = []

    def add(self, label: str, kind: str, detail: str, preds: list[int], part: int = -1,
            link: int = -1) -> int:
        self.labels.append(label)
        self.kinds.append(_K[kind])
        self.parts.append(part)
        self.details.append(detail)
        self.links.append(link)
        self.preds.append(sorted(set(p for p in preds if p >= 0)))
        return len(self.labels) - 1

    def finish(self, tag: int = -1) -> dict[str, Any]:
        layer, xs = layout(len(self.labels), self.preds)
        nodes = [
            [self.labels[i], self.kinds[i], self.parts[i], xs[i], layer[i], self.links[i]]
            for i in range(len(self.labels))
        ]
        edges: list[int] = []
        for i, ps in enumerate(self.preds):
            for p in ps:
                edges.extend((p, i))
        return {"name": self.name, "part": tag, "n": nodes, "e": edges, "d": self.details}


def _short(target: str) -> str:
    op = target.split("::", 1)[-1]
    return op.removesuffix(".default")


def _detail(*rows: tuple[str, str | None]) -> str:
    return "\n".join(f"{k}: {v}" for k, v in rows if v)


class _ProgramModel:
    """Turns a Program (and its lowered modules, nested graphs) into page graphs."""

    def __init__(self) -> None:
        self.graphs: list[dict[str, Any]] = []
        self.partitions: list[dict[str, Any]] = []
        self._part_of_module: dict[str, int] = {}

    def add_program(self, program: Program, title: str) -> int:
        index = len(self.graphs)
        self.graphs.append({})
        # Partitions first, so delegate calls link to their graph pages.
        module_pages: dict[str, int] = {}
        for named in program.lowered_modules:
            tag = len(self.partitions)
            self._part_of_module[f"{index}:{named.name}"] = tag
            self.partitions.append({
                "tag": named.name, "backend": named.module.backend_id,
                "color": partition_color(tag), "nodes": 0,
                "bytes": len(named.module.processed_bytes),
            })
        for named in program.lowered_modules:
            tag = self._part_of_module[f"{index}:{named.name}"]
            module_pages[named.name] = self._add_lowered(named.name, named.module, tag, title)
        self.graphs[index] = self._graph(program.graph, program, title, module_pages, index, -1)
        return index

    def _add_lowered(self, name: str, module: LoweredBackendModule, tag: int, title: str) -> int:
        index = len(self.graphs)
        self.graphs.append({})
        inner = module.original_program
        page = self._graph(inner.graph, inner, f"{title} > {name} ({module.backend_id})", {},
                           index, tag)
        self.partitions[tag]["nodes"] = sum(1 for n in inner.graph.nodes if isinstance(n, CallFunction))
        self.partitions[tag]["graph"] = index
        self.graphs[index] = page
        return index

    def _graph(self, graph: Graph, program: Program | None, title: str,
               module_pages: dict[str, int], index: int, tag: int) -> dict[str, Any]:
        b = _GraphBuilder(title)
        ids: dict[str, int] = {}
        roles: dict[str, tuple[str, str]] = {}
        if program is not None and graph is program.graph:
            for spec in program.signature.inputs:
                if isinstance(spec, UserInput):
                    if isinstance(spec.arg, Ref):
                        roles[spec.arg.name] = ("user input", "user_input")
                elif isinstance(spec, ParameterInput):
                    roles[spec.name] = ("parameter", f"parameter {spec.target}")
                elif isinstance(spec, BufferInput):
                    roles[spec.name] = ("buffer", f"buffer {spec.target}"
                                        + ("" if spec.persistent else " (non-persistent)"))
                elif isinstance(spec, ConstantTensorInput):
                    roles[spec.name] = ("constant", f"constant {spec.target}")
                else:
                    roles[spec.name] = ("other input", format_input_spec(spec))
        subpages: dict[str, int] = {}
        for sub in graph.subgraphs:
            sub_index = len(self.graphs)
            self.graphs.append({})
            self.graphs[sub_index] = self._graph(sub.graph, None, f"{title} > {sub.name}", {},
                                                 sub_index, tag)
            subpages[sub.name] = sub_index
        delegate_of: dict[str, int] = {}  # value name -> partition tag (calls and their getitems)
        for node, node_meta, prov in graph.entries():
            if isinstance(node, Output):
                self._outputs(b, node, program if program is not None and graph is program.graph
                              else None, ids)
                continue
            preds = [ids.get(n, -1) for n in node_inputs(node)]
            meta = format_meta(node_meta)
            dh = prov.debug_handle if prov is not None else None
            if isinstance(node, Placeholder):
                kind, role = roles.get(node.name, ("user input" if tag < 0 else "other input", "placeholder"))
                ids[node.name] = b.add(node.name, kind, _detail(
                    ("name", node.name), ("input", role), ("meta", meta)), preds, tag)
            elif isinstance(node, GetAttr):
                part = self._part_of_module.get(f"{index}:{node.target}", tag)
                link = module_pages.get(node.target, subpages.get(node.target, -1))
                if part != tag:
                    delegate_of[node.name] = part
                ids[node.name] = b.add(node.target, "get_attr", _detail(
                    ("name", node.name), ("get_attr", node.target), ("meta", meta)), preds, part, link)
            elif isinstance(node, CallFunction):
                args = ", ".join([format_arg(a) for a in node.args]
                                 + [f"{k}={format_arg(v)}" for k, v in node.kwargs])
                part, link, kind = tag, -1, "op"
                if node.target == CALL_DELEGATE:
                    kind = "delegate call"
                    first = node.args[0] if node.args else None
                    if isinstance(first, Ref) and first.name in delegate_of:
                        part = delegate_of[first.name]
                        link = self.partitions[part].get("graph", -1)
                    delegate_of[node.name] = part
                elif node.target == GETITEM:
                    kind = "getitem"
                    first = node.args[0] if node.args else None
                    if isinstance(first, Ref) and first.name in delegate_of:
                        part = delegate_of[first.name]
                stack = ""
                if prov is not None and prov.nn_module_stack:
                    frame = prov.nn_module_stack[-1]
                    stack = f"{frame.path} ({frame.type})"
                partition = None
                if part >= 0:
                    info = self.partitions[part]
                    partition = f"{info['tag']} (backend {info['backend']})"
                ids[node.name] = b.add(_short(node.target), kind, _detail(
                    ("name", node.name), ("op", node.target), ("args", args), ("meta", meta),
                    ("debug handle", None if dh is None else str(dh)), ("partition", partition),
                    ("module", stack or None)), preds, part, link)
        return b.finish(tag)

    def _outputs(self, b: _GraphBuilder, node: Output, program: Program | None,
                 ids: dict[str, int]) -> None:
        specs = program.signature.outputs if program is not None else ()
        for i, arg in enumerate(node.args):
            spec = specs[i] if i < len(specs) else None
            if spec is None or isinstance(spec, UserOutput):
                kind, role = "user output", "user_output"
            elif isinstance(spec, BufferMutation):
                kind, role = "buffer mutation", f"buffer_mutation {spec.target}"
            else:
                kind, role = "other output", format_output_spec(spec)
            preds = [ids.get(n, -1) for n in _refs(arg)]
            b.add(f"out[{i}]", kind, _detail(("output", f"[{i}] {role}"),
                                              ("value", format_arg(arg))), preds)


def _refs(arg: Any) -> list[str]:
    return list(iter_refs(arg))


def _pte_model(pte: Any) -> dict[str, Any]:
    """Page graphs of a PteProgram: one per method; instructions as nodes, values as edges."""
    program = pte.program
    graphs: list[dict[str, Any]] = []
    partitions: list[dict[str, Any]] = []
    for plan in program.execution_plan:
        b = _GraphBuilder(f"method {plan.name}")
        writer: dict[int, int] = {}
        part_base = len(partitions)
        for i, d in enumerate(plan.delegates):
            # A .pte holds the backend's blob, not the delegated nodes: the label counts calls.
            partitions.append({"tag": f"{plan.name}:delegate#{i}", "backend": d.id,
                               "color": partition_color(part_base + i), "calls": 0})
        for k, v in enumerate(plan.inputs):
            writer[v] = b.add(f"in[{k}]", "user input", _detail(
                ("input", f"[{k}] value %{v}"), ("value", _value(plan.values[v], program))), [])
        for chain in plan.chains:
            for ins in chain.instructions:
                arg = ins.instr_args
                args: tuple[int, ...] = getattr(arg, "args", ())
                preds = [writer[a] for a in args if a in writer]
                text = _instruction(ins, plan)
                if isinstance(arg, s.DelegateCall):
                    part = part_base + arg.delegate_index
                    if 0 <= part - part_base < len(plan.delegates):
                        partitions[part]["calls"] += 1
                    node = b.add(plan.delegates[arg.delegate_index].id if 0 <= arg.delegate_index < len(plan.delegates) else "delegate",
                                 "delegate call", _detail(("instruction", text)), preds, part)
                elif isinstance(arg, s.KernelCall):
                    ops = plan.operators
                    label = _operator(ops[arg.op_index]) if 0 <= arg.op_index < len(ops) else "?"
                    node = b.add(label.split("::")[-1], "op", _detail(("instruction", text)), preds)
                else:
                    node = b.add(text.split(" ")[0], "op", _detail(("instruction", text)), preds)
                # An argument not yet written (and not a constant) is an output of this call.
                for a in args:
                    if a in writer or not 0 <= a < len(plan.values):
                        continue
                    val = plan.values[a].val
                    if isinstance(val, s.Tensor) and val.data_buffer_idx == 0:
                        writer[a] = node
                    elif isinstance(val, (s.TensorList, s.OptionalTensorList)):
                        writer[a] = node
                        for item in val.items:
                            writer.setdefault(item, node)
                if isinstance(arg, s.MoveCall) and arg.move_from in writer:
                    writer[arg.move_to] = node
        for k, v in enumerate(plan.outputs):
            b.add(f"out[{k}]", "user output", _detail(("output", f"[{k}] value %{v}")),
                  [writer[v]] if v in writer else [])
        graphs.append(b.finish())
    return {"graphs": graphs, "partitions": partitions}


def build_model(obj: Any, *, title: str = "program") -> dict[str, Any]:
    """The page's data: graphs (nodes, edges, details, layout), partitions, kinds."""
    if isinstance(obj, Program):
        model = _ProgramModel()
        model.add_program(obj, title)
        data: dict[str, Any] = {"graphs": model.graphs, "partitions": model.partitions}
    elif isinstance(obj, LoweredBackendModule):
        wrapper = _ProgramModel()
        wrapper.partitions.append({"tag": title, "backend": obj.backend_id, "color": PALETTE[0],
                                   "nodes": 0, "bytes": len(obj.processed_bytes)})
        wrapper._add_lowered(title, obj, 0, title)
        data = {"graphs": wrapper.graphs, "partitions": wrapper.partitions}
    elif type(obj).__name__ == "PteProgram":
        data = _pte_model(obj)
    else:
        raise TexirError(
            f"cannot draw a {type(obj).__name__}: pass a Program, LoweredBackendModule or PteProgram"
        )
    data["title"] = title
    data["kinds"] = [{"name": n, "color": c} for n, c in KINDS]
    data["geometry"] = {"w": NODE_W, "h": NODE_H, "dy": DY}
    return data


def _asset(name: str) -> str:
    return resources.files("texir.viz").joinpath("static", name).read_text(encoding="utf-8")


def _render(obj: Any, title: str) -> tuple[str, dict[str, Any]]:
    data = build_model(obj, title=title)
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=True)
    # Inside <script>, "</" could close the element early; "<\\/" is the same JSON string.
    payload = payload.replace("</", "<\\/")
    page = _asset("viewer.html")
    text = (
        page.replace("{{TITLE}}", html_lib.escape(f"texir: {title}"))
        .replace("/*{{CSS}}*/", _asset("viewer.css"))
        .replace("/*{{JS}}*/", _asset("viewer.js"))
        .replace("{{DATA}}", payload)
    )
    return text, data


def render_html(obj: Any, *, title: str = "program") -> str:
    """The page as a string (see the module docstring)."""
    return _render(obj, title)[0]


def write_html(obj: Any, path: str | os.PathLike[str], *, title: str | None = None) -> HtmlStats:
    """Write the page to `path` atomically (temp file + rename: never a partial file)."""
    text, model = _render(obj, title or os.path.basename(os.fspath(path)))
    data = text.encode("utf-8")
    atomic_write(path, [data])
    main = model["graphs"][0] if model["graphs"] else {"n": [], "e": []}
    return HtmlStats(graphs=len(model["graphs"]), nodes=len(main["n"]), edges=len(main["e"]) // 2,
                     partitions=len(model["partitions"]), bytes=len(data))
