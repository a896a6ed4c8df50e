"""torch.export.ExportedProgram <-> texir IR, both directions, in one pass over the nodes."""

from __future__ import annotations

import contextlib
import math
import operator
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Union

import sympy  # type: ignore[import-untyped]  # sympy ships no type information
import torch
import torch.fx
from torch._ops import HigherOrderOperator, OpOverload
from torch._export.verifier import TrainingIRVerifier, Verifier
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.export import ExportedProgram
from torch.export import exported_program as ep_mod
from torch.export import graph_signature as gs
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.fx.immutable_collections import immutable_list
from torch.fx.traceback import NodeSource
from torch.utils import _pytree as pytree
from torch.utils._sympy import functions as _sympy_functions
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.value_ranges import ValueRanges

from texir.adapters import delegate_op
from texir.adapters.tensors import (
    DTYPE_FROM_TORCH,
    DTYPE_TO_TORCH,
    LAYOUT_FROM_TORCH,
    LAYOUT_TO_TORCH,
    MEMORY_FORMAT_FROM_TORCH,
    MEMORY_FORMAT_TO_TORCH,
    device_str,
    dim_from_torch,
    float_from_python,
    float_to_python,
    tensor_data_from_tensor,
    tensor_from_data,
    tensor_meta_from_tensor,
)
from texir._io import gc_paused
from texir.ir.builder import GraphBuilder
from texir.ir.literals import literal_arg
from texir.errors import ConversionError, UnsupportedError
from texir.ir import types as ir

__all__ = [
    "DELEGATE_TARGET",
    "canonical_target",
    "from_exported_program",
    "resolve_target",
    "to_exported_program",
]

DELEGATE_TARGET = "texir::call_delegate"
GETITEM_TARGET = "_operator::getitem"

# A range constraint's lower bound of minus infinity (unbacked symbols) is stored as this
# sentinel because RangeConstraint.min is an int; it is read back as -infinity.
_NEG_INF_MIN = -(2**63)

# --------------------------------------------------------------------------------------------------
# Call targets: canonical spellings, both ways


def _builtin_table() -> dict[Any, str]:
    table: dict[Any, str] = {}
    for name in (
        "getitem", "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "abs",
        "eq", "ne", "lt", "le", "gt", "ge", "and_", "or_", "xor", "not_", "invert", "lshift",
        "rshift", "matmul",
    ):
        table[getattr(operator, name)] = f"_operator::{name}"
    for name in ("ceil", "floor", "trunc", "sqrt", "exp", "log", "sin", "cos", "tan"):
        table[getattr(math, name)] = f"math::{name}"
    for name in dir(torch):
        if name.startswith(("sym_", "_sym_")) and callable(getattr(torch, name)):
            table[getattr(torch, name)] = f"torch::{name}"
    for name in ("_check", "_check_is_size"):
        table[getattr(torch, name)] = f"torch::{name}"
    table[round] = "builtins::round"
    return table


_BUILTIN_TO_NAME: dict[Any, str] = _builtin_table()
_NAME_TO_BUILTIN: dict[str, Any] = {v: k for k, v in _BUILTIN_TO_NAME.items()}
_TARGET_NAME_CACHE: dict[Any, str] = {}
_TARGET_CACHE: dict[str, Any] = {}


def canonical_target(target: Any) -> str | None:
    """The canonical string of an FX call target, or None when texir cannot name it."""
    try:
        return _TARGET_NAME_CACHE[target]
    except (KeyError, TypeError):
        pass
    name: str | None
    if isinstance(target, OpOverload):
        name = f"{target._schema.name}.{target._overloadname}"
    elif target is delegate_op.texir_call_delegate:
        name = DELEGATE_TARGET
    elif isinstance(target, HigherOrderOperator):
        name = f"higher_order::{target.name()}"  # type: ignore[no-untyped-call]  # unannotated in torch
    else:
        name = _BUILTIN_TO_NAME.get(target)
    if name is not None:
        _TARGET_NAME_CACHE[target] = name
    return name


def resolve_target(name: str) -> Any:
    """The FX call target for a canonical string (OpOverload, HigherOrderOperator or builtin)."""
    target = _TARGET_CACHE.get(name)
    if target is not None:
        return target
    target = _NAME_TO_BUILTIN.get(name)
    if target is None:
        if name == DELEGATE_TARGET:
            target = delegate_op.texir_call_delegate
        else:
            namespace, sep, rest = name.partition("::")
            if not sep or not rest:
                raise UnsupportedError(
                    f"op {name!r} is not a canonical target; spell it 'namespace::op.overload'"
                )
            try:
                if namespace == "higher_order":
                    target = getattr(torch.ops.higher_order, rest)
                else:
                    opname, _, overload = rest.partition(".")
                    target = getattr(getattr(getattr(torch.ops, namespace), opname), overload or "default")
            except (AttributeError, RuntimeError) as exc:
                raise UnsupportedError(
                    f"op {name!r} is unknown to this torch build; import the library that "
                    "registers it before converting"
                ) from exc
    _TARGET_CACHE[name] = target
    return target


# --------------------------------------------------------------------------------------------------
# FX -> IR


_STR_OF_CACHE: dict[Any, str] = {}


def _str_of(value: Any) -> str:
    """A stable string for a source_fn / nn_module_stack target (a class, function or string)."""
    if isinstance(value, str):
        return value
    try:
        return _STR_OF_CACHE[value]
    except (KeyError, TypeError):
        pass
    text = _str_of_uncached(value)
    try:
        _STR_OF_CACHE[value] = text
    except TypeError:
        pass
    return text


