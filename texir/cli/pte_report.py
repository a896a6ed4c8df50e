"""The report `texir inspect` prints for a `.pte` and a `.ptd`: a plain JSON-able dict, and the text
view rendered from it."""

from __future__ import annotations

import hashlib
from typing import Any

from texir.ir.blob import Blob
from texir.serialize.pte import schema as s
from texir.serialize.pte.check import check_indices
from texir.serialize.pte.codec import PteDecodeError, read_pte, to_logical
from texir.serialize.pte.ptd import loads_ptd

JsonDict = dict[str, Any]


def _sha(data: Blob | bytes) -> str:
    view = data.view() if isinstance(data, Blob) else data
    return hashlib.sha256(view).hexdigest()[:16]


def _describe_value(plan: s.ExecutionPlan, index: int) -> JsonDict:
    val = plan.values[index].val
    out: JsonDict = {"index": index, "kind": type(val).__name__}
    if isinstance(val, s.Tensor):
        out["dtype"] = val.scalar_type.name
        out["shape"] = list(val.sizes)
        if val.shape_dynamism != s.TensorShapeDynamism.STATIC:
            out["dynamism"] = val.shape_dynamism.name
        if list(val.dim_order) != list(range(len(val.sizes))):
            out["dim_order"] = list(val.dim_order)
        alloc = val.allocation_info
        if alloc is not None:
            out["storage"] = "planned"
            out["memory_id"] = alloc.memory_id
            out["offset"] = alloc.memory_offset
            if val.data_buffer_idx:
                out["initial_data"] = val.data_buffer_idx
        elif val.data_buffer_idx:
            out["storage"] = "constant"
            out["buffer"] = val.data_buffer_idx
        else:
            out["storage"] = "io"
        info = val.extra_tensor_info
        if info is not None and info.fully_qualified_name is not None:
            out["fqn"] = info.fully_qualified_name
    elif isinstance(val, s.Int):
        out["value"] = val.int_val
    elif isinstance(val, s.Bool):
        out["value"] = val.bool_val
    elif isinstance(val, s.Double):
        out["value"] = repr(val.double_val)
    elif isinstance(val, s.String):
        out["value"] = val.string_val
    elif isinstance(val, s.DoubleList):
        out["value"] = [repr(v) for v in val.items]
    elif isinstance(val, s.IntList | s.BoolList | s.TensorList | s.OptionalTensorList):
        out["value"] = list(val.items)
    return out


def _render_arg(plan: s.ExecutionPlan, index: int) -> str:
    if not 0 <= index < len(plan.values):
        return f"%{index}?"
    val = plan.values[index].val
    if isinstance(val, s.Null):
        return "None"
    if isinstance(val, s.Int):
        return str(val.int_val)
    if isinstance(val, s.Bool):
        return str(val.bool_val)
    if isinstance(val, s.Double):
        return repr(val.double_val)
    if isinstance(val, s.String):
        return repr(val.string_val)
    if isinstance(val, s.IntList):  # items are indices of Int values (never recurse into lists)
        return "[" + ", ".join(_render_int(plan, i) for i in val.items) + "]"
    if isinstance(val, s.DoubleList | s.BoolList):
        return "[" + ", ".join(repr(v) for v in val.items) + "]"
    if isinstance(val, s.TensorList | s.OptionalTensorList):
        return "[" + ", ".join("None" if i < 0 else f"%{i}" for i in val.items) + "]"
    return f"%{index}"


def _render_int(plan: s.ExecutionPlan, index: int) -> str:
    val = plan.values[index].val if 0 <= index < len(plan.values) else None
    return str(val.int_val) if isinstance(val, s.Int) else f"%{index}"


def _op_name(op: s.Operator) -> str:
    return f"{op.name}.{op.overload}" if op.overload else op.name


