"""torch.export.ExportedProgram -> texir IR, in one pass over the nodes."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any, Union

import msgspec
import sympy  # type: ignore[import-untyped]  # sympy ships no type information
import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass
import torch.fx
from torch.export import ExportedProgram
from torch.export import graph_signature as gs
from torch.fx.immutable_collections import immutable_list
from torch.utils._sympy.numbers import int_oo

from texir._io import gc_paused
from texir.adapters import delegate_op
from texir.adapters.core_aten import check_core_aten
from texir.adapters.decompositions import edge_decomposition_table
from texir.adapters.foreign import foreign_lowered_module
from texir.adapters.fx_provenance import CustomMetaError, FxProvenance, getattr_path
from texir.adapters.fx_signature import (
    argument_spec,
    input_spec,
    output_spec,
    placeholder_renames,
    signature_outputs,
)
from texir.adapters.local_decompose import decompose_locally
from texir.adapters.op_schemas import recorded_op_schemas
from texir.adapters.specs import NEG_INF_MIN, dump_spec
from texir.adapters.targets import canonical_target
from texir.adapters.torch_patches import run_decompositions
from texir.adapters.tensors import (
    DTYPE_FROM_TORCH,
    LAYOUT_FROM_TORCH,
    MEMORY_FORMAT_FROM_TORCH,
    device_str,
    dim_from_torch,
    expr_str,
    float_from_python,
    tensor_data_from_tensor,
    tensor_digests,
    tensor_meta_from_tensor,
)
from texir.errors import ConversionError, UnsupportedError
from texir.ir import types as ir
from texir.ir.builder import GraphBuilder
from texir.ir.names import CALL_DELEGATE, GETITEM

__all__ = ["CustomMetaError", "from_exported_program", "state_memo"]


# --------------------------------------------------------------------------------------------------
# FX -> IR


class _FromFx:
    """One conversion: holds its provenance (debug-handle numbering) and the caches of a single call."""

    def __init__(self, ep: ExportedProgram, renames: dict[torch.fx.Node, str]) -> None:
        self.ep = ep
        self.provenance = FxProvenance()
        self.renames = renames
        """Placeholders named otherwise than their input spec (`placeholder_renames`): the IR takes
        the spec's name."""
        self.arg_dispatch: dict[type, Callable[[Any, torch.fx.Node], ir.Argument]] = {
            torch.fx.Node: (lambda v, n: ir.Ref(name=renames.get(v, v.name))) if renames
            else (lambda v, n: ir.Ref(name=v.name)),
            int: lambda v, n: ir.IntArg(value=v),
            float: lambda v, n: ir.FloatArg(value=float_from_python(v)),
            bool: lambda v, n: ir.BoolArg(value=v),
            str: lambda v, n: ir.StrArg(value=v),
            type(None): lambda v, n: _NONE_ARG,
            list: lambda v, n: ir.ListArg(items=tuple(self.arg(x, n) for x in v)),
            immutable_list: lambda v, n: ir.ListArg(items=tuple(self.arg(x, n) for x in v)),
            tuple: lambda v, n: ir.TupleArg(items=tuple(self.arg(x, n) for x in v)),
            torch.dtype: self._dtype_arg,
            torch.device: lambda v, n: ir.DeviceArg(value=device_str(v)),
            torch.layout: self._layout_arg,
            torch.memory_format: lambda v, n: ir.MemoryFormatArg(value=MEMORY_FORMAT_FROM_TORCH[v]),
            torch.SymInt: lambda v, n: ir.SymExprArg(expr=expr_str(v.node.expr), type="int"),
            torch.SymFloat: lambda v, n: ir.SymExprArg(expr=expr_str(v.node.expr), type="float"),
            torch.SymBool: lambda v, n: ir.SymExprArg(expr=expr_str(v.node.expr), type="bool"),
        }

    # -- metadata ----------------------------------------------------------------------------

    def _sym(self, value: Union[torch.SymInt, torch.SymFloat, torch.SymBool]) -> str:
        return expr_str(value.node.expr)

    def meta(self, val: Any, node: torch.fx.Node) -> ir.ValueMeta | None:
        if isinstance(val, torch.Tensor):
            return tensor_meta_from_tensor(val, where=_NodeRef(node))
        if val is None:
            return _NONE_META
        if isinstance(val, (tuple, list)):
            return ir.TupleMeta(
                items=tuple(_NONE_META if v is None else self.meta(v, node) or _NONE_META for v in val),
                is_list=isinstance(val, list),
            )
        if isinstance(val, torch.SymInt):
            return ir.SymIntMeta(expr=dim_from_torch(val))
        if isinstance(val, torch.SymFloat):
            return ir.SymFloatMeta(expr=self._sym(val))
        if isinstance(val, torch.SymBool):
            return ir.SymBoolMeta(expr=self._sym(val))
        if isinstance(val, (bool, int, str)):
            return ir.ScalarMeta(value=val)
        if isinstance(val, float):
            return ir.ScalarMeta(value=float_from_python(val))
        if isinstance(val, torch.ScriptObject) or type(val).__name__ == "FakeScriptObject":
            return ir.CustomObjMeta(class_fqn=_custom_obj_fqn(val))
        raise UnsupportedError(
            f"node {node.name!r} ({node.op} {node.target}): meta['val'] of type "
            f"{type(val).__name__} is not supported"
        )

    # -- arguments ---------------------------------------------------------------------------

    def _dtype_arg(self, v: torch.dtype, node: torch.fx.Node) -> ir.Argument:
        dtype = DTYPE_FROM_TORCH.get(v)
        if dtype is None:
            raise UnsupportedError(f"node {node.name!r} ({node.target}): dtype argument {v} is not supported")
        return ir.DTypeArg(value=dtype)

    def _layout_arg(self, v: torch.layout, node: torch.fx.Node) -> ir.Argument:
        layout = LAYOUT_FROM_TORCH.get(v)
        if layout is None:
            raise UnsupportedError(f"node {node.name!r} ({node.target}): layout argument {v} is not supported")
        return ir.LayoutArg(value=layout)

    def arg(self, value: Any, node: torch.fx.Node) -> ir.Argument:
        conv = self.arg_dispatch.get(type(value))
        if conv is None:
            hint = ""
            if isinstance(value, torch.Tensor):
                hint = "; tensors must be lifted to inputs (export with torch.export.export)"
            raise UnsupportedError(
                f"node {node.name!r} ({node.op} {node.target}): argument of type "
                f"{type(value).__name__} is not supported{hint}"
            )
        return conv(value, node)

    # -- graphs ------------------------------------------------------------------------------

    def graph(self, gm: torch.fx.GraphModule, lowered: list[ir.NamedLoweredModule]) -> ir.Graph:
        builder = GraphBuilder()
        add = builder.add
        subgraphs: list[ir.Subgraph] = []
        arg = self.arg
        meta_of = self.meta
        prov_of = self.provenance.prov
        for node in gm.graph.nodes:
            op = node.op
            if op == "call_function":
                target = canonical_target(node.target)
                if target is None:
                    raise UnsupportedError(_unsupported_target_message(node))
                if target == CALL_DELEGATE and node.target is not delegate_op.texir_call_delegate:
                    self.foreign_delegate_call(node, builder)
                    continue
                val = node.meta.get("val", _MISSING)
                add(
                    ir.CallFunction(
                        name=node.name,
                        target=target,
                        args=tuple([arg(a, node) for a in node.args]),
                        kwargs=tuple([(k, arg(v, node)) for k, v in node.kwargs.items()]),
                    ),
                    None if val is _MISSING else meta_of(val, node),
                    prov_of(node),
                )
            elif op == "placeholder":
                val = node.meta.get("val", _MISSING)
                add(
                    ir.Placeholder(name=self.renames.get(node, node.name)),
                    None if val is _MISSING else meta_of(val, node),
                    prov_of(node),
                )
            elif op == "get_attr":
                attr_node, attr_meta = self.get_attr(gm, node, subgraphs, lowered)
                add(attr_node, attr_meta, prov_of(node))
            elif op == "output":
                (results,) = node.args
                items = results if isinstance(results, (tuple, list)) else (results,)
                add(ir.Output(name=node.name, args=tuple(arg(a, node) for a in items)))
            else:
                raise UnsupportedError(
                    f"node {node.name!r}: {op} nodes are not supported; torch.export programs "
                    "hold only placeholder, call_function, get_attr and output nodes"
                )
        return builder.build(subgraphs)

    def foreign_delegate_call(self, node: torch.fx.Node, builder: GraphBuilder) -> None:
        """Another stack's delegate call (ExecuTorch's `executorch_call_delegate`) in texir's form: its
        inputs flattened (a module called with a dict or list of tensors takes them as leaves, in
        pytree order, as its original program does) and its results always a tuple, read by getitem
        (a call returning one tensor becomes the call and a getitem taking the node's name)."""
        module, *inputs = node.args
        leaves = torch.utils._pytree.tree_leaves(inputs)
        args = tuple([self.arg(module, node), *(self.arg(leaf, node) for leaf in leaves)])
        val = node.meta.get("val", _MISSING)
        if val is _MISSING:
            raise UnsupportedError(
                f"node {node.name!r}: delegate call without meta['val']; export the program with "
                "torch.export.export so its values carry metadata"
            )
        prov = self.provenance.prov(node)
        if isinstance(val, (tuple, list)):
            builder.add(
                ir.CallFunction(name=node.name, target=CALL_DELEGATE, args=args), self.meta(val, node), prov
            )
            return
        names = {n.name for n in node.graph.nodes}
        call_name = f"{node.name}_call"
        while call_name in names:
            call_name += "_"
        meta = self.meta(val, node)
        builder.add(
            ir.CallFunction(name=call_name, target=CALL_DELEGATE, args=args),
            ir.TupleMeta(items=(meta or _NONE_META,)), prov,
        )
        builder.add(
            ir.CallFunction(name=node.name, target=GETITEM, args=(ir.Ref(name=call_name), ir.IntArg(value=0))),
            meta, prov,
        )

    def get_attr(
        self,
        gm: torch.fx.GraphModule,
        node: torch.fx.Node,
        subgraphs: list[ir.Subgraph],
        lowered: list[ir.NamedLoweredModule],
    ) -> tuple[ir.GetAttr, ir.ValueMeta]:
        """The node and its metadata; collects the subgraph or lowered module it names."""
        target = node.target
        assert isinstance(target, str)  # FX guarantees string get_attr targets
        attr = getattr_path(gm, target)
        meta: ir.ValueMeta
        if isinstance(attr, delegate_op.LoweredBackendModule):
            if not any(entry.name == target for entry in lowered):
                lowered.append(ir.NamedLoweredModule(name=target, module=attr.texir_module))
            meta = ir.DelegateMeta(module=target)
        elif isinstance(attr, torch.fx.GraphModule):
            if not any(s.name == target for s in subgraphs):
                subgraphs.append(ir.Subgraph(name=target, graph=self.graph(attr, lowered)))
            meta = ir.SubgraphMeta(graph=target)
        elif (foreign := foreign_lowered_module(attr, from_exported_program)) is not None:
            if not any(entry.name == target for entry in lowered):
                lowered.append(ir.NamedLoweredModule(name=target, module=foreign))
            meta = ir.DelegateMeta(module=target)
        elif type(attr).__name__ == "LoweredBackendModule":
            raise UnsupportedError(
                f"node {node.name!r}: get_attr {target!r} is an ExecuTorch LoweredBackendModule; import "
                "texir.executorch (the bridge teaches the importer ExecuTorch's lowered modules) or "
                "convert the ATen program and lower it with texir.lowering.to_backend"
            )
        else:
            raise UnsupportedError(
                f"node {node.name!r}: get_attr of {type(attr).__name__} {target!r} is not supported; "
                "only nested graphs (torch.cond/torch.map branches) and texir lowered modules are "
                "(tensors must be lifted: use torch.export.export, not a traced GraphModule)"
            )
        return ir.GetAttr(name=node.name, target=target), meta


