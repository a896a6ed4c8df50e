"""A delegate blob's XNNPACK graph as text (for `texir inspect` and debugging), and the backend's
working graph (`XGraph`, between its passes) as text."""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from texir.backends.xnnpack import schema as s
from texir.backends.xnnpack.graph import XGraph, WorkNode
from texir.backends.xnnpack.reader import decode_blob
from texir.ir import DType
from texir.ir.printer import format_arg, format_dtype, format_meta

__all__ = ["format_blob", "format_graph", "format_xgraph"]

_DTYPES = {
    s.XNNDatatype.xnn_datatype_fp32: "f32", s.XNNDatatype.xnn_datatype_fp16: "f16",
    s.XNNDatatype.xnn_datatype_bf16: "bf16",
}


def _value(v: s.XValue) -> str:
    u = v.xvalue_union
    quant = ""
    if isinstance(u, s.XNNQuantizedTensorValue):
        quant = f" quant={type(u.quant_params).__name__}"
        u = u.tensor_value
    if not isinstance(u, s.XNNTensorValue):
        return "?"
    dtype = _DTYPES.get(u.datatype, u.datatype.name.removeprefix("xnn_datatype_"))
    where = {1: f" input ext={u.external_id}", 2: f" output ext={u.external_id}"}.get(u.flags, "")
    const = f" const={u.constant_buffer_idx}" if u.constant_buffer_idx else ""
    return f"%{u.id_out}: {dtype}[{', '.join(map(str, u.dims))}]{where}{const}{quant}"


def _id(value: int) -> str:
    return "none" if value == s.INVALID_ID else f"%{value}"


def _node(n: s.XNode) -> str:
    u = n.xnode_union
    name = type(u).__name__.removeprefix("XNN") if u is not None else "?"
    # Ids are always shown (0 is a value); other fields only when set.
    fields = [] if u is None else [
        f"{k}={_id(getattr(u, k)) if k.endswith('_id') else getattr(u, k)}" for k in u.__struct_fields__
        if k.endswith("_id") or getattr(u, k) not in (0, ())
    ]
    bounds = ""
    if n.output_min_max is not None:
        bounds = f" clamp=({n.output_min_max.output_min:g}, {n.output_min_max.output_max:g})"
    return f"{name}({', '.join(fields)}){bounds}  # dh={n.debug_handle}"


def format_graph(graph: s.XNNGraph) -> str:
    """Values, then nodes in execution order, then the constants' named-data keys."""
    lines = [f"XNNGraph version={graph.version} externs={graph.num_externs} "
             f"inputs={list(graph.input_ids)} outputs={list(graph.output_ids)}"]
    lines += [f"  {_value(v)}" for v in graph.xvalues]
    lines += [f"  {_node(n)}" for n in graph.xnodes]
    lines += [f"  const {i}: {c.size} bytes key={c.named_key}" for i, c in enumerate(graph.constant_data) if i]
    return "\n".join(lines)


def format_blob(blob: bytes) -> str:
    return format_graph(decode_blob(blob))


def _xarg(a: Any) -> str:
    if isinstance(a, WorkNode):
        return f"%{a.name}"
    if isinstance(a, (list, tuple)):
        return f"[{', '.join(_xarg(x) for x in a)}]"
    if isinstance(a, DType):
        return format_dtype(a)
    if isinstance(a, msgspec.Struct):  # an IR argument the working graph keeps as it is (layout, device)
        return format_arg(a)  # type: ignore[arg-type]  # every Struct reaching here is an IR Argument
    return repr(a)


def _xnode(n: WorkNode) -> str:
    if n.target == "placeholder":
        text = f"%{n.name} : {format_meta(n.meta)} = placeholder"
        if n.const is not None:
            c = n.const
            # a transformed constant is named by its array's digest, an unchanged one by the IR's
            digest = c.sha256 if c.array is None else hashlib.sha256(c.numpy().tobytes()).hexdigest()
            text += f" const {format_dtype(c.dtype)}{list(c.shape)} sha256={digest[:16]}"
            text += " (transformed)" if c.array is not None else ""
    elif n.target == "output":
        return f"return {_xarg(n.args[0])}"
    else:
        args = [_xarg(a) for a in n.args] + [f"{k}={_xarg(v)}" for k, v in n.kwargs.items()]
        text = f"%{n.name} : {format_meta(n.meta)} = {n.target}({', '.join(args)})"
    notes = []
    if n.nhwc is not None:
        notes.append("nhwc" if n.nhwc else "nchw")
    if n.min_max is not None:
        notes.append(f"clamp=({n.min_max[0]!r}, {n.min_max[1]!r})")
    if n.partner is not None:
        notes.append(f"partner=%{n.partner.name}")
    if n.implicit:
        notes.append("implicit")
    if n.handle is not None:
        notes.append(f"dh={n.handle}")
    return text + (f"  # {' '.join(notes)}" if notes else "")


def format_xgraph(g: XGraph) -> str:
    """The working graph, one node a line in graph order: each node's meta, target and arguments
    (other nodes as %name), a constant's dtype, shape and digest (its array's once a pass transformed
    it), and the tags passes set (layout, fused clamp, q/dq partner, implicit q/dq, debug handle)."""
    return "\n".join(_xnode(n) for n in g.nodes)