def _instruction(plan: s.ExecutionPlan, index: int, ins: s.Instruction) -> JsonDict:
    a = ins.instr_args
    if isinstance(a, s.KernelCall):
        op = _op_name(plan.operators[a.op_index]) if 0 <= a.op_index < len(plan.operators) else f"op#{a.op_index}?"
        text = f"{op}({', '.join(_render_arg(plan, i) for i in a.args)})"
        return {"index": index, "kind": "kernel", "op": op, "args": list(a.args), "text": text}
    if isinstance(a, s.DelegateCall):
        ok = 0 <= a.delegate_index < len(plan.delegates)
        ident = plan.delegates[a.delegate_index].id if ok else "?"
        text = f"delegate#{a.delegate_index} {ident}({', '.join(_render_arg(plan, i) for i in a.args)})"
        return {"index": index, "kind": "delegate", "delegate": a.delegate_index, "args": list(a.args), "text": text}
    if isinstance(a, s.MoveCall):
        return {"index": index, "kind": "move", "text": f"move %{a.move_from} -> %{a.move_to}"}
    if isinstance(a, s.JumpFalseCall):
        text = f"jump_false %{a.cond_value_index} -> [{a.destination_instruction}]"
        return {"index": index, "kind": "jump_false", "text": text}
    return {"index": index, "kind": "free", "text": f"free %{a.value_index}"}


def inspect_pte(data: bytes, *, brief: bool = False) -> JsonDict:
    """The report `texir inspect --json` prints (deterministic, JSON-serialisable)."""
    f = read_pte(data)
    # Index references are checked as the runtime checks them (and as `loads` does).
    check_indices(to_logical(f), PteDecodeError)
    p = f.program
    segments = f.segment_data

    def delegate_blob(ref: s.BackendDelegateDataReference) -> Blob | None:
        if ref.location == s.DataLocation.SEGMENT:
            return segments[ref.index] if ref.index < len(segments) else None
        return p.backend_delegate_data[ref.index].data if ref.index < len(p.backend_delegate_data) else None

    methods = []
    for plan in p.execution_plan:
        delegates = []
        for i, d in enumerate(plan.delegates):
            blob = delegate_blob(d.processed)
            delegates.append(
                {
                    "index": i,
                    "id": d.id,
                    "location": d.processed.location.name,
                    "data_index": d.processed.index,
                    "size": None if blob is None else blob.nbytes,
                    "sha256": None if blob is None else _sha(blob),
                    "compile_specs": [{"key": cs.key, "value": cs.value.hex()} for cs in d.compile_specs],
                }
            )
            if d.id == "XnnpackBackend" and blob is not None:
                # read (and checked) even with --brief: a damaged delegate fails `texir inspect`
                nodes = xnnpack_nodes(blob, f"method {plan.name!r} delegate {i} (XnnpackBackend)")
                if not brief:
                    delegates[-1]["xnnpack"] = nodes
        planned = sum(1 for v in plan.values if isinstance(v.val, s.Tensor) and v.val.allocation_info)
        constants = sum(
            1 for v in plan.values if isinstance(v.val, s.Tensor) and v.val.data_buffer_idx and not v.val.allocation_info
        )
        method: JsonDict = {
            "name": plan.name,
            "inputs": [_describe_value(plan, i) if 0 <= i < len(plan.values) else {"index": i} for i in plan.inputs],
            "outputs": [_describe_value(plan, i) if 0 <= i < len(plan.values) else {"index": i} for i in plan.outputs],
            "value_count": len(plan.values),
            "planned_tensors": planned,
            "constant_tensors": constants,
            "instruction_count": sum(len(c.instructions) for c in plan.chains),
            "operators": [_op_name(op) for op in plan.operators],
            "delegates": delegates,
            "non_const_buffer_sizes": list(plan.non_const_buffer_sizes),
        }
        if not brief:
            method["values"] = [_describe_value(plan, i) for i in range(len(plan.values))]
            method["instructions"] = [
                _instruction(plan, i, ins) for c in plan.chains for i, ins in enumerate(c.instructions)
            ]
        methods.append(method)
    return {
        "file": {"size": f.file_size, "identifier": "ET12", "version": p.version},
        "header": None
        if f.header is None
        else {
            "length": f.header.header_length,
            "program_size": f.header.program_size,
            "segment_base_offset": f.header.segment_base_offset,
            "segment_data_size": f.header.segment_data_size,
        },
        "methods": methods,
        "constants": _constants(p),
        "named_data": [{"key": nd.key, "segment": nd.segment_index} for nd in p.named_data or ()],
        "sizes": _sizes(f),
    }


