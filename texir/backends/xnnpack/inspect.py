"""A delegate blob's XNNPACK graph as text (for `texir inspect` and debugging)."""

from __future__ import annotations

from texir.backends.xnnpack import schema as s
from texir.backends.xnnpack.reader import decode_blob

__all__ = ["format_blob", "format_graph"]

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
