"""`format_program(program) -> str`: the one stable, readable text form of the IR.

Every line depends only on the IR's content (no ids, addresses or hash order), so goldens are stable.
The text is complete: `texir.ir.parser.parse_program` reads it back, and
``parse_program(format_program(p), payloads=payloads_of(p)) == canonicalize(p)``. Two things are not
spelled out: stack traces (machine paths; `canonicalize` drops them too) and payload bytes (tensor
data, named data, delegate blobs), which appear as their size and full SHA-256 and come back from
the `payloads` map. Node lines stay short: provenance beyond the debug handle goes in a
``provenance:`` block after each graph's nodes, its shared parts as a numbered location table.
"""

from __future__ import annotations

import hashlib

from texir.ir.types import (
    DTYPE_ITEMSIZE,
    Argument,
    BoolArg,
    BufferInput,
    BufferMutation,
    CallFunction,
    ConstantTensorInput,
    CustomObjInput,
    CustomObjMeta,
    DelegateMeta,
    DeviceArg,
    DType,
    DTypeArg,
    FloatArg,
    GetAttr,
    GradientToParameter,
    GradientToUserInput,
    Graph,
    InputSpec,
    IntArg,
    LayoutArg,
    ListArg,
    LossOutput,
    Location,
    LoweredBackendModule,
    MemoryFormatArg,
    ModuleCallEntry,
    NoneArg,
    NoneMeta,
    Node,
    Output,
    OutputSpec,
    ParameterInput,
    Placeholder,
    Program,
    Provenance,
    Ref,
    ScalarMeta,
    StrArg,
    SubgraphMeta,
    SymBoolMeta,
    SymExprArg,
    SymFloatMeta,
    SymIntMeta,
    TensorMeta,
    TokenInput,
    TokenMeta,
    TokenOutput,
    TupleArg,
    TupleMeta,
    UserInput,
    UserInputMutation,
    UserOutput,
    ValueMeta,
)

_DTYPE_SHORT: dict[DType, str] = {
    DType.bool: "b8", DType.uint8: "u8", DType.int8: "i8", DType.int16: "i16", DType.int32: "i32",
    DType.int64: "i64", DType.uint16: "u16", DType.uint32: "u32", DType.uint64: "u64",
    DType.float16: "f16", DType.bfloat16: "bf16", DType.float32: "f32", DType.float64: "f64",
    DType.complex64: "c64", DType.complex128: "c128",
}
SHORT_DTYPES: dict[str, DType] = {v: k for k, v in _DTYPE_SHORT.items()}


def format_dtype(dtype: DType) -> str:
    return _DTYPE_SHORT.get(dtype, dtype.value)