def xnnpack_nodes(blob: Blob, where: str) -> list[str]:
    """An XNNPACK delegate's values, nodes and constants, one line each (texir.backends.xnnpack);
    a blob that does not decode to a sound graph raises XnnpackBlobError naming `where`."""
    # the XNNPACK backend loads in a few tenths of a second: only a .pte with an XNNPACK delegate pays
    from texir.backends.xnnpack.inspect import format_graph
    from texir.backends.xnnpack.reader import XnnpackBlobError, decode_blob

    try:
        graph = decode_blob(blob.tobytes())
    except XnnpackBlobError as exc:
        raise XnnpackBlobError(f"{where}: {exc}; the runtime cannot load it: lower the model again") from exc
    return format_graph(graph).splitlines()


def check_xnnpack_delegates(pte: s.PteProgram) -> None:
    """Decode and check every XNNPACK delegate of a logical program (what `texir show` reads)."""
    p = pte.program
    for plan in p.execution_plan:
        for i, d in enumerate(plan.delegates):
            ref = d.processed
            inline = ref.location == s.DataLocation.INLINE and 0 <= ref.index < len(p.backend_delegate_data)
            if d.id == "XnnpackBackend" and inline:
                where = f"method {plan.name!r} delegate {i} (XnnpackBackend)"
                xnnpack_nodes(p.backend_delegate_data[ref.index].data, where)


def _constants(p: s.Program) -> JsonDict:
    cs = p.constant_segment
    if cs is not None and cs.offsets:
        return {"location": "segment", "segment": cs.segment_index, "entries": len(cs.offsets) - 1}
    return {"location": "inline", "entries": max(0, len(p.constant_buffer) - 1)}


def _sizes(f: s.PteFile) -> JsonDict:
    p = f.program
    kinds: dict[int, str] = {}
    if p.constant_segment is not None and p.constant_segment.offsets:
        kinds[p.constant_segment.segment_index] = "constants"
    for ms in p.mutable_data_segments or ():
        kinds.setdefault(ms.segment_index, "mutable_data")
    for plan in p.execution_plan:
        for d in plan.delegates:
            if d.processed.location == s.DataLocation.SEGMENT:
                kinds.setdefault(d.processed.index, f"delegate {d.id}")
    for nd in p.named_data or ():
        kinds.setdefault(nd.segment_index, f"named_data {nd.key}")
    header = f.header
    header_len = header.header_length if header is not None else 0
    base = header.segment_base_offset if header is not None else f.flatbuffer_size
    segs = []
    end = 0
    between = 0
    for i, seg in enumerate(p.segments):
        pad = seg.offset - end if seg.size and seg.offset >= end else 0
        between += pad
        segs.append({"index": i, "kind": kinds.get(i, "unreferenced"), "offset": seg.offset, "size": seg.size,
                     "padding_before": pad})
        end = max(end, seg.offset + seg.size)
    data_size = header.segment_data_size if header is not None else 0
    inline_constants = sum(b.storage.nbytes for b in p.constant_buffer)
    inline_delegates = sum(d.data.nbytes for d in p.backend_delegate_data)
    return {
        "total": f.file_size,
        "flatbuffer": f.flatbuffer_size - header_len,
        "flatbuffer_inline_delegate_data": inline_delegates,
        "flatbuffer_inline_constants": inline_constants,
        "extended_header": header_len,
        "padding_before_segments": (base - f.flatbuffer_size) if data_size else 0,
        "segments": segs,
        "padding_between_segments": between,
        "trailing": f.file_size - (base + data_size) if data_size else f.file_size - f.flatbuffer_size,
    }


def _fmt_value(v: JsonDict) -> str:
    kind = v["kind"]
    if kind == "Tensor":
        shape = ", ".join(str(d) for d in v["shape"])  # spelled as `texir show` and `texir diff` do
        where = v["storage"]
        if where == "planned":
            where = f"planned mem{v['memory_id']}@{v['offset']}"
        elif where == "constant":
            where = f"constant #{v['buffer']}"
        extra = f" {v['dynamism']}" if "dynamism" in v else ""
        return f"Tensor {str(v['dtype']).lower()}[{shape}]{extra} {where}"
    if "value" in v:
        return f"{kind} {v['value']}"
    return str(kind)