def _unsupported_target_message(node: torch.fx.Node) -> str:
    head = f"node {node.name!r}: call_function target {node.target!r} ({type(node.target).__name__})"
    if type(node.target).__name__ == "EdgeOpOverload":
        return (
            f"{head} is an ExecuTorch edge-dialect op; import texir.executorch (the bridge teaches "
            "the importer edge ops) or pass the ExportedProgram from torch.export (before to_edge)"
        )
    return (
        f"{head} is not supported; texir converts core ATen programs: use decompose=True "
        "(ep.run_decompositions()) first"
    )


class _NodeRef:
    """Names a node in an error message; formatted only when an error is raised."""

    __slots__ = ("node",)

    def __init__(self, node: torch.fx.Node) -> None:
        self.node = node

    def __str__(self) -> str:
        return f"node {self.node.name!r} ({self.node.op} {self.node.target})"


_MISSING = object()
_NONE_ARG = ir.NoneArg()
_NONE_META = ir.NoneMeta()


def _custom_obj_fqn(val: Any) -> str:
    fqn = getattr(val, "script_class_name", None)
    if fqn is None:
        try:
            fqn = val._type().qualified_name()
        except (AttributeError, RuntimeError):
            fqn = type(val).__name__
    return str(fqn)


def _bound(value: Any) -> int | None:
    if value in (int_oo, sympy.oo):
        return None
    if value in (-int_oo, -sympy.oo):
        return NEG_INF_MIN
    return int(value)