def contiguous_strides(shape: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """The strides a contiguous tensor of `shape` has (torch's rule: a size below 1 counts as 1);
    a symbolic factor is spelled ``a*b``. The printer shows strides only when they differ."""
    strides: list[int | str] = []
    acc: int | str = 1
    for size in reversed(shape):
        strides.append(acc)
        if isinstance(size, int) and isinstance(acc, int):
            acc = acc * max(size, 1)
        elif acc == 1:
            acc = str(size)
        elif size != 1:
            acc = f"{acc}*{size}"
    return tuple(reversed(strides))


def tensor_nbytes(meta: TensorMeta) -> int | None:
    """numel * itemsize for a concrete shape, else None."""
    numel = 1
    for size in meta.shape:
        if not isinstance(size, int):
            return None
        numel *= size
    return numel * DTYPE_ITEMSIZE[meta.dtype]


def format_meta(meta: ValueMeta | None) -> str:
    if meta is None:
        return "?"
    if isinstance(meta, TensorMeta):
        text = f"{format_dtype(meta.dtype)}[{', '.join(str(d) for d in meta.shape)}]"
        extras = []
        if meta.strides != contiguous_strides(meta.shape):
            extras.append(f"strides=({', '.join(str(s) for s in meta.strides)})")
        if meta.storage_offset != 0:
            extras.append(f"offset={meta.storage_offset}")
        if meta.layout.value != "strided":
            extras.append(f"layout={meta.layout.value}")
        if meta.device != "cpu":
            extras.append(f"device={meta.device}")
        if meta.requires_grad:
            extras.append("grad")
        return text + (f"{{{', '.join(extras)}}}" if extras else "")
    if isinstance(meta, SymIntMeta):
        return f"SymInt({meta.expr})"
    if isinstance(meta, SymFloatMeta):
        return f"SymFloat({meta.expr})"
    if isinstance(meta, SymBoolMeta):
        return f"SymBool({meta.expr})"
    if isinstance(meta, ScalarMeta):
        return f"scalar({meta.value!r})"
    if isinstance(meta, TupleMeta):
        inner = ", ".join(format_meta(m) for m in meta.items)
        return f"[{inner}]" if meta.is_list else f"({inner}{',' if len(meta.items) == 1 else ''})"
    if isinstance(meta, NoneMeta):
        return "None"
    if isinstance(meta, CustomObjMeta):
        return f"obj<{meta.class_fqn}>"
    if isinstance(meta, TokenMeta):
        return "token"
    if isinstance(meta, SubgraphMeta):
        return f"graph<{meta.graph}>"
    if isinstance(meta, DelegateMeta):
        return f"delegate<{meta.module}>"
    raise TypeError(f"unknown value metadata {meta!r}")


def format_arg(arg: Argument) -> str:
    if isinstance(arg, Ref):
        return f"%{arg.name}"
    if isinstance(arg, NoneArg):
        return "None"
    if isinstance(arg, (IntArg, BoolArg)):
        return repr(arg.value)
    if isinstance(arg, FloatArg):
        return arg.value if isinstance(arg.value, str) else repr(arg.value)
    if isinstance(arg, StrArg):
        return repr(arg.value)
    if isinstance(arg, ListArg):
        return "[" + ", ".join(format_arg(a) for a in arg.items) + "]"
    if isinstance(arg, TupleArg):
        inner = ", ".join(format_arg(a) for a in arg.items)
        return f"({inner}{',' if len(arg.items) == 1 else ''})"
    if isinstance(arg, DTypeArg):
        return f"torch.{arg.value.value}"
    if isinstance(arg, DeviceArg):
        return f"device({arg.value!r})"
    if isinstance(arg, LayoutArg):
        return f"torch.{arg.value.value}"
    if isinstance(arg, MemoryFormatArg):
        return f"torch.{arg.value.value}"
    if isinstance(arg, SymExprArg):
        return f"sym({arg.expr})" if arg.type == "int" else f"sym<{arg.type}>({arg.expr})"
    raise TypeError(f"unknown argument {arg!r}")


def _format_prov(prov: Provenance | None) -> str:
    if prov is None or prov.debug_handle is None:
        return ""
    return f"  # dh={prov.debug_handle}"


def format_node(node: Node, meta: ValueMeta | None = None, prov: Provenance | None = None) -> str:
    """One line for `node`, given its value metadata and provenance (see `Graph.entries`)."""
    if isinstance(node, Placeholder):
        return f"%{node.name} : {format_meta(meta)} = placeholder"
    if isinstance(node, CallFunction):
        parts = [format_arg(a) for a in node.args]
        parts += [f"{k}={format_arg(v)}" for k, v in node.kwargs]
        return f"%{node.name} : {format_meta(meta)} = {node.target}({', '.join(parts)})" + _format_prov(prov)
    if isinstance(node, GetAttr):
        return f"%{node.name} : {format_meta(meta)} = get_attr {node.target}"
    if isinstance(node, Output):
        inner = ", ".join(format_arg(a) for a in node.args)
        return f"return ({inner}{',' if len(node.args) == 1 else ''})"
    raise TypeError(f"unknown node {node!r}")


def _format_location(loc: Location) -> str:
    parts = []
    if loc.nn_module_stack:
        parts.append(f"nn_module_stack={[(f.key, f.path, f.type) for f in loc.nn_module_stack]!r}")
    if loc.source_fn_stack:
        parts.append(f"source_fn_stack={[(f.name, f.target) for f in loc.source_fn_stack]!r}")
    if loc.torch_fn_type is not None:
        parts.append(f"torch_fn_type={loc.torch_fn_type!r}")
    if loc.custom is not None:
        parts.append(f"custom={loc.custom!r}")
    return " ".join(parts)  # stack traces are not spelled out (see the module docstring)


def _format_provenance(graph: Graph, indent: str) -> list[str]:
    table = graph.provenance
    if table is None:
        return []
    lines = [f"{indent}    loc {i}: {_format_location(loc)}".rstrip() for i, loc in enumerate(table.locations)]
    for i, node in enumerate(graph.nodes):
        parts = []
        handle = table.debug_handle[i]
        if handle is not None and not isinstance(node, CallFunction):  # a call shows it on its line
            parts.append(f"dh={handle}")
        if table.ancestor[i] is not None:
            parts.append(f"ancestor={table.ancestor[i]!r}")
        if table.torch_fn_name[i] is not None:
            parts.append(f"fn={table.torch_fn_name[i]!r}")
        if table.location[i] is not None:
            parts.append(f"loc={table.location[i]}")
        if parts:
            lines.append(f"{indent}    %{node.name}: {' '.join(parts)}")
    return [f"{indent}  provenance:", *lines] if lines else []


def format_graph(graph: Graph, *, indent: str = "") -> list[str]:
    lines = [f"{indent}  {format_node(n, meta, prov)}" for n, meta, prov in graph.entries()]
    lines.extend(_format_provenance(graph, indent))
    for sub in graph.subgraphs:
        lines.append(f"{indent}  subgraph {sub.name}():")
        lines.extend(format_graph(sub.graph, indent=indent + "  "))
    return lines


def format_input_spec(spec: InputSpec) -> str:
    if isinstance(spec, UserInput):
        return f"{format_arg(spec.arg)}: user_input"
    if isinstance(spec, ParameterInput):
        return f"%{spec.name}: parameter {spec.target}"
    if isinstance(spec, BufferInput):
        return f"%{spec.name}: buffer {spec.target}" + ("" if spec.persistent else " (non-persistent)")
    if isinstance(spec, ConstantTensorInput):
        return f"%{spec.name}: constant {spec.target}"
    if isinstance(spec, CustomObjInput):
        return f"%{spec.name}: custom_obj {spec.target}"
    if isinstance(spec, TokenInput):
        return f"%{spec.name}: token"
    raise TypeError(f"unknown input spec {spec!r}")


def format_output_spec(spec: OutputSpec) -> str:
    if isinstance(spec, UserOutput):
        return f"{format_arg(spec.arg)}: user_output"
    if isinstance(spec, BufferMutation):
        return f"%{spec.name}: buffer_mutation {spec.target}"
    if isinstance(spec, UserInputMutation):
        return f"%{spec.name}: user_input_mutation {spec.target}"
    if isinstance(spec, LossOutput):
        return f"%{spec.name}: loss"
    if isinstance(spec, GradientToParameter):
        return f"%{spec.name}: gradient_to_parameter {spec.target}"
    if isinstance(spec, GradientToUserInput):
        return f"%{spec.name}: gradient_to_user_input {spec.target}"
    if isinstance(spec, TokenOutput):
        return f"%{spec.name}: token"
    raise TypeError(f"unknown output spec {spec!r}")


def _format_lowered(module: LoweredBackendModule, indent: str) -> list[str]:
    digest = hashlib.sha256(module.processed_bytes).hexdigest()
    lines = [
        f"{indent}  backend={module.backend_id} processed={len(module.processed_bytes)}B sha256={digest}"
    ]
    for spec in module.compile_specs:
        lines.append(f"{indent}  compile_spec {spec.key}={spec.value.hex()}")
    if module.debug_handle_map is not None:
        for entry in module.debug_handle_map:
            lines.append(f"{indent}  debug {entry.identifier!r} -> {list(entry.debug_handles)}")
        if not module.debug_handle_map:
            lines.append(f"{indent}  debug (empty)")
    for item in module.named_data:
        data = "" if item.data is not None else " (no data)"
        lines.append(
            f"{indent}  named_data {item.key!r}: {item.nbytes}B sha256={item.sha256} alignment={item.alignment}{data}"
        )
    if module.delegate_info is not None:
        lines.append(f"{indent}  delegate_info {module.delegate_info!r}")
    lines.extend(_format_program_lines(module.original_program, indent + "  "))
    return lines


def format_module_call(entry: ModuleCallEntry) -> str:
    sig = entry.signature
    if sig is None:
        return repr(entry.fqn)
    text = (
        f"{entry.fqn!r}: inputs=[{', '.join(format_arg(a) for a in sig.inputs)}]"
        f" outputs=[{', '.join(format_arg(a) for a in sig.outputs)}]"
        f" in_spec={sig.in_spec!r} out_spec={sig.out_spec!r}"
    )
    if sig.forward_arg_names is not None:
        text += f" forward_arg_names={list(sig.forward_arg_names)!r}"
    return text


def _format_program_lines(program: Program, indent: str) -> list[str]:
    lines = [f"{indent}program dialect={program.dialect}"]
    lines.append(f"{indent}  inputs:")
    lines.extend(f"{indent}    {format_input_spec(s)}" for s in program.signature.inputs)
    lines.append(f"{indent}  outputs:")
    lines.extend(f"{indent}    {format_output_spec(s)}" for s in program.signature.outputs)
    lines.append(f"{indent}graph():")
    lines.extend(format_graph(program.graph, indent=indent))
    if program.state:
        lines.append(f"{indent}state:")
        for entry in program.state:
            v = entry.value
            data = "" if v.data is not None else " (no data)"
            size = "" if v.nbytes == tensor_nbytes(v.meta) else f" nbytes={v.nbytes}"
            lines.append(
                f"{indent}  {entry.target} : {format_meta(v.meta)} sha256={v.sha256}{size}{data}"
            )
    if program.range_constraints:
        lines.append(f"{indent}range_constraints:")
        for rc in program.range_constraints:
            hi = "inf" if rc.max is None else str(rc.max)
            hint = "" if rc.hint is None else f" hint={rc.hint}"
            lines.append(f"{indent}  {rc.symbol}: [{rc.min}, {hi}]{hint}")
    if program.module_call_graph:
        lines.append(f"{indent}module_call_graph:")
        lines.extend(f"{indent}  {format_module_call(entry)}" for entry in program.module_call_graph)
    if program.backend_meta:
        lines.append(f"{indent}backend_meta:")
        lines.extend(f"{indent}  %{m.node} {m.key!r}: {m.value!r}" for m in program.backend_meta)
    if program.op_schemas:
        lines.append(f"{indent}op_schemas:")
        lines.extend(f"{indent}  {text!r}" for text in program.op_schemas)
    for lowered in program.lowered_modules:
        lines.append(f"{indent}lowered_module {lowered.name}:")
        lines.extend(_format_lowered(lowered.module, indent + "  "))
    return lines


def format_program(program: Program) -> str:
    """The stable text form of a program, ending with a newline."""
    return "\n".join(_format_program_lines(program, "")) + "\n"


def format_lowered_module(module: LoweredBackendModule) -> str:
    return "\n".join(_format_lowered(module, "")) + "\n"