def format_report(r: JsonDict) -> str:
    """The text view of `inspect_pte`'s report."""
    lines: list[str] = []
    h = r["header"]
    lines.append(f"file: {r['file']['size']} bytes, ET12, version {r['file']['version']}")
    if h is None:
        lines.append("header: none (no segment data)")
    else:
        lines.append(
            f"header: eh00 len={h['length']} program_size={h['program_size']} "
            f"segment_base_offset={h['segment_base_offset']} segment_data_size={h['segment_data_size']}"
        )
    for m in r["methods"]:
        lines.append("")
        lines.append(f"method {m['name']!r}: {m['value_count']} values ({m['planned_tensors']} planned, "
                     f"{m['constant_tensors']} constant tensors), {m['instruction_count']} instructions")
        lines.append("  inputs:  " + "; ".join(f"%{v['index']} {_fmt_value(v)}" for v in m["inputs"] if "kind" in v))
        lines.append("  outputs: " + "; ".join(f"%{v['index']} {_fmt_value(v)}" for v in m["outputs"] if "kind" in v))
        lines.append(f"  non_const_buffer_sizes: {m['non_const_buffer_sizes']}")
        lines.append(f"  operators ({len(m['operators'])}):")
        lines.extend(f"    [{i}] {op}" for i, op in enumerate(m["operators"]))
        lines.append(f"  delegates ({len(m['delegates'])}):")
        for d in m["delegates"]:
            specs = ", ".join(f"{c['key']}=0x{c['value']}" for c in d["compile_specs"]) or "-"
            lines.append(f"    [{d['index']}] {d['id']} {d['location']}#{d['data_index']} "
                         f"{d['size']} bytes sha256:{d['sha256']} compile_specs: {specs}")
            lines.extend(f"        {line}" for line in d.get("xnnpack", ()))
        if "values" in m:
            lines.append("  values:")
            lines.extend(f"    %{v['index']} {_fmt_value(v)}" for v in m["values"])
            lines.append("  instructions:")
            lines.extend(f"    [{i['index']}] {i['text']}" for i in m["instructions"])
    c = r["constants"]
    lines.append("")
    where = f"segment {c['segment']}" if "segment" in c else "the flatbuffer (constant_buffer)"
    lines.append(f"constants: {c['entries']} in {where}")
    if "external_check" in r:
        c = r["external_check"]
        lines.append(f"external data: {c['tensors']} EXTERNAL tensors found, same layout, in " + ", ".join(c["files"])
                     + " (delegates' named data is the backend's to check at load)")
    if r["named_data"]:
        lines.append("named data: " + ", ".join(f"{n['key']}->segment {n['segment']}" for n in r["named_data"]))
    z = r["sizes"]
    lines.append("sizes:")
    lines.append(f"  flatbuffer        {z['flatbuffer']:>12}  (inline delegate data {z['flatbuffer_inline_delegate_data']}, "
                 f"inline constants {z['flatbuffer_inline_constants']})")
    lines.append(f"  extended header   {z['extended_header']:>12}")
    lines.append(f"  padding           {z['padding_before_segments']:>12}  (before segments)")
    for seg in z["segments"]:
        lines.append(f"  segment {seg['index']:<9} {seg['size']:>12}  {seg['kind']} @+{seg['offset']}")
    lines.append(f"  padding           {z['padding_between_segments']:>12}  (between segments)")
    if z["trailing"]:
        lines.append(f"  trailing          {z['trailing']:>12}")
    lines.append(f"  total             {z['total']:>12}")
    return "\n".join(lines) + "\n"


__all__ = ["check_xnnpack_delegates", "format_report", "inspect_pte", "register", "run", "xnnpack_nodes"]


def inspect_ptd(data: bytes) -> JsonDict:
    """The report of a `.ptd` file: its entries (key, bytes, digest, tensor layout) in file order."""
    ptd = loads_ptd(data)
    entries = []
    for e in ptd.entries:
        item: JsonDict = {"key": e.key, "nbytes": e.data.nbytes, "sha256": e.data.digest()[:16]}
        if e.layout is not None:
            item["layout"] = {"scalar_type": e.layout.scalar_type.name, "sizes": list(e.layout.sizes),
                              "dim_order": list(e.layout.dim_order)}
        entries.append(item)
    return {"file": {"size": len(data), "kind": "ptd"}, "entries": entries}


def format_ptd_report(r: JsonDict) -> str:
    lines = [f"file: {r['file']['size']} bytes, FT01 (.ptd), {len(r['entries'])} entries"]
    for e in r["entries"]:
        layout = e.get("layout")
        shape = f" {layout['scalar_type']}{layout['sizes']} dim_order {layout['dim_order']}" if layout else ""
        lines.append(f"  {e['key']}: {e['nbytes']} bytes sha256:{e['sha256']}{shape}")
    return "\n".join(lines) + "\n"