def _symbol_hints(ep: ExportedProgram) -> dict[str, int]:
    """Each backed symbol's example value, read from the shape environment of the program's fake
    inputs (empty when the program carries no fake values)."""
    vals = [n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"]
    fake_mode = torch._guards.detect_fake_mode(vals)
    if fake_mode is None or fake_mode.shape_env is None:
        return {}
    return {
        str(sym): int(val) for sym, val in fake_mode.shape_env.backed_var_to_val.items()
        if getattr(val, "is_integer", False)
    }


_STATE_MEMO: ContextVar[dict[tuple[str, int, bool], tuple[torch.Tensor, ir.StateEntry]] | None] = ContextVar(
    "texir_state_memo", default=None
)


@contextlib.contextmanager
def state_memo() -> Iterator[None]:
    """Inside the block, a state entry converted once is reused by every later conversion whose
    program holds the very same tensor under the same name and kind (`lower` converts the program it
    is given and its decomposition, and both hold the same weights): no second digest look-up,
    payload view or buffer copy. Entries hold their tensor, so an id is never another tensor's."""
    token = _STATE_MEMO.set({})
    try:
        yield
    finally:
        _STATE_MEMO.reset(token)


def _state_entries(tensors: list[tuple[str, torch.Tensor]], buffers: set[str]) -> list[ir.StateEntry]:
    """The state entries of `tensors` (name, tensor), sorted by name; buffers' payloads copied."""
    memo = _STATE_MEMO.get()
    found: list[ir.StateEntry | None] = [None] * len(tensors)
    if memo is not None:
        for i, (target, value) in enumerate(tensors):
            hit = memo.get((target, id(value), target in buffers))
            if hit is not None and hit[0] is value:
                found[i] = hit[1]
    todo = [i for i, entry in enumerate(found) if entry is None]
    # Hashed before the buffers are copied: the source tensor is what a digest_memo recognises.
    wheres = [f"state entry {tensors[i][0]!r}" for i in todo]
    digests = tensor_digests([tensors[i][1] for i in todo], wheres)
    for i, where, digest in zip(todo, wheres, digests):
        target, value = tensors[i]
        source = value
        if target in buffers:
            value = value.detach().clone(memory_format=torch.contiguous_format) \
                if value.is_contiguous() else value
        entry = ir.StateEntry(target=target, value=tensor_data_from_tensor(value, where=where, digest=digest))
        found[i] = entry
        if memo is not None:
            memo[(target, id(source), target in buffers)] = (source, entry)
    state = [entry for entry in found if entry is not None]  # every index is filled above
    state.sort(key=lambda e: e.target)
    return state


def from_exported_program(
    ep: ExportedProgram,
    *,
    decompose: bool = False,
    keep: Sequence[str] = (),
    allow_non_core: bool = False,
    exact_names: bool = True,
    why: list[str] | None = None,
) -> ir.Program:
    """Convert an ExportedProgram to a Program. With `decompose`, first decompose it as
    ExecuTorch's edge lowering does (`edge_decomposition_table`: core ATen, plus the ops the
    ExecuTorch runtime has no kernel for), keeping the ops named in `keep`; then, unless
    `allow_non_core`, refuse an op ExecuTorch's `to_edge` refuses (`NonCoreOperatorError` naming
    the node: `texir.adapters.core_aten`). Without `exact_names`, a program with dynamic shapes is
    decomposed without torch's retrace too, some nodes named otherwise
    (`texir.adapters.local_decompose.decompose_locally`); `why`, if given, receives the reason
    when the retrace decomposes it."""
    if not isinstance(ep, ExportedProgram):
        raise ConversionError(f"expected a torch.export.ExportedProgram, got {type(ep).__name__}")
    if decompose:
        # Without torch's retrace where a direct rewrite gives the same program (most models).
        local = decompose_locally(ep, keep, exact_names=exact_names, why=why)
        if local is not None:
            ep = local
        else:
            ep = run_decompositions(ep, edge_decomposition_table(keep))
        if not allow_non_core:
            check_core_aten(ep, keep)
    with gc_paused(), torch._C.DisableTorchFunctionSubclass():
        # (Reading a FakeTensor's attributes goes through __torch_function__ otherwise: 2x slower.)
        return _convert_from(ep)


def _convert_from(ep: ExportedProgram) -> ir.Program:
    # The signature's names are matched to the graph by position, as torch matches them.
    renames = placeholder_renames(ep)
    conv = _FromFx(ep, renames)
    gm = ep.graph_module
    conv.provenance.number_debug_handles(gm)
    lowered: list[ir.NamedLoweredModule] = []
    graph = conv.graph(gm, lowered)
    sig = ep.graph_signature
    signature = ir.GraphSignature(
        inputs=tuple(input_spec(s) for s in sig.input_specs),
        outputs=tuple(
            output_spec(s, renames.get(value, value.name) if isinstance(value, torch.fx.Node) else None)
            for s, value in signature_outputs(ep)
        ),
    )
    # Buffers are the state a running program writes to (in place, or through ep.module()'s
    # write-back), so their payload is copied; parameters and constants are aliased zero-copy.
    buffers = {s.target for s in sig.input_specs if s.kind is gs.InputKind.BUFFER}
    tensors: list[tuple[str, torch.Tensor]] = []
    for table in (ep.state_dict, ep.constants):
        for target, value in table.items():
            if not isinstance(value, torch.Tensor):
                raise UnsupportedError(
                    f"state entry {target!r}: {type(value).__name__} constants (custom objects) "
                    "are not supported"
                )
            if is_traceable_wrapper_subclass(value):
                raise UnsupportedError(
                    f"state entry {target!r} is a tensor subclass ({type(value).__name__}, e.g. torchao's "
                    "quantized weights): unwrap it into plain tensors first with ep.run_decompositions({}) "
                    "(texir.orchestrate.lower does this itself)"
                )
            tensors.append((target, value))
    state = _state_entries(tensors, buffers)
    ranges = []
    hints = _symbol_hints(ep) if ep.range_constraints else {}
    for sym, vr in ep.range_constraints.items():
        lo = _bound(vr.lower)
        ranges.append(ir.RangeConstraint(
            symbol=str(sym), min=NEG_INF_MIN if lo is None else lo, max=_bound(vr.upper),
            hint=hints.get(str(sym)),
        ))
    calls = []
    for entry in ep.module_call_graph:
        signature_ir = None
        if entry.signature is not None:
            s = entry.signature
            where = f"module_call_graph entry {entry.fqn!r}"
            signature_ir = ir.ModuleCallSignature(
                inputs=tuple(argument_spec(a, where) for a in s.inputs),
                outputs=tuple(argument_spec(a, where) for a in s.outputs),
                in_spec=dump_spec(s.in_spec, where),
                out_spec=dump_spec(s.out_spec, where),
                forward_arg_names=tuple(s.forward_arg_names) if s.forward_arg_names is not None else None,
            )
        calls.append(ir.ModuleCallEntry(fqn=entry.fqn, signature=signature_ir))
    program = ir.Program(
        graph=graph,
        signature=signature,
        state=tuple(state),
        range_constraints=tuple(ranges),
        module_call_graph=tuple(calls),
        lowered_modules=tuple(sorted(lowered, key=lambda e: e.name)),
        dialect=_dialect(ep.dialect),
    )
    custom = recorded_op_schemas(program)  # what texir's packaged schema table lacks (custom ops)
    return msgspec.structs.replace(program, op_schemas=custom) if custom else program


def _dialect(value: object) -> ir.Dialect:
    for known in ir.DIALECTS:  # (a loop, not `in`, so mypy narrows the value to the Literal)
        if value == known:
            return known
    raise ConversionError(ir.unknown_dialect_message(value, "ExportedProgram.dialect"))