def _str_of_uncached(value: Any) -> str:
    if isinstance(value, OpOverload):
        return canonical_target(value) or str(value)
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None)
    if module is not None and qualname is not None:
        return f"{module}.{qualname}"
    return str(value)


class _FromFx:
    """One conversion: holds the debug-handle numbering and the caches of a single call."""

    def __init__(self, ep: ExportedProgram) -> None:
        self.ep = ep
        self.handles: dict[torch.fx.Node, tuple[int, str]] = {}
        self.graph_ordinals: dict[int, int] = {}
        self.module_stack_cache: dict[Any, tuple[ir.ModuleFrame, ...]] = {}
        self.sym_cache: dict[Any, str] = {}
        self.arg_dispatch: dict[type, Callable[[Any, torch.fx.Node], ir.Argument]] = {
            torch.fx.Node: lambda v, n: ir.Ref(name=v.name),
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
            torch.SymInt: lambda v, n: ir.SymExprArg(expr=str(v.node.expr), type="int"),
            torch.SymFloat: lambda v, n: ir.SymExprArg(expr=str(v.node.expr), type="float"),
            torch.SymBool: lambda v, n: ir.SymExprArg(expr=str(v.node.expr), type="bool"),
        }

    # -- debug handles, numbered as ExecuTorch's DebugHandleGeneratorPass numbers them ---------

    def _ordinal(self, graph_id: int) -> int:
        # torch's graph ids are id() values; renumber them in first-seen order so that the stored
        # ancestor identifiers are the same in every process.
        k = self.graph_ordinals.get(graph_id)
        if k is None:
            k = self.graph_ordinals[graph_id] = len(self.graph_ordinals)
        return k

    def number_debug_handles(self, gm: torch.fx.GraphModule) -> None:
        seen: dict[str, int] = {}
        queue: deque[torch.fx.GraphModule] = deque([gm])
        while queue:
            current = queue.popleft()
            graph_id = id(current.graph)
            for node in current.graph.nodes:
                op = node.op
                if op == "placeholder" or op == "output":
                    continue
                sources = node.meta.get("from_node")
                if sources:
                    source = sources[-1]
                    while source.from_node:
                        source = source.from_node[-1]
                    ancestor = f"{source.name}.{self._ordinal(source.graph_id)}"
                else:
                    ancestor = f"{node.name}.{self._ordinal(graph_id)}"
                handle = seen.get(ancestor)
                if handle is None:
                    handle = seen[ancestor] = len(seen) + 1
                self.handles[node] = (handle, ancestor)
            # Nested graphs follow the graph, in the order their HOP calls name them (for cond:
            # true then false branch), as ExecuTorch's bfs_trace_with_node_process visits them.
            for node in current.graph.nodes:
                if node.op == "call_function" and isinstance(node.target, HigherOrderOperator) \
                        and node.target is not delegate_op.texir_call_delegate:
                    for a in node.args:
                        if isinstance(a, torch.fx.Node) and a.op == "get_attr":
                            sub = _getattr_path(current, str(a.target))
                            if isinstance(sub, torch.fx.GraphModule):
                                queue.append(sub)

    # -- metadata ----------------------------------------------------------------------------

    def _sym(self, value: Union[torch.SymInt, torch.SymFloat, torch.SymBool]) -> str:
        expr = value.node.expr
        s = self.sym_cache.get(expr)
        if s is None:
            s = self.sym_cache[expr] = str(expr)
        return s

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

    def prov(self, node: torch.fx.Node) -> ir.Provenance | None:
        meta = node.meta
        handle = self.handles.get(node)
        stack = meta.get("nn_module_stack")
        frames: tuple[ir.ModuleFrame, ...] = ()
        if stack:
            # torch gives every node its own dict, but a layer's nodes repeat its contents: cache
            # by content (which also makes equal stacks one tuple, cheap for GraphBuilder to intern).
            try:
                key: Any = tuple(stack.items())
                cached = self.module_stack_cache.get(key)
            except TypeError:  # an unhashable entry: convert without caching
                key = cached = None
            if cached is not None:
                frames = cached
            else:
                frames = tuple(
                    ir.ModuleFrame(key=k, path=v[0], type=_str_of(v[1])) for k, v in stack.items()
                )
                if key is not None:
                    self.module_stack_cache[key] = frames
        source_fn = meta.get("source_fn_stack")
        sources: tuple[ir.SourceFn, ...] = ()
        if source_fn:
            sources = tuple(ir.SourceFn(name=s[0], target=_str_of(s[1])) for s in source_fn)
        torch_fn = meta.get("torch_fn")
        stack_trace = meta.get("stack_trace")
        if handle is None and not frames and not sources and torch_fn is None and stack_trace is None:
            return None
        return ir.Provenance(
            debug_handle=handle[0] if handle else None,
            ancestor=handle[1] if handle else None,
            stack_trace=stack_trace,
            nn_module_stack=frames,
            source_fn_stack=sources,
            torch_fn=(str(torch_fn[0]), str(torch_fn[1])) if torch_fn else None,
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
        prov_of = self.prov
        for node in gm.graph.nodes:
            op = node.op
            if op == "call_function":
                target = canonical_target(node.target)
                if target is None:
                    raise UnsupportedError(_unsupported_target_message(node))
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
                    ir.Placeholder(name=node.name),
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
        attr = _getattr_path(gm, target)
        meta: ir.ValueMeta
        if isinstance(attr, delegate_op.LoweredBackendModule):
            if not any(entry.name == target for entry in lowered):
                lowered.append(ir.NamedLoweredModule(name=target, module=attr.texir_module))
            meta = ir.DelegateMeta(module=target)
        elif isinstance(attr, torch.fx.GraphModule):
            if not any(s.name == target for s in subgraphs):
                subgraphs.append(ir.Subgraph(name=target, graph=self.graph(attr, lowered)))
            meta = ir.SubgraphMeta(graph=target)
        elif type(attr).__name__ == "LoweredBackendModule":
            raise UnsupportedError(
                f"node {node.name!r}: get_attr {target!r} is an ExecuTorch LoweredBackendModule; texir "
                "converts programs before ExecuTorch lowering: convert the ATen program and lower it "
                "with texir.lowering.to_backend"
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
            f"{head} is an ExecuTorch edge-dialect op; texir converts ATen programs: pass the "
            "ExportedProgram from torch.export (before to_edge)"
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


def _no_prov(index: int) -> None:
    """`Graph.prov` of a graph without provenance."""
    return None


def _getattr_path(module: torch.nn.Module, target: str) -> Any:
    obj: Any = module
    for part in target.split("."):
        if not hasattr(obj, part):
            raise ConversionError(f"get_attr target {target!r} does not exist on the graph module")
        obj = getattr(obj, part)
    return obj


def _custom_obj_fqn(val: Any) -> str:
    fqn = getattr(val, "script_class_name", None)
    if fqn is None:
        try:
            fqn = val._type().qualified_name()
        except (AttributeError, RuntimeError):
            fqn = type(val).__name__
    return str(fqn)


def _argument_spec(spec: Any, where: str) -> ir.Argument:
    if isinstance(spec, gs.ConstantArgument):
        return _literal_arg(spec.value, where)
    name = getattr(spec, "name", None)
    if not isinstance(name, str):
        raise UnsupportedError(f"{where}: argument spec {spec!r} is not supported")
    return ir.Ref(name=name)


def _literal_arg(value: Any, where: str) -> ir.Argument:
    try:
        return literal_arg(value)
    except TypeError:
        raise UnsupportedError(
            f"{where}: constant {value!r} of type {type(value).__name__} is not supported"
        ) from None


def _input_spec(spec: gs.InputSpec) -> ir.InputSpec:
    kind = spec.kind
    name = getattr(spec.arg, "name", "")
    where = f"signature input {name!r}"
    if kind is gs.InputKind.USER_INPUT:
        return ir.UserInput(arg=_argument_spec(spec.arg, where))
    if kind is gs.InputKind.TOKEN:
        return ir.TokenInput(name=name)
    target = spec.target
    if target is None:
        raise ConversionError(f"{where}: {kind.name} input without a target")
    if kind is gs.InputKind.PARAMETER:
        return ir.ParameterInput(name=name, target=target)
    if kind is gs.InputKind.BUFFER:
        return ir.BufferInput(name=name, target=target, persistent=bool(spec.persistent))
    if kind is gs.InputKind.CONSTANT_TENSOR:
        return ir.ConstantTensorInput(name=name, target=target)
    if kind is gs.InputKind.CUSTOM_OBJ:
        return ir.CustomObjInput(name=name, target=target)
    raise UnsupportedError(f"{where}: input kind {kind.name} is not supported")


def _output_spec(spec: gs.OutputSpec) -> ir.OutputSpec:
    kind = spec.kind
    name = getattr(spec.arg, "name", "")
    where = f"signature output {name!r}"
    if kind is gs.OutputKind.USER_OUTPUT:
        return ir.UserOutput(arg=_argument_spec(spec.arg, where))
    if kind is gs.OutputKind.LOSS_OUTPUT:
        return ir.LossOutput(name=name)
    if kind is gs.OutputKind.TOKEN:
        return ir.TokenOutput(name=name)
    target = spec.target
    if target is None:
        raise ConversionError(f"{where}: {kind.name} output without a target")
    if kind is gs.OutputKind.BUFFER_MUTATION:
        return ir.BufferMutation(name=name, target=target)
    if kind is gs.OutputKind.USER_INPUT_MUTATION:
        return ir.UserInputMutation(name=name, target=target)
    if kind is gs.OutputKind.GRADIENT_TO_PARAMETER:
        return ir.GradientToParameter(name=name, target=target)
    if kind is gs.OutputKind.GRADIENT_TO_USER_INPUT:
        return ir.GradientToUserInput(name=name, target=target)
    raise UnsupportedError(
        f"{where}: output kind {kind.name} is not supported; run ep.run_decompositions() to "
        "functionalize the program first"
    )


def _bound(value: Any) -> int | None:
    if value in (int_oo, sympy.oo):
        return None
    if value in (-int_oo, -sympy.oo):
        return _NEG_INF_MIN
    return int(value)


def _name_structseq_types() -> None:
    # torch registers its structseq return types (torch.return_types.max, ...) as pytree nodes
    # without a serialization name, so a program returning `x.max(dim=0)` cannot have its
    # out_spec dumped. Give them their import path as name (idempotent, additive).
    for cls, node_def in list(pytree.SUPPORTED_SERIALIZED_TYPES.items()):
        if node_def.serialized_type_name == pytree.NO_SERIALIZED_TYPE_NAME_FOUND and \
                getattr(cls, "__module__", "") == "torch.return_types":
            name = f"torch.return_types.{cls.__name__}"
            pytree.SUPPORTED_SERIALIZED_TYPES[cls] = node_def._replace(serialized_type_name=name)
            pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE[name] = cls


def _dump_spec(spec: pytree.TreeSpec, where: str) -> str:
    try:
        return pytree.treespec_dumps(spec)
    except NotImplementedError:
        _name_structseq_types()
    try:
        return pytree.treespec_dumps(spec)
    except (NotImplementedError, TypeError) as exc:
        raise UnsupportedError(
            f"{where}: its pytree spec cannot be serialized ({exc}); register the container type "
            "with torch.utils._pytree.register_pytree_node(..., serialized_type_name=...)"
        ) from exc


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


def _load_spec(text: str, where: str) -> pytree.TreeSpec:
    for attempt in range(2):
        try:
            return pytree.treespec_loads(text)
        except NotImplementedError as exc:
            if attempt:
                raise UnsupportedError(
                    f"{where}: its pytree spec names a container type that is not registered ({exc})"
                ) from exc
            _name_structseq_types()
        except (ValueError, TypeError, KeyError) as exc:
            raise ConversionError(f"{where}: malformed pytree spec ({exc})") from exc
    raise AssertionError("unreachable")


def from_exported_program(ep: ExportedProgram, *, decompose: bool = False) -> ir.Program:
    """Convert an ExportedProgram to a Program (after `run_decompositions()` when `decompose`)."""
    if not isinstance(ep, ExportedProgram):
        raise ConversionError(f"expected a torch.export.ExportedProgram, got {type(ep).__name__}")
    if decompose:
        ep = ep.run_decompositions()
    with gc_paused(), torch._C.DisableTorchFunctionSubclass():
        # (Reading a FakeTensor's attributes goes through __torch_function__ otherwise: 2x slower.)
        return _convert_from(ep)


def _convert_from(ep: ExportedProgram) -> ir.Program:
    conv = _FromFx(ep)
    gm = ep.graph_module
    conv.number_debug_handles(gm)
    lowered: list[ir.NamedLoweredModule] = []
    graph = conv.graph(gm, lowered)
    sig = ep.graph_signature
    signature = ir.GraphSignature(
        inputs=tuple(_input_spec(s) for s in sig.input_specs),
        outputs=tuple(_output_spec(s) for s in sig.output_specs),
    )
    # Buffers are the state a running program writes to (in place, or through ep.module()'s
    # write-back), so their payload is copied; parameters and constants are aliased zero-copy.
    buffers = {s.target for s in sig.input_specs if s.kind is gs.InputKind.BUFFER}
    state: list[ir.StateEntry] = []
    for table in (ep.state_dict, ep.constants):
        for target, value in table.items():
            if not isinstance(value, torch.Tensor):
                raise UnsupportedError(
                    f"state entry {target!r}: {type(value).__name__} constants (custom objects) "
                    "are not supported"
                )
            if target in buffers:
                value = value.detach().clone(memory_format=torch.contiguous_format) \
                    if value.is_contiguous() else value
            state.append(ir.StateEntry(
                target=target, value=tensor_data_from_tensor(value, where=f"state entry {target!r}")
            ))
    state.sort(key=lambda e: e.target)
    ranges = []
    hints = _symbol_hints(ep) if ep.range_constraints else {}
    for sym, vr in ep.range_constraints.items():
        lo = _bound(vr.lower)
        ranges.append(ir.RangeConstraint(
            symbol=str(sym), min=_NEG_INF_MIN if lo is None else lo, max=_bound(vr.upper),
            hint=hints.get(str(sym)),
        ))
    calls = []
    for entry in ep.module_call_graph:
        signature_ir = None
        if entry.signature is not None:
            s = entry.signature
            where = f"module_call_graph entry {entry.fqn!r}"
            signature_ir = ir.ModuleCallSignature(
                inputs=tuple(_argument_spec(a, where) for a in s.inputs),
                outputs=tuple(_argument_spec(a, where) for a in s.outputs),
                in_spec=_dump_spec(s.in_spec, where),
                out_spec=_dump_spec(s.out_spec, where),
                forward_arg_names=tuple(s.forward_arg_names) if s.forward_arg_names is not None else None,
            )
        calls.append(ir.ModuleCallEntry(fqn=entry.fqn, signature=signature_ir))
    dialect = ep.dialect
    return ir.Program(
        graph=graph,
        signature=signature,
        state=tuple(state),
        range_constraints=tuple(ranges),
        module_call_graph=tuple(calls),
        lowered_modules=tuple(sorted(lowered, key=lambda e: e.name)),
        dialect=dialect,
    )


# --------------------------------------------------------------------------------------------------
# IR -> FX


_SYMPY_LOCALS: dict[str, Any] = {
    name: getattr(_sympy_functions, name)
    for name in (
        "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt",
        "FloorToInt", "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv",
        "IntTrueDiv", "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt",
        "RoundToInt", "RoundDecimal", "ToFloat", "Identity",
    )
    if hasattr(_sympy_functions, name)
}

# Hints are the example values symbolic sizes evaluate to while torch traces; the IR keeps only
# ranges, so pick a value inside the range that is unlikely to collide with a static size.
_PREFERRED_HINT = 7


class _ToFx:
    """One conversion: one ShapeEnv and FakeTensorMode, shared by the whole program."""

    def __init__(self, program: ir.Program) -> None:
        self.program = program
        self.shape_env = ShapeEnv(assume_static_by_default=True)
        self.fake_mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=self.shape_env)
        self.symbols: dict[str, sympy.Symbol] = {}
        self.hints: dict[sympy.Symbol, int] = {}
        self.ranges: dict[sympy.Symbol, ValueRanges[Any]] = {}
        self.sym_cache: dict[tuple[str, str], Any] = {}
        self.fake_cache: dict[ir.TensorMeta, torch.Tensor] = {}
        self.devices: dict[str, torch.device] = {}
        self.node_sources: dict[str, NodeSource] = {}
        self.lowered = {entry.name: entry.module for entry in program.lowered_modules}
        self.lowered_torch: dict[str, delegate_op.LoweredBackendModule] = {}
        for rc in program.range_constraints:
            self._add_symbol(rc)
        self.arg_dispatch: dict[type, Callable[[Any, dict[str, torch.fx.Node]], Any]] = {
            ir.Ref: self._ref,
            ir.IntArg: lambda a, env: a.value,
            ir.FloatArg: lambda a, env: float_to_python(a.value),
            ir.BoolArg: lambda a, env: a.value,
            ir.StrArg: lambda a, env: a.value,
            ir.NoneArg: lambda a, env: None,
            ir.ListArg: lambda a, env: [self.arg(x, env) for x in a.items],
            ir.TupleArg: lambda a, env: tuple(self.arg(x, env) for x in a.items),
            ir.DTypeArg: lambda a, env: DTYPE_TO_TORCH[a.value],
            ir.DeviceArg: lambda a, env: torch.device(a.value),
            ir.LayoutArg: lambda a, env: LAYOUT_TO_TORCH[a.value],
            ir.MemoryFormatArg: lambda a, env: MEMORY_FORMAT_TO_TORCH[a.value],
            ir.SymExprArg: lambda a, env: self.sym_value(a.expr, a.type),
        }

    # -- symbols -----------------------------------------------------------------------------

    def _add_symbol(self, rc: ir.RangeConstraint) -> None:
        unbacked = rc.symbol.startswith("u")
        sym = sympy.Symbol(rc.symbol, integer=True) if unbacked or rc.min < 0 else \
            sympy.Symbol(rc.symbol, integer=True, nonnegative=True)
        self.symbols[rc.symbol] = sym
        lo: Any = -int_oo if rc.min <= _NEG_INF_MIN else rc.min
        hi: Any = int_oo if rc.max is None else rc.max
        self.ranges[sym] = ValueRanges(lo, hi)
        if unbacked:
            self.shape_env.unbacked_symint_counter += 1
        else:
            if rc.hint is not None:
                if rc.hint < rc.min or (rc.max is not None and rc.hint > rc.max):
                    raise ConversionError(
                        f"range constraint {rc.symbol!r}: hint {rc.hint} is outside "
                        f"[{rc.min}, {'inf' if rc.max is None else rc.max}]; give a hint inside the "
                        "range, or none (texir.ir.verify reports this too)"
                    )
                hint = rc.hint
            else:  # a program built by hand: any value inside the range will do
                top = rc.max if rc.max is not None else max(rc.min, _PREFERRED_HINT)
                hint = min(max(rc.min, _PREFERRED_HINT), top)
            self.hints[sym] = hint
            self.shape_env.add_backed_var_to_val(sym, hint)
        self.shape_env.constrain_symbol_range(
            sym, compiler_min=lo, compiler_max=hi
        )

    def parse_expr(self, text: str) -> sympy.Expr:
        try:
            expr = sympy.sympify(text, locals={**_SYMPY_LOCALS, **self.symbols})
        except (sympy.SympifyError, SyntaxError, TypeError) as exc:
            raise ConversionError(f"symbolic expression {text!r} does not parse: {exc}") from exc
        for free in expr.free_symbols:
            if free.name not in self.symbols:
                raise ConversionError(
                    f"symbolic expression {text!r} uses symbol {free.name!r} that has no range "
                    "constraint; add it to Program.range_constraints"
                )
        return expr

    def sym_value(self, text: str, kind: str) -> Any:
        key = (text, kind)
        value = self.sym_cache.get(key)
        if value is not None:
            return value
        expr = self.parse_expr(text)
        hint: Any = None
        if expr.free_symbols and all(s in self.hints for s in expr.free_symbols):
            hint_expr = expr.xreplace(self.hints)
            if kind == "int":
                hint = int(hint_expr)
            elif kind == "float":
                hint = float(hint_expr)
            else:
                hint = bool(hint_expr)
        if kind == "int":
            value = self.shape_env.create_symintnode(expr, hint=hint)
        elif kind == "float":
            value = self.shape_env.create_symfloatnode(expr, hint=hint)
        else:
            value = self.shape_env.create_symboolnode(expr)
        self.sym_cache[key] = value
        return value

    def dim(self, d: ir.Dim) -> Any:
        return d if isinstance(d, int) else self.sym_value(d, "int")

    # -- metadata ----------------------------------------------------------------------------

    def fake(self, meta: ir.TensorMeta) -> torch.Tensor:
        dtype = DTYPE_TO_TORCH.get(meta.dtype)
        if dtype is None:
            raise UnsupportedError(f"dtype {meta.dtype} is not available in this torch build")
        shape = [self.dim(d) for d in meta.shape]
        layout = LAYOUT_TO_TORCH[meta.layout]
        device = self.devices.get(meta.device)
        if device is None:
            device = self.devices[meta.device] = torch.device(meta.device)
        if layout is not torch.strided:
            with self.fake_mode:
                t = torch.empty(shape, dtype=dtype, device=device, layout=layout)
                if meta.requires_grad:
                    t.requires_grad_(True)
            return t
        # Wrapping a meta tensor is ~10x cheaper than dispatching empty_strided through the
        # fake mode, and gives the same FakeTensor.
        strides = [self.dim(d) for d in meta.strides]
        offset = self.dim(meta.storage_offset)
        if isinstance(offset, int) and offset == 0:
            elem = torch.empty_strided(shape, strides, dtype=dtype, device="meta")
        else:
            extent = offset + 1 + sum((s - 1) * st for s, st in zip(shape, strides))
            elem = torch.empty((extent,), dtype=dtype, device="meta").as_strided(shape, strides, offset)
        if meta.requires_grad:
            elem.requires_grad_(True)
        return FakeTensor(self.fake_mode, elem, device)

    def shared_fake(self, meta: ir.TensorMeta) -> torch.Tensor:
        # Computed values with equal metadata share one FakeTensor: meta["val"] is read-only
        # metadata, and building fake tensors dominates IR -> FX time. Placeholders never share
        # (torch would read shared input fakes as aliased inputs when it retraces).
        t = self.fake_cache.get(meta)
        if t is None:
            t = self.fake_cache[meta] = self.fake(meta)
        return t

    def val(self, meta: ir.ValueMeta | None, share: bool = True) -> Any:
        if isinstance(meta, ir.TensorMeta):
            return self.shared_fake(meta) if share else self.fake(meta)
        if meta is None:
            return _MISSING
        if isinstance(meta, ir.TupleMeta):
            items = [self.val(m, share) for m in meta.items]
            return items if meta.is_list else tuple(items)
        if isinstance(meta, ir.NoneMeta):
            return None
        if isinstance(meta, ir.SymIntMeta):
            return meta.expr if isinstance(meta.expr, int) else self.sym_value(meta.expr, "int")
        if isinstance(meta, ir.SymFloatMeta):
            return self.sym_value(meta.expr, "float")
        if isinstance(meta, ir.SymBoolMeta):
            return self.sym_value(meta.expr, "bool")
        if isinstance(meta, ir.ScalarMeta):
            value = meta.value
            return float(value) if value in ("inf", "-inf", "nan") else value
        if isinstance(meta, ir.TokenMeta):
            with self.fake_mode:
                return torch.empty((0,))
        return _MISSING

    def set_prov(self, fx_node: torch.fx.Node, prov: ir.Provenance | None) -> None:
        if prov is None:
            return
        meta = fx_node.meta
        if prov.stack_trace is not None:
            meta["stack_trace"] = prov.stack_trace
        if prov.nn_module_stack:
            meta["nn_module_stack"] = {f.key: (f.path, f.type) for f in prov.nn_module_stack}
        if prov.source_fn_stack:
            meta["source_fn_stack"] = [(s.name, s.target) for s in prov.source_fn_stack]
        if prov.torch_fn is not None:
            meta["torch_fn"] = prov.torch_fn
        if prov.debug_handle is not None:
            meta["debug_handle"] = prov.debug_handle
        if prov.ancestor is not None:
            source = self.node_sources.get(prov.ancestor)
            if source is None:
                name, _, graph_id = prov.ancestor.rpartition(".")
                source = NodeSource(None, pass_name="texir")
                source.node_info = NodeSource.NodeInfo(
                    name=name, target="", graph_id=int(graph_id) if graph_id.isdigit() else -1
                )
                self.node_sources[prov.ancestor] = source
            meta["from_node"] = [source]

    # -- arguments ---------------------------------------------------------------------------

    def _ref(self, a: ir.Ref, env: dict[str, torch.fx.Node]) -> torch.fx.Node:
        node = env.get(a.name)
        if node is None:
            raise ConversionError(f"reference to {a.name!r} before its definition; run texir.ir.verify")
        return node

    def arg(self, a: ir.Argument, env: dict[str, torch.fx.Node]) -> Any:
        conv = self.arg_dispatch.get(type(a))
        if conv is None:
            raise ConversionError(
                f"argument {a!r} is not a texir.ir Argument ({type(a).__name__}); build arguments "
                "from the texir.ir argument types"
            )
        return conv(a, env)

    # -- graphs ------------------------------------------------------------------------------

    def graph_module(self, graph: ir.Graph, path: str) -> torch.fx.GraphModule:
        root, fx_graph = self.build_graph(graph, path)
        return torch.fx.GraphModule(root, fx_graph)

    def build_graph(self, graph: ir.Graph, path: str) -> tuple[torch.nn.Module, torch.fx.Graph]:
        fx_graph = torch.fx.Graph()
        root = torch.nn.Module()
        subgraphs = {s.name: s.graph for s in graph.subgraphs}
        env: dict[str, torch.fx.Node] = {}
        arg = self.arg
        val_of = self.val
        metas = graph.metas
        # Provenance is read only where it is written back, from the graph's columns.
        prov_of = graph.prov if graph.provenance is not None else _no_prov
        set_prov = self.set_prov
        create = fx_graph.create_node
        for i, node in enumerate(graph.nodes):
            kind = type(node)
            if kind is ir.CallFunction:
                assert isinstance(node, ir.CallFunction)
                fx_node = create(
                    "call_function",
                    resolve_target(node.target),
                    tuple([arg(a, env) for a in node.args]),
                    {k: arg(v, env) for k, v in node.kwargs},
                    name=node.name,
                )
                meta_id = node.meta_id
                if meta_id is not None:
                    val = val_of(metas[meta_id])
                    if val is not _MISSING:
                        fx_node.meta["val"] = val
                set_prov(fx_node, prov_of(i))
            elif kind is ir.Placeholder:
                assert isinstance(node, ir.Placeholder)
                fx_node = create("placeholder", node.name, name=node.name)
                meta_id = node.meta_id
                if meta_id is not None:
                    val = val_of(metas[meta_id], False)
                    if val is not _MISSING:
                        fx_node.meta["val"] = val
                set_prov(fx_node, prov_of(i))
            elif kind is ir.GetAttr:
                assert isinstance(node, ir.GetAttr)
                target = node.target
                if not hasattr(root, target):
                    meta = graph.meta(node)
                    if isinstance(meta, ir.DelegateMeta):
                        root.add_module(target, self.lowered_module(meta.module, node.name))
                    else:
                        sub = subgraphs.get(target)
                        if sub is None:
                            raise ConversionError(
                                f"get_attr node {node.name!r} names {target!r}, which is neither a "
                                f"subgraph of {path or 'the program graph'} nor a lowered module"
                            )
                        root.add_module(target, self.graph_module(sub, f"{path}.{target}" if path else target))
                fx_node = create("get_attr", target, name=node.name)
                set_prov(fx_node, prov_of(i))
            elif kind is ir.Output:
                assert isinstance(node, ir.Output)
                fx_node = create(
                    "output", "output", (tuple([arg(a, env) for a in node.args]),), name=node.name
                )
            else:
                raise UnsupportedError(f"node kind {type(node).__name__} is not supported")
            if fx_node.name != node.name:
                raise ConversionError(
                    f"node name {node.name!r} is used twice or is not a valid FX name (FX renamed it "
                    f"{fx_node.name!r}); run texir.ir.verify"
                )
            env[node.name] = fx_node
        return root, fx_graph

    def lowered_module(self, name: str, node_name: str) -> delegate_op.LoweredBackendModule:
        module = self.lowered_torch.get(name)
        if module is None:
            lowered = self.lowered.get(name)
            if lowered is None:
                raise ConversionError(
                    f"get_attr node {node_name!r} names lowered module {name!r}, which is not in "
                    "Program.lowered_modules"
                )
            module = self.lowered_torch[name] = delegate_op.LoweredBackendModule(lowered)
        return module

    # -- signature ---------------------------------------------------------------------------

    def argument_spec(self, a: ir.Argument, metas: dict[str, ir.ValueMeta | None], name: str = "") -> Any:
        if isinstance(a, ir.Ref):
            meta = metas.get(a.name)
            spec_type = _ARG_SPEC_BY_META.get(type(meta), gs.TensorArgument)
            if spec_type is gs.CustomObjArgument:
                assert isinstance(meta, ir.CustomObjMeta)
                return gs.CustomObjArgument(name=a.name, class_fqn=meta.class_fqn)
            return spec_type(name=a.name)
        return gs.ConstantArgument(name=name, value=self.arg(a, {}))

    def signature(self, metas: dict[str, ir.ValueMeta | None], placeholder_names: list[str],
                  output_args: Sequence[ir.Argument]) -> gs.ExportGraphSignature:
        sig = self.program.signature
        if len(sig.inputs) != len(placeholder_names) or len(sig.outputs) != len(output_args):
            raise ConversionError(
                f"signature has {len(sig.inputs)} inputs and {len(sig.outputs)} outputs but the graph "
                f"has {len(placeholder_names)} placeholders and {len(output_args)} outputs; run texir.ir.verify"
            )
        inputs = []
        for spec, ph in zip(sig.inputs, placeholder_names):
            if isinstance(spec, ir.UserInput):
                inputs.append(gs.InputSpec(gs.InputKind.USER_INPUT, self.argument_spec(spec.arg, metas, ph), None))
            elif isinstance(spec, ir.ParameterInput):
                inputs.append(gs.InputSpec(gs.InputKind.PARAMETER, gs.TensorArgument(name=spec.name), spec.target))
            elif isinstance(spec, ir.BufferInput):
                inputs.append(gs.InputSpec(
                    gs.InputKind.BUFFER, gs.TensorArgument(name=spec.name), spec.target, spec.persistent
                ))
            elif isinstance(spec, ir.ConstantTensorInput):
                inputs.append(gs.InputSpec(
                    gs.InputKind.CONSTANT_TENSOR, gs.TensorArgument(name=spec.name), spec.target
                ))
            elif isinstance(spec, ir.CustomObjInput):
                meta = metas.get(spec.name)
                fqn = meta.class_fqn if isinstance(meta, ir.CustomObjMeta) else ""
                inputs.append(gs.InputSpec(
                    gs.InputKind.CUSTOM_OBJ, gs.CustomObjArgument(name=spec.name, class_fqn=fqn), spec.target
                ))
            else:
                inputs.append(gs.InputSpec(gs.InputKind.TOKEN, gs.TokenArgument(name=spec.name), None))
        outputs = []
        for out, oarg in zip(sig.outputs, output_args):
            if isinstance(out, ir.UserOutput):
                outputs.append(gs.OutputSpec(gs.OutputKind.USER_OUTPUT, self.argument_spec(out.arg, metas), None))
                continue
            kind, target = _OUTPUT_KINDS[type(out)], getattr(out, "target", None)
            arg_type = gs.TokenArgument if kind is gs.OutputKind.TOKEN else gs.TensorArgument
            outputs.append(gs.OutputSpec(kind, arg_type(name=out.name), target))
        return gs.ExportGraphSignature(input_specs=inputs, output_specs=outputs)

    def module_call_graph(self, metas: dict[str, ir.ValueMeta | None], n_user_inputs: int,
                          n_user_outputs: int) -> list[ep_mod.ModuleCallEntry]:
        entries = []
        for entry in self.program.module_call_graph:
            signature = None
            s = entry.signature
            if s is not None:
                signature = ep_mod.ModuleCallSignature(
                    inputs=[self.argument_spec(a, metas) for a in s.inputs],
                    outputs=[self.argument_spec(a, metas) for a in s.outputs],
                    in_spec=_load_spec(s.in_spec, f"module_call_graph entry {entry.fqn!r}"),
                    out_spec=_load_spec(s.out_spec, f"module_call_graph entry {entry.fqn!r}"),
                    forward_arg_names=list(s.forward_arg_names) if s.forward_arg_names is not None else None,
                )
            entries.append(ep_mod.ModuleCallEntry(fqn=entry.fqn, signature=signature))
        if not entries:
            # A Program built by hand has no call graph; give ep.module() the flat calling
            # convention: positional user inputs in, a tuple of user outputs out.
            in_spec = pytree.tree_flatten(((0,) * n_user_inputs, {}))[1]
            out_spec = pytree.tree_flatten((0,) * n_user_outputs)[1]
            entries.append(ep_mod.ModuleCallEntry(fqn="", signature=ep_mod.ModuleCallSignature(
                inputs=[], outputs=[], in_spec=in_spec, out_spec=out_spec
            )))
        return entries

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        sig = self.program.signature
        params = {s.target for s in sig.inputs if isinstance(s, ir.ParameterInput)}
        mutable = {s.target for s in sig.outputs if isinstance(s, (ir.BufferMutation, ir.UserInputMutation))}
        buffers = {s.target: s.persistent for s in sig.inputs if isinstance(s, ir.BufferInput)}
        constants = {s.target for s in sig.inputs if isinstance(s, ir.ConstantTensorInput)}
        state_dict: dict[str, Any] = {}
        constant_table: dict[str, Any] = {}
        for entry in self.program.state:
            target = entry.target
            where = f"state entry {target!r}"
            if target in params:
                t = tensor_from_data(entry.value, where=where)
                state_dict[target] = torch.nn.Parameter(t, requires_grad=entry.value.meta.requires_grad)
            elif target in buffers:
                # Buffers may be written by the running program: never alias the IR's payload.
                t = tensor_from_data(entry.value, where=where, copy=True)
                (state_dict if buffers[target] else constant_table)[target] = t
            elif target in constants:
                constant_table[target] = tensor_from_data(entry.value, where=where, copy=target in mutable)
            else:
                state_dict[target] = tensor_from_data(entry.value, where=where)
        return state_dict, constant_table

    def exported_program(self) -> ExportedProgram:
        program = self.program
        verifier = _VERIFIERS.get(program.dialect)
        if verifier is None:
            raise UnsupportedError(
                f"program dialect {program.dialect!r} cannot be rebuilt as a torch ExportedProgram; "
                f"only {sorted(_VERIFIERS)} programs can"
            )
        state_dict, constants = self.state()
        # ExportedProgram builds the GraphModule itself: handing it the graph saves a codegen pass.
        root, fx_graph = self.build_graph(program.graph, "")
        table = program.graph.metas
        metas: dict[str, ir.ValueMeta | None] = {}
        placeholder_names: list[str] = []
        for node in program.graph.nodes:
            if not isinstance(node, ir.Output):
                metas[node.name] = None if node.meta_id is None else table[node.meta_id]
                if isinstance(node, ir.Placeholder):
                    placeholder_names.append(node.name)
        out = program.graph.nodes[-1]
        if not isinstance(out, ir.Output):
            raise ConversionError("the program graph does not end in an Output node; run texir.ir.verify")
        signature = self.signature(metas, placeholder_names, out.args)
        n_user_in = sum(isinstance(s, ir.UserInput) for s in program.signature.inputs)
        n_user_out = sum(isinstance(s, ir.UserOutput) for s in program.signature.outputs)
        call_graph = self.module_call_graph(metas, n_user_in, n_user_out)
        range_constraints = {sym: self.ranges[sym] for sym in self.symbols.values()}
        try:
            return ExportedProgram(
                root=root,
                graph=fx_graph,
                graph_signature=signature,
                state_dict=state_dict,
                range_constraints=range_constraints,
                module_call_graph=call_graph,
                constants=constants,
                verifiers=[verifier],
            )
        except Exception as exc:  # torch raises many types; report them as one texir error
            raise ConversionError(f"torch rejected the rebuilt ExportedProgram: {exc}") from exc


_VERIFIERS: dict[str, type[Verifier]] = {"ATEN": Verifier, "TRAINING": TrainingIRVerifier}

_ARG_SPEC_BY_META: dict[type, Any] = {
    ir.TensorMeta: gs.TensorArgument,
    ir.SymIntMeta: gs.SymIntArgument,
    ir.SymFloatMeta: gs.SymFloatArgument,
    ir.SymBoolMeta: gs.SymBoolArgument,
    ir.CustomObjMeta: gs.CustomObjArgument,
    ir.TokenMeta: gs.TokenArgument,
}

_OUTPUT_KINDS: dict[type, gs.OutputKind] = {
    ir.BufferMutation: gs.OutputKind.BUFFER_MUTATION,
    ir.UserInputMutation: gs.OutputKind.USER_INPUT_MUTATION,
    ir.LossOutput: gs.OutputKind.LOSS_OUTPUT,
    ir.GradientToParameter: gs.OutputKind.GRADIENT_TO_PARAMETER,
    ir.GradientToUserInput: gs.OutputKind.GRADIENT_TO_USER_INPUT,
    ir.TokenOutput: gs.OutputKind.TOKEN,
}


def to_exported_program(program: ir.Program) -> ExportedProgram:
    """Rebuild a runnable ExportedProgram (fake-tensor metadata, provenance, state) from a Program."""
    if not isinstance(program, ir.Program):
        raise ConversionError(f"expected a texir.ir.Program, got {type(program).__name__}")
    with gc_paused(), _lazy_codegen():
        return _ToFx(program).exported_program()


@contextlib.contextmanager
def _lazy_codegen() -> Iterator[None]:
    # ExportedProgram wraps the graph in a GraphModule, whose constructor generates and compiles
    # Python source for the whole graph: more than half of IR -> FX time on large graphs. torch's
    # own _LazyGraphModule defers that to the first call of forward/code (inductor uses it for
    # the same reason), so have ExportedProgram build one of those while we construct it.
    original = getattr(ep_mod, "_create_graph_module_for_export", None)
    if original is None:
        yield
        return

    def create_lazy(root: Any, graph: torch.fx.Graph) -> torch.fx.GraphModule:
        return _LazyGraphModule(root, graph)

    ep_mod._create_graph_module_for_export = create_lazy
    try:
        yield
    finally:
        ep_mod._create_graph_module_for_export = original


