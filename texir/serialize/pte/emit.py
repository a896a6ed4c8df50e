"""Emit IR Programs as `.pte` programs: out variants, static views, memory planning, constants, delegates."""

from __future__ import annotations

import ast
import math
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Union

import msgspec
from pydantic import BaseModel, ConfigDict, Field

from texir.errors import PteError
from texir.ir.analysis import iter_refs
from texir.ir.literals import literal_arg
from texir.ir.blob import Blob
from texir.ir.types import (
    SpecialFloat,
    DTYPE_ITEMSIZE,
    Argument,
    BoolArg,
    BufferInput,
    BufferMutation,
    CallFunction,
    ConstantTensorInput,
    DelegateMeta,
    Graph,
    SubgraphMeta,
    DeviceArg,
    DType,
    DTypeArg,
    FloatArg,
    GetAttr,
    IntArg,
    LayoutArg,
    ListArg,
    MemoryFormat,
    MemoryFormatArg,
    NoneArg,
    NoneMeta,
    Output,
    ParameterInput,
    Placeholder,
    Program,
    Ref,
    ScalarMeta,
    StrArg,
    SymBoolMeta,
    SymExprArg,
    SymFloatMeta,
    SymIntMeta,
    TensorMeta,
    TupleArg,
    TupleMeta,
    UserInput,
    UserOutput,
    ValueMeta,
)
from texir.serialize.pte.memory_plan import Interval, PlannerName, align_up, check_plan, plan_memory
from texir.serialize.pte.schema import (
    AllocationDetails,
    BackendDelegate,
    BackendDelegateDataReference,
    BackendDelegateInlineData,
    Bool,
    BoolList,
    Buffer,
    Chain,
    CompileSpec,
    ContainerMetadata,
    DataLocation,
    DelegateCall,
    Double,
    DoubleList,
    EValue,
    ExecutionPlan,
    Instruction,
    Int,
    IntList,
    JumpFalseCall,
    KernelCall,
    MoveCall,
    KernelTypes,
    Null,
    Operator,
    OptionalTensorList,
    PteProgram,
    ScalarType,
    String,
    Tensor,
    TensorList,
    TensorShapeDynamism,
)
from texir.serialize.pte.schema import Program as PteRoot

if TYPE_CHECKING:
    from texir.adapters.op_schemas import ArgSchema, OpSchema
    from texir.ir.types import LoweredBackendModule
    from texir.serialize.pte.codec import PteOptions

__all__ = ["EmitError", "EmitOptions", "emit", "lowered_module_buffer"]


class EmitError(PteError):
    """An IR Program cannot be emitted as a `.pte` program."""


class EmitOptions(BaseModel):
    """Emitter options (validated)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    planner: PlannerName = "greedy"
    """Memory planner: ExecuTorch's default greedy packing, or one slot per tensor ('naive')."""
    alignment: int = Field(default=16, ge=1)
    """Every planned tensor's size is rounded up to this many bytes."""
    alloc_graph_input: bool = True
    """Plan user-input tensors (the runtime copies inputs into the arena), as ExecuTorch does."""
    alloc_graph_output: bool = True
    """Plan output tensors, as ExecuTorch does. If False, outputs produced directly by a kernel get no
    allocation and the caller supplies their memory (the pybindings do)."""
    check_plan: bool = False
    """Verify that the memory plan never overlaps live tensors (tests turn this on)."""


DTYPE_TO_SCALAR_TYPE: dict[DType, ScalarType] = {
    DType.uint8: ScalarType.BYTE, DType.int8: ScalarType.CHAR, DType.int16: ScalarType.SHORT,
    DType.int32: ScalarType.INT, DType.int64: ScalarType.LONG, DType.float16: ScalarType.HALF,
    DType.float32: ScalarType.FLOAT, DType.float64: ScalarType.DOUBLE, DType.bool: ScalarType.BOOL,
    DType.qint8: ScalarType.QINT8, DType.quint8: ScalarType.QUINT8, DType.qint32: ScalarType.QINT32,
    DType.bfloat16: ScalarType.BFLOAT16, DType.quint4x2: ScalarType.QUINT4X2,
    DType.quint2x4: ScalarType.QUINT2X4, DType.bits16: ScalarType.BITS16,
    DType.float8_e5m2: ScalarType.FLOAT8E5M2, DType.float8_e4m3fn: ScalarType.FLOAT8E4M3FN,
    DType.float8_e5m2fnuz: ScalarType.FLOAT8E5M2FNUZ, DType.float8_e4m3fnuz: ScalarType.FLOAT8E4M3FNUZ,
    DType.uint16: ScalarType.UINT16, DType.uint32: ScalarType.UINT32, DType.uint64: ScalarType.UINT64,
}

_SCALAR_TYPE_TO_DTYPE: dict[ScalarType, DType] = {v: k for k, v in DTYPE_TO_SCALAR_TYPE.items()}

# Binary ops whose operands exir casts to one dtype first (RemoveMixedTypeOperators).
_MIXED_TYPE_OPS = frozenset({
    "aten::add.Tensor", "aten::sub.Tensor", "aten::mul.Tensor", "aten::div.Tensor",
    "aten::div.Tensor_mode", "aten::minimum.default",
})

# torch's c10::MemoryFormat codes, as the runtime reads a memory_format argument.
_MEMORY_FORMAT_CODE: dict[MemoryFormat, int] = {
    MemoryFormat.contiguous_format: 0, MemoryFormat.preserve_format: 1,
    MemoryFormat.channels_last: 2, MemoryFormat.channels_last_3d: 3,
}

# Python SymInt arithmetic (FX targets) -> ExecuTorch prim kernels (EdgeToBackendOpsPass).
_SYM_ARITH: dict[str, str] = {
    "_operator::add": "executorch_prim::add.Scalar",
    "_operator::sub": "executorch_prim::sub.Scalar",
    "_operator::mul": "executorch_prim::mul.Scalar",
    "_operator::floordiv": "executorch_prim::floordiv.Scalar",
    "_operator::truediv": "executorch_prim::truediv.Scalar",
    "_operator::mod": "executorch_prim::mod.Scalar",
    "_operator::eq": "executorch_prim::eq.Scalar",
    "_operator::gt": "executorch_prim::gt.Scalar",
    "_operator::lt": "executorch_prim::lt.Scalar",
    "_operator::ge": "executorch_prim::ge.Scalar",
    "_operator::le": "executorch_prim::le.Scalar",
    "_operator::neg": "executorch_prim::neg.Scalar",
    "math::ceil": "executorch_prim::ceil.Scalar",
    "builtins::round": "executorch_prim::round.Scalar",
    "math::trunc": "executorch_prim::trunc.Scalar",
    "torch::sym_float": "executorch_prim::sym_float.Scalar",
    "torch::sym_int": "executorch_prim::sym_int.Scalar",
    "torch::sym_max": "executorch_prim::sym_max.Scalar",
    "torch::sym_min": "executorch_prim::sym_min.Scalar",
    "torch::sym_not": "executorch_prim::sym_not.Scalar",
}

# MemoryFormatOpsPass: memory-format ops -> ExecuTorch's dim-order ops.
_DIM_ORDER_OPS: dict[str, str] = {
    "aten::_to_copy.default": "dim_order_ops::_to_dim_order_copy.default",
    "aten::clone.default": "dim_order_ops::_clone_dim_order.default",
    "aten::empty.memory_format": "dim_order_ops::_empty_dim_order.default",
}

_SLICES = frozenset({"aten::slice.Tensor", "aten::slice_copy.Tensor"})

# RemoveGraphAssertsPass: runtime checks with no ExecuTorch kernel are dropped.
_DROPPED = frozenset({
    "aten::_assert_tensor_metadata.default", "aten::_assert_async.default", "aten::_assert_async.msg",
    "aten::_assert_scalar.default", "aten::sym_constrain_range.default",
    "aten::sym_constrain_range_for_size.default", "aten::_functional_assert_async.msg",
    "aten::_functional_sym_constrain_range.default",
    "aten::_functional_sym_constrain_range_for_size.default",
})
# Graph plumbing that never becomes an instruction.
_GETITEM = "_operator::getitem"
_CALL_DELEGATE = "texir::call_delegate"
# Ops whose functional form the runtime executes with the mutated input as the return slot.
_WRITE_BACK = "aten::copy_.default"
# Only plain reshapes become aliases (ReplaceViewCopyWithViewPass); other views are copied.
_ALIASABLE_VIEWS = frozenset({"aten::view.default", "aten::_unsafe_view.default", "aten::reshape.default",
                              "aten::view_copy.default"})

_PendingValue = Union["_PendingTensor", KernelTypes]


@dataclass
class _PendingTensor:
    """A Tensor value whose allocation is filled in after memory planning."""

    scalar_type: ScalarType
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]
    requires_grad: bool
    dynamism: TensorShapeDynamism
    data_buffer_idx: int = 0
    storage: int | None = None


@dataclass
class _Storage:
    size: int
    start: int
    end: int


@dataclass
class _ProgramState:
    """Tables shared by all methods of one program: constants and delegate blobs, deduplicated."""

    constants: list[Blob] = field(default_factory=lambda: [Blob(b"")])
    constant_index: dict[tuple[str, int], int] = field(default_factory=dict)
    delegate_data: list[Blob] = field(default_factory=list)
    delegate_index: dict[tuple[str, int], int] = field(default_factory=dict)

    def constant(self, blob: Blob, digest: str | None = None) -> int:
        # The IR already carries each state tensor's SHA-256; hashing again would read every weight.
        key = (digest or blob.digest(), blob.nbytes)
        index = self.constant_index.get(key)
        if index is None:
            index = len(self.constants)
            self.constants.append(blob)
            self.constant_index[key] = index
        return index

    def delegate_blob(self, blob: Blob) -> int:
        key = (blob.digest(), blob.nbytes)
        index = self.delegate_index.get(key)
        if index is None:
            index = len(self.delegate_data)
            self.delegate_data.append(blob)
            self.delegate_index[key] = index
        return index


def _split_op(target: str) -> tuple[str, str]:
    name, _, overload = target.partition(".")
    # ExecuTorch's prim kernels are registered with a literal "default" overload name.
    if overload == "default" and not name.startswith("executorch_prim::"):
        overload = ""
    return name, overload


class _Bounds:
    """Upper bounds of symbolic dims from the program's range constraints."""

    def __init__(self, program: Program) -> None:
        self._max: dict[str, int | None] = {rc.symbol: rc.max for rc in program.range_constraints}
        self._cache: dict[str, int] = {}

    def upper(self, dim: int | str, *, where: str) -> int:
        if isinstance(dim, int):
            return dim
        cached = self._cache.get(dim)
        if cached is not None:
            return cached
        try:
            value = _eval_bound(ast.parse(dim, mode="eval").body, self._max)
        except _Unbounded as exc:
            raise EmitError(
                f"{where}: dimension {dim!r} has no upper bound (symbol {exc}); give its "
                "torch.export.Dim a max=... so the tensor can be planned (DYNAMIC_BOUND)"
            ) from None
        except (SyntaxError, ValueError, TypeError, ZeroDivisionError) as exc:
            raise EmitError(f"{where}: cannot bound dimension {dim!r}: {exc}") from None
        result = int(math.ceil(value))
        self._cache[dim] = result
        return result


class _Unbounded(Exception):
    pass


_BOUND_FUNCS: dict[str, Callable[..., float]] = {
    "Max": max, "Min": min, "floor": math.floor, "ceiling": math.ceil, "FloorToInt": math.floor,
    "CeilToInt": math.ceil, "FloorDiv": lambda a, b: a // b, "Mod": lambda a, b: a % b,
    "CleanDiv": lambda a, b: a // b, "IntTrueDiv": lambda a, b: a / b,
}
_BOUND_BINOPS: dict[type, Callable[[float, float], float]] = {
    ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a**b,
}


def _eval_bound(node: ast.expr, maxima: Mapping[str, int | None]) -> float:
    """Evaluate a sympy-printed size expression with every symbol at its maximum."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.Name):
        bound = maxima.get(node.id)
        if bound is None or bound > 2**62:
            raise _Unbounded(node.id)
        return bound
    if isinstance(node, ast.BinOp) and type(node.op) in _BOUND_BINOPS:
        return _BOUND_BINOPS[type(node.op)](_eval_bound(node.left, maxima), _eval_bound(node.right, maxima))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval_bound(node.operand, maxima)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _BOUND_FUNCS:
        return _BOUND_FUNCS[node.func.id](*(_eval_bound(a, maxima) for a in node.args))
    raise ValueError(f"unsupported expression {ast.dump(node)}")


def _dim_order(strides: tuple[int, ...]) -> tuple[int, ...]:
    # The dim with the largest stride comes first; ties keep dim order (size-1 dims).
    return tuple(sorted(range(len(strides)), key=lambda d: -strides[d]))


class _MethodEmitter:
    def __init__(self, name: str, program: Program, state: _ProgramState, options: EmitOptions) -> None:
        self.name = name
        self.program = program
        self.state = state
        self.options = options
        self.bounds = _Bounds(program)
        self.values: list[_PendingValue] = []
        self.by_name: dict[str, int | tuple[int, ...]] = {}
        self.metas: dict[str, ValueMeta | None] = {}
        self.storages: list[_Storage] = []
        self.operators: list[Operator] = []
        self.operator_index: dict[tuple[str, str], int] = {}
        self.instructions: list[Instruction] = []
        self.delegates: list[BackendDelegate] = []
        self.inputs: list[int] = []
        self.outputs: list[int] = []
        self.step = 0
        self.last_step = len(program.graph.nodes)
        self.graph = program.graph
        self._output_names: frozenset[str] | None = None
        self.lowered = {m.name: m.module for m in program.lowered_modules}
        self.state_by_target = {entry.target: entry.value for entry in program.state}

    # --- values -------------------------------------------------------------------------------

    def add(self, value: _PendingValue) -> int:
        self.values.append(value)
        return len(self.values) - 1

    def tensor_value(
        self, meta: TensorMeta, *, where: str, planned: bool, start: int,
        allowed_orders: frozenset[tuple[int, ...]] | None = None,
        forced_order: tuple[int, ...] | None = None,
    ) -> int:
        """A new Tensor value. With `allowed_orders`, a non-contiguous dim order from the metadata is
        kept only if one of the op's tensor inputs has it (as ExecuTorch re-derives layouts after
        turning views into copies); otherwise the tensor is contiguous."""
        sizes = tuple(self.bounds.upper(d, where=where) for d in meta.shape)
        dynamic = any(isinstance(d, str) for d in meta.shape)
        order = _dim_order(tuple(self.bounds.upper(s, where=where) for s in meta.strides))
        if forced_order is not None and len(forced_order) == len(sizes):
            order = forced_order
        elif allowed_orders is not None and order not in allowed_orders:
            order = tuple(range(len(sizes)))
        if meta.dtype not in DTYPE_TO_SCALAR_TYPE:
            raise EmitError(f"{where}: dtype {meta.dtype} has no ExecuTorch scalar type")
        tensor = _PendingTensor(
            scalar_type=DTYPE_TO_SCALAR_TYPE[meta.dtype], sizes=sizes, dim_order=order,
            requires_grad=meta.requires_grad,
            dynamism=TensorShapeDynamism.DYNAMIC_BOUND if dynamic else TensorShapeDynamism.STATIC,
        )
        if planned:
            nbytes = math.prod(sizes) * DTYPE_ITEMSIZE[meta.dtype]
            tensor.storage = len(self.storages)
            self.storages.append(_Storage(size=nbytes, start=start, end=start))
        return self.add(tensor)

    def use(self, index: int) -> None:
        value = self.values[index]
        if isinstance(value, _PendingTensor) and value.storage is not None:
            storage = self.storages[value.storage]
            storage.end = max(storage.end, self.step)
        elif isinstance(value, (TensorList, OptionalTensorList)):
            for item in value.items:
                if item >= 0:
                    self.use(item)

    def ref(self, name: str, *, where: str) -> int:
        found = self.by_name.get(name)
        if found is None:
            raise EmitError(f"{where}: value {name!r} is used before it is defined or has no value")
        if isinstance(found, tuple):
            raise EmitError(
                f"{where}: multi-output value {name!r} is used directly; read its items with getitem"
            )
        self.use(found)
        return found

    def constant_tensor(self, meta: TensorMeta, blob: Blob, *, where: str, digest: str | None = None) -> int:
        if any(isinstance(d, str) for d in meta.shape):
            raise EmitError(f"{where}: constant tensors cannot have symbolic shapes")
        sizes = tuple(int(d) for d in meta.shape)
        expected = math.prod(sizes) * DTYPE_ITEMSIZE[meta.dtype]
        if blob.nbytes != expected:
            raise EmitError(
                f"{where}: constant holds {blob.nbytes} bytes but {meta.dtype}{list(sizes)} needs {expected}"
            )
        if meta.dtype not in DTYPE_TO_SCALAR_TYPE:
            raise EmitError(f"{where}: dtype {meta.dtype} has no ExecuTorch scalar type")
        # IR tensor data is stored contiguous, so constants always get the contiguous dim order.
        return self.add(_PendingTensor(
            scalar_type=DTYPE_TO_SCALAR_TYPE[meta.dtype], sizes=sizes, dim_order=tuple(range(len(sizes))),
            requires_grad=meta.requires_grad, dynamism=TensorShapeDynamism.STATIC,
            data_buffer_idx=self.state.constant(blob, digest),
        ))

    def scalar_tensor(self, arg: Argument, *, where: str) -> int:
        """ScalarToTensorPass: a Python scalar where the schema wants a Tensor becomes a 0-dim constant."""
        if isinstance(arg, BoolArg):
            dtype, data = DType.bool, struct.pack("<?", arg.value)
        elif isinstance(arg, IntArg):
            dtype, data = DType.int64, struct.pack("<q", arg.value)
        elif isinstance(arg, FloatArg):
            dtype, data = DType.float32, struct.pack("<f", _float(arg.value))
        else:
            raise EmitError(f"{where}: cannot turn {type(arg).__name__} into a tensor argument")
        return self.constant_tensor(TensorMeta(dtype=dtype, shape=(), strides=()), Blob(data), where=where)

    def operator(self, target: str) -> int:
        key = _split_op(target)
        index = self.operator_index.get(key)
        if index is None:
            index = len(self.operators)
            self.operators.append(Operator(name=key[0], overload=key[1]))
            self.operator_index[key] = index
        return index

    # --- arguments ----------------------------------------------------------------------------

    def scalar(self, arg: Argument, *, where: str) -> int:
        """A non-tensor argument as a fresh value (or the value of a symbolic int node)."""
        if isinstance(arg, Ref):
            return self.ref(arg.name, where=where)
        if isinstance(arg, NoneArg):
            return self.add(Null())
        if isinstance(arg, BoolArg):
            return self.add(Bool(bool_val=arg.value))
        if isinstance(arg, IntArg):
            return self.add(Int(int_val=arg.value))
        if isinstance(arg, FloatArg):
            return self.add(Double(double_val=_float(arg.value)))
        if isinstance(arg, StrArg):
            return self.add(String(string_val=arg.value))
        if isinstance(arg, DTypeArg):
            if arg.value not in DTYPE_TO_SCALAR_TYPE:
                raise EmitError(f"{where}: dtype {arg.value} has no ExecuTorch scalar type")
            return self.add(Int(int_val=int(DTYPE_TO_SCALAR_TYPE[arg.value])))
        if isinstance(arg, LayoutArg):
            return self.add(Int(int_val=0 if arg.value == "strided" else 1))
        if isinstance(arg, MemoryFormatArg):
            return self.add(Int(int_val=_MEMORY_FORMAT_CODE[arg.value]))
        if isinstance(arg, DeviceArg):
            return self.add(Int(int_val=0))
        if isinstance(arg, SymExprArg):
            raise EmitError(
                f"{where}: symbolic expression {arg.expr!r} used directly as an argument; "
                "the runtime needs it computed by a sym op node"
            )
        raise EmitError(f"{where}: unsupported argument {type(arg).__name__}")

    def argument(self, schema: ArgSchema, arg: Argument, *, where: str) -> int:
        kind = schema.kind
        items = arg.items if isinstance(arg, (ListArg, TupleArg)) else None
        if isinstance(arg, NoneArg) and schema.optional:
            return self.add(Null())
        if kind == "tensor" or kind == "optional_tensor":
            if isinstance(arg, Ref):
                return self.ref(arg.name, where=where)
            if isinstance(arg, NoneArg):
                # A non-optional Tensor given None: an empty placeholder tensor, as exir writes it.
                return self.add(_PendingTensor(ScalarType.BYTE, (0,), (0,), False, TensorShapeDynamism.STATIC))
            return self.scalar_tensor(arg, where=where)
        if kind in ("tensor_list", "optional_tensor_list") and items is not None:
            indices = []
            for item in items:
                if isinstance(item, NoneArg) and kind == "optional_tensor_list":
                    indices.append(-1)
                elif isinstance(item, Ref):
                    indices.append(self.ref(item.name, where=where))
                else:
                    indices.append(self.scalar_tensor(item, where=where))
            if kind == "tensor_list":
                return self.add(TensorList(items=tuple(indices)))
            return self.add(OptionalTensorList(items=tuple(indices)))
        if kind == "int_list":
            seq = items if items is not None else (arg,)
            return self.add(IntList(items=tuple(self.scalar(item, where=where) for item in seq)))
        if kind == "float_list":
            seq = items if items is not None else (arg,)
            return self.add(DoubleList(items=tuple(_float(_literal_float(i, where)) for i in seq)))
        if kind == "bool_list":
            seq = items if items is not None else (arg,)
            bools = []
            for item in seq:
                if not isinstance(item, BoolArg):
                    raise EmitError(f"{where}: bool[] argument {schema.name!r} holds {type(item).__name__}")
                bools.append(item.value)
            return self.add(BoolList(items=tuple(bools)))
        if kind == "float" and isinstance(arg, IntArg):
            return self.add(Double(double_val=float(arg.value)))
        if items is not None:
            raise EmitError(f"{where}: argument {schema.name!r} of kind {kind} got a list")
        return self.scalar(arg, where=where)

    def bind(self, node: CallFunction, schema: OpSchema) -> dict[str, Argument]:
        """Match the node's positional and keyword arguments to the schema by name."""
        bound: dict[str, Argument] = {}
        positional = [a for a in schema.arguments if not a.kwarg_only]
        if len(node.args) > len(positional):
            raise EmitError(
                f"node {node.name!r} ({node.target}): {len(node.args)} positional arguments, schema "
                f"{schema.target} takes {len(positional)}"
            )
        for a, value in zip(positional, node.args):
            bound[a.name] = value
        names = {a.name for a in schema.arguments}
        for key, value in node.kwargs:
            if key not in names:
                raise EmitError(f"node {node.name!r} ({node.target}): unknown keyword argument {key!r}")
            bound[key] = value
        return bound

    # --- nodes --------------------------------------------------------------------------------

    def emit_method(self) -> ExecutionPlan:
        program = self.program
        nodes = program.graph.nodes
        specs = program.signature.inputs
        placeholders = [n for n in nodes if isinstance(n, Placeholder)]
        if len(specs) != len(placeholders):
            raise EmitError(
                f"method {self.name!r}: signature has {len(specs)} inputs for {len(placeholders)} placeholders; "
                "run texir.ir.verify(program)"
            )
        output = nodes[-1]
        if not isinstance(output, Output):
            raise EmitError(f"method {self.name!r}: the graph does not end with an Output node")
        if len(program.signature.outputs) != len(output.args):
            raise EmitError(f"method {self.name!r}: signature outputs do not match the Output node")
        mutated = {
            spec.target: arg for spec, arg in zip(program.signature.outputs, output.args)
            if isinstance(spec, BufferMutation)
        }
        spec_of = dict(zip((p.name for p in placeholders), specs))
        last_step = self.last_step
        buffer_value: dict[str, int] = {}
        for step, node in enumerate(nodes):
            self.step = step
            where = f"method {self.name!r}, node {node.name!r}"
            if isinstance(node, Placeholder):
                idx = self.emit_placeholder(node, spec_of[node.name], mutated, where=where)
                spec = spec_of[node.name]
                if isinstance(spec, BufferInput) and spec.target in mutated:
                    buffer_value[spec.target] = idx
                    pending = self.values[idx]
                    if isinstance(pending, _PendingTensor) and pending.storage is not None:
                        self.storages[pending.storage].end = last_step
            elif isinstance(node, GetAttr):
                self.metas[node.name] = self.graph.meta(node)
            elif isinstance(node, CallFunction):
                self.metas[node.name] = self.graph.meta(node)
                try:
                    self.emit_call(node, where=f"{where} ({node.target})")
                except EmitError:
                    raise
                except PteError as exc:
                    raise EmitError(f"{where} ({node.target}): {exc}") from exc
            else:
                self.emit_output(node, mutated, buffer_value, where=where)
        return self.finish()

    def emit_placeholder(
        self, node: Placeholder, spec: object, mutated: Mapping[str, Argument], *, where: str
    ) -> int:
        meta = self.graph.meta(node)
        self.metas[node.name] = meta
        if isinstance(spec, (ParameterInput, BufferInput, ConstantTensorInput)):
            if isinstance(spec, BufferInput) and spec.target in mutated:
                if not isinstance(meta, TensorMeta):
                    raise EmitError(f"{where}: mutable buffer {spec.target!r} has no tensor metadata")
                idx = self.tensor_value(meta, where=where, planned=True, start=0)
            else:
                data = self.state_by_target.get(spec.target)
                if data is None:
                    raise EmitError(f"{where}: no state entry for {spec.target!r}; the program lacks its data")
                if data.data is None:
                    raise EmitError(
                        f"{where}: state {spec.target!r} has no payload (a snapshot without data); "
                        "convert with data or load a snapshot written with include_data=True"
                    )
                idx = self.constant_tensor(data.meta, data.data, where=where, digest=data.sha256)
        elif isinstance(spec, UserInput):
            if isinstance(meta, TensorMeta):
                idx = self.tensor_value(
                    meta, where=where, planned=self.options.alloc_graph_input, start=0
                )
            elif isinstance(meta, ScalarMeta):
                idx = self.scalar(_literal(meta.value), where=where)
            elif isinstance(meta, (SymIntMeta, SymBoolMeta, SymFloatMeta)):
                idx = self.add(Int(int_val=0))
            elif isinstance(meta, NoneMeta) or meta is None:
                idx = self.add(Null())
            else:
                raise EmitError(f"{where}: user input of kind {type(meta).__name__} is not supported")
            self.inputs.append(idx)
        else:
            raise EmitError(
                f"{where}: input kind {type(spec).__name__} is not supported by the .pte emitter"
            )
        self.by_name[node.name] = idx
        return idx

    def emit_call(self, node: CallFunction, *, where: str) -> None:
        target = node.target
        if target == _GETITEM:
            self.emit_getitem(node, where=where)
            return
        if target == _CALL_DELEGATE:
            self.emit_delegate(node, where=where)
            return
        if target in _DROPPED:
            return
        if target in _SYM_ARITH:
            args = [self.scalar(a, where=where) for a in node.args]
            result = self.add(Int(int_val=0))
            self.kernel(_SYM_ARITH[target], (*args, result))
            self.by_name[node.name] = result
            return
        if target == "higher_order::cond":
            self.emit_cond(node, where=where)
            return
        if target.startswith("higher_order::"):
            raise EmitError(
                f"{where}: control flow ({target}) is not supported by the .pte emitter yet; "
                "export without torch.cond/torch.map or delegate the region"
            )
        # The serialize layer reaches torch's operator schemas only through the adapter layer.
        from texir.adapters import op_schemas as ops

        if target in ops.SYM_OPS:
            schema = ops.op_schema(target)
            bound = self.bind(node, schema)
            args = [self.argument(a, self._arg_or_default(bound, a, node, where), where=where)
                    for a in schema.arguments]
            result = self.add(Int(int_val=0))
            self.kernel(target, (*args, result))
            self.by_name[node.name] = result
            return
        if target in _ALIASABLE_VIEWS and self.emit_static_view(node, where=where):
            return
        if target in _SLICES and self.drop_noop_slice(node):
            return
        kwargs_override: dict[str, Argument] = {}
        forced: tuple[int, ...] | None = None
        if target in _DIM_ORDER_OPS:
            kwargs_override = self.dim_order_kwargs(node, where=where)
            dim_order = kwargs_override["dim_order"]
            assert isinstance(dim_order, ListArg)  # built just above
            forced = tuple(i.value for i in dim_order.items if isinstance(i, IntArg))
            target = _DIM_ORDER_OPS[target]
            node = msgspec.structs.replace(
                node, kwargs=tuple((k, v) for k, v in node.kwargs if k != "memory_format")
            )
        elif ops.is_view(target):
            copy = ops.view_copy_target(target)
            if copy is None:
                raise EmitError(f"{where}: view op has no copy variant; decompose it before emitting")
            target = copy
        functional = ops.op_schema(target)
        out = ops.out_variant(target)
        bound = self.bind(node, functional)
        bound.update(kwargs_override)
        if out is None:
            if functional.is_mutable:
                self.emit_inplace(node, functional, bound, where=where)
                return
            raise EmitError(
                f"{where}: operator {target} has no out variant, so the ExecuTorch runtime has no kernel "
                "for it; decompose it to core ATen (from_exported_program(ep, decompose=True)) or "
                "delegate it to a backend"
            )
        casts = self.promote_operands(node, target, functional, bound, where=where)
        self.emit_out_call(node, out, bound, where=where, forced_order=forced, emitted=casts)

    def _arg_or_default(
        self, bound: Mapping[str, Argument], a: ArgSchema, node: CallFunction, where: str
    ) -> Argument:
        value = bound.get(a.name)
        if value is not None:
            return value
        if a.default is not None:
            return a.default
        if a.optional:
            return NoneArg()
        raise EmitError(f"{where}: required argument {a.name!r} is missing")

    def emit_out_call(
        self, node: CallFunction, out: OpSchema, bound: Mapping[str, Argument], *, where: str,
        forced_order: tuple[int, ...] | None = None,
        emitted: Mapping[str, int] | None = None,
    ) -> None:
        meta = self.graph.meta(node)
        out_args = out.out_args
        # Allocate the out tensors first (exir's memory.alloc nodes precede their op).
        item_metas: list[ValueMeta]
        if len(out_args) == 1 and out_args[0].kind != "tensor_list":
            if not isinstance(meta, TensorMeta):
                raise EmitError(f"{where}: expected one tensor result, metadata is {type(meta).__name__}")
            item_metas = [meta]
        elif isinstance(meta, TupleMeta):
            item_metas = list(meta.items)
        else:
            raise EmitError(f"{where}: expected a tuple of results, metadata is {type(meta).__name__}")
        # With alloc_graph_output=False a method output is left to the caller (no allocation_info).
        planned = self.options.alloc_graph_output or not (
            self.graph is self.program.graph and node.name in self.output_names
        )
        # Layouts follow the op's tensor inputs (a view's metadata carries its base's strides, but
        # its copy variant writes a fresh contiguous tensor); dim-order ops say theirs explicitly.
        orders: set[tuple[int, ...]] = set()
        if forced_order is not None:
            orders.add(forced_order)
        else:
            for value in bound.values():
                for name in iter_refs(value):
                    found = self.by_name.get(name)
                    tensor = self.values[found] if isinstance(found, int) else None
                    if isinstance(tensor, _PendingTensor):
                        orders.add(tensor.dim_order)
        allowed = frozenset(orders)
        out_values: dict[str, int] = {}
        result_indices: list[int] = []
        if len(out_args) == 1 and out_args[0].kind == "tensor_list":
            items = []
            for m in item_metas:
                if not isinstance(m, TensorMeta):
                    raise EmitError(f"{where}: list result item is {type(m).__name__}, not a tensor")
                items.append(self.tensor_value(m, where=where, planned=planned, start=self.step, allowed_orders=allowed,
                    forced_order=forced_order))
            result_indices = items
            out_values[out_args[0].name] = self.add(TensorList(items=tuple(items)))
        else:
            if len(item_metas) != len(out_args):
                raise EmitError(
                    f"{where}: {len(item_metas)} results but out variant {out.target} has {len(out_args)} outs"
                )
            for a, m in zip(out_args, item_metas):
                if not isinstance(m, TensorMeta):
                    raise EmitError(f"{where}: result {a.name!r} is {type(m).__name__}, not a tensor")
                out_values[a.name] = self.tensor_value(m, where=where, planned=planned, start=self.step, allowed_orders=allowed,
                    forced_order=forced_order)
                result_indices.append(out_values[a.name])
        args: list[int] = []
        for a in out.arguments:
            if a.is_out:
                args.append(out_values[a.name])
            elif emitted and a.name in emitted:
                args.append(emitted[a.name])
            else:
                args.append(self.argument(a, self._arg_or_default(bound, a, node, where), where=where))
        if len(out_args) == 1 and out_args[0].kind != "tensor_list":
            ret = out_values[out_args[0].name]
        else:
            ret = self.add(TensorList(items=tuple(result_indices)))
        self.kernel(out.target, (*args, ret))
        if isinstance(meta, TupleMeta) or out_args[0].kind == "tensor_list":
            self.by_name[node.name] = tuple(result_indices)
        else:
            self.by_name[node.name] = result_indices[0]

    def promote_operands(
        self, node: CallFunction, target: str, schema: OpSchema, bound: Mapping[str, Argument], *, where: str
    ) -> dict[str, int]:
        """RemoveMixedTypeOperators: the tensor operands of add/sub/mul/div/minimum are cast to the
        computation dtype (the result's) first, lifted scalars included, as exir's to_edge does."""
        meta = self.graph.meta(node)
        if target not in _MIXED_TYPE_OPS or not isinstance(meta, TensorMeta):
            return {}
        want = DTYPE_TO_SCALAR_TYPE.get(meta.dtype)
        if want is None:
            return {}
        casts: dict[str, int] = {}
        for a in schema.in_args:
            if a.kind != "tensor" or a.name not in bound:
                continue
            arg = bound[a.name]
            if not isinstance(arg, (Ref, IntArg, FloatArg, BoolArg)):
                continue
            index = self.argument(a, arg, where=where)
            value = self.values[index]
            if isinstance(value, _PendingTensor) and value.scalar_type != want:
                casts[a.name] = self.cast(index, value, want, where=where)
            elif not isinstance(arg, Ref):
                casts[a.name] = index  # the lifted constant, emitted once
        return casts

    def cast(self, index: int, value: _PendingTensor, dtype: ScalarType, *, where: str) -> int:
        out = _PendingTensor(
            scalar_type=dtype, sizes=value.sizes, dim_order=value.dim_order, requires_grad=False,
            dynamism=value.dynamism,
        )
        out.storage = len(self.storages)
        self.storages.append(_Storage(
            size=math.prod(value.sizes) * DTYPE_ITEMSIZE[_SCALAR_TYPE_TO_DTYPE[dtype]],
            start=self.step, end=self.step,
        ))
        out_index = self.add(out)
        non_blocking = self.add(Bool(bool_val=False))
        dims = self.add(IntList(items=tuple(self.add(Int(int_val=d)) for d in value.dim_order)))
        self.use(index)
        self.kernel("dim_order_ops::_to_dim_order_copy.out", (index, non_blocking, dims, out_index, out_index))
        return out_index

    def emit_inplace(
        self, node: CallFunction, schema: OpSchema, bound: Mapping[str, Argument], *, where: str
    ) -> None:
        args = [self.argument(a, self._arg_or_default(bound, a, node, where), where=where)
                for a in schema.arguments]
        # The return slot of an in-place op is the mutated input itself.
        self.kernel(schema.target, (*args, args[0]))
        self.by_name[node.name] = args[0]

    def dim_order_kwargs(self, node: CallFunction, *, where: str) -> dict[str, Argument]:
        """MemoryFormatOpsPass: memory_format becomes an explicit dim_order."""
        kwargs = dict(node.kwargs)
        fmt = kwargs.get("memory_format", NoneArg())
        meta = self.graph.meta(node)
        rank = len(meta.shape) if isinstance(meta, TensorMeta) else 0
        order: tuple[int, ...]
        fmt_value = fmt.value if isinstance(fmt, MemoryFormatArg) else None
        if fmt_value in (None, MemoryFormat.preserve_format):
            # preserve_format keeps the layout of the input as emitted (not torch's view strides).
            base = node.args[0] if node.args else None
            found = self.by_name.get(base.name) if isinstance(base, Ref) else None
            base_value = self.values[found] if isinstance(found, int) else None
            if isinstance(base_value, _PendingTensor) and len(base_value.dim_order) == rank:
                order = base_value.dim_order
            else:
                order = tuple(range(rank))
        elif fmt_value == MemoryFormat.contiguous_format:
            order = tuple(range(rank))
        elif fmt_value == MemoryFormat.channels_last and rank == 4:
            order = (0, 2, 3, 1)
        elif fmt_value == MemoryFormat.channels_last_3d and rank == 5:
            order = (0, 2, 3, 4, 1)
        else:
            raise EmitError(f"{where}: memory format {fmt_value} does not fit a rank-{rank} tensor")
        return {"dim_order": ListArg(items=tuple(IntArg(value=d) for d in order))}

    def drop_noop_slice(self, node: CallFunction) -> bool:
        """RemoveNoopPass: a static slice that keeps the whole tensor is its input."""
        meta = self.graph.meta(node)
        base = node.args[0] if node.args else None
        if not isinstance(meta, TensorMeta) or not isinstance(base, Ref):
            return False
        base_meta = self.metas.get(base.name)
        found = self.by_name.get(base.name)
        if not isinstance(base_meta, TensorMeta) or not isinstance(found, int):
            return False
        shapes = (*meta.shape, *base_meta.shape)
        if any(isinstance(d, str) for d in shapes) or tuple(meta.shape) != tuple(base_meta.shape):
            return False
        self.use(found)
        self.by_name[node.name] = found
        return True

    def emit_static_view(self, node: CallFunction, *, where: str) -> bool:
        """ReplaceViewCopyWithViewPass: a reshape of a planned or constant tensor that is not a graph
        output becomes a second Tensor value over the same memory: with no instruction when static,
        through `executorch_prim::et_view` (which sets the runtime shape) when dynamic."""
        meta = self.graph.meta(node)
        if not isinstance(meta, TensorMeta):
            return False
        if node.name in self.output_names or not node.args or not isinstance(node.args[0], Ref):
            return False
        base_index = self.by_name.get(node.args[0].name)
        if not isinstance(base_index, int):
            return False
        base = self.values[base_index]
        if not isinstance(base, _PendingTensor):
            return False
        if base.storage is None and base.data_buffer_idx == 0:
            return False
        if base.dim_order != tuple(range(len(base.dim_order))):
            return False
        dynamic = any(isinstance(d, str) for d in meta.shape)
        if base.dynamism != TensorShapeDynamism.STATIC and not dynamic:
            return False
        if dynamic and base.storage is None:
            return False
        sizes = tuple(self.bounds.upper(d, where=where) for d in meta.shape)
        alias = _PendingTensor(
            scalar_type=base.scalar_type, sizes=sizes, dim_order=tuple(range(len(sizes))),
            requires_grad=meta.requires_grad,
            dynamism=TensorShapeDynamism.DYNAMIC_BOUND if dynamic else TensorShapeDynamism.STATIC,
            data_buffer_idx=base.data_buffer_idx, storage=base.storage,
        )
        if not dynamic:
            self.use(base_index)
            self.by_name[node.name] = self.add(alias)
            return True
        self.use(base_index)
        size_arg = node.args[1] if len(node.args) > 1 else dict(node.kwargs).get("size", NoneArg())
        seq = size_arg.items if isinstance(size_arg, (ListArg, TupleArg)) else (size_arg,)
        sizes_index = self.add(IntList(items=tuple(self.scalar(item, where=where) for item in seq)))
        out = self.add(alias)
        self.kernel("executorch_prim::et_view.default", (base_index, sizes_index, out))
        self.by_name[node.name] = out
        return True

    def subgraph(self, arg: Argument, *, where: str) -> Graph:
        meta = self.metas.get(arg.name) if isinstance(arg, Ref) else None
        if not isinstance(meta, SubgraphMeta):
            raise EmitError(f"{where}: branch argument is not a get_attr of a nested graph")
        for sub in self.graph.subgraphs:
            if sub.name == meta.graph:
                return sub.graph
        raise EmitError(f"{where}: nested graph {meta.graph!r} is missing from the graph's subgraphs")

    def emit_cond(self, node: CallFunction, *, where: str) -> None:
        """torch.cond inlined with jumps, as ExecuTorch's emitter does: JumpFalse(pred -> else), true
        branch, moves into the results, JumpFalse(False -> end), false branch, moves."""
        operand_arg = node.args[3] if len(node.args) == 4 else None
        if not isinstance(operand_arg, (ListArg, TupleArg)):
            raise EmitError(f"{where}: cond needs (pred, true_graph, false_graph, operands)")
        pred_arg, true_arg, false_arg = node.args[:3]
        pred = self.scalar(pred_arg, where=where)
        true_graph = self.subgraph(true_arg, where=where)
        false_graph = self.subgraph(false_arg, where=where)
        operands = [self.scalar(item, where=where) for item in operand_arg.items]
        meta = self.graph.meta(node)
        item_metas = list(meta.items) if isinstance(meta, TupleMeta) else [meta] if meta is not None else []
        outs: list[int] = []
        for m in item_metas:
            if not isinstance(m, TensorMeta):
                raise EmitError(f"{where}: cond result of kind {type(m).__name__} is not supported")
            outs.append(self.tensor_value(m, where=where, planned=True, start=self.step))
        first_storage = len(self.storages)
        jump_else = len(self.instructions)
        self.instructions.append(Instruction(instr_args=JumpFalseCall(cond_value_index=pred,
                                                                      destination_instruction=-1)))
        for src, dst in zip(self.emit_branch(true_graph, operands, outs, where=where), outs):
            self.instructions.append(Instruction(instr_args=MoveCall(move_from=src, move_to=dst)))
        false_value = self.add(Bool(bool_val=False))
        jump_end = len(self.instructions)
        self.instructions.append(Instruction(instr_args=JumpFalseCall(cond_value_index=false_value,
                                                                      destination_instruction=-1)))
        else_start = len(self.instructions)
        for src, dst in zip(self.emit_branch(false_graph, operands, outs, where=where), outs):
            self.instructions.append(Instruction(instr_args=MoveCall(move_from=src, move_to=dst)))
        self.instructions[jump_else] = Instruction(instr_args=JumpFalseCall(
            cond_value_index=pred, destination_instruction=else_start))
        self.instructions[jump_end] = Instruction(instr_args=JumpFalseCall(
            cond_value_index=false_value, destination_instruction=len(self.instructions)))
        # A move makes a result share its branch value's tensor, so branch tensors and operands
        # stay live (unshared) to the end of the method.
        for storage in self.storages[first_storage:]:
            storage.end = self.last_step
        for index in operands:
            value = self.values[index]
            if isinstance(value, _PendingTensor) and value.storage is not None:
                self.storages[value.storage].end = self.last_step
        self.by_name[node.name] = tuple(outs)

    def emit_branch(self, graph: Graph, operands: list[int], outs: list[int], *, where: str) -> list[int]:
        placeholders = [n for n in graph.nodes if isinstance(n, Placeholder)]
        if len(placeholders) != len(operands):
            raise EmitError(f"{where}: branch takes {len(placeholders)} inputs, cond passes {len(operands)}")
        saved = (self.by_name, self.metas, self.graph, self._output_names)
        self.by_name, self.metas, self.graph, self._output_names = {}, {}, graph, None
        try:
            for ph, index in zip(placeholders, operands):
                self.by_name[ph.name] = index
                self.metas[ph.name] = graph.meta(ph)
            results: list[int] = []
            for n in graph.nodes:
                if isinstance(n, GetAttr):
                    self.metas[n.name] = graph.meta(n)
                elif isinstance(n, CallFunction):
                    self.metas[n.name] = graph.meta(n)
                    self.emit_call(n, where=f"{where} > {n.name!r} ({n.target})")
                elif isinstance(n, Output):
                    results = [self.scalar(a, where=where) for a in n.args]
        finally:
            self.by_name, self.metas, self.graph, self._output_names = saved
        if len(results) != len(outs):
            raise EmitError(f"{where}: branch returns {len(results)} values, cond has {len(outs)} results")
        return results

    def emit_getitem(self, node: CallFunction, *, where: str) -> None:
        if len(node.args) != 2 or not isinstance(node.args[0], Ref) or not isinstance(node.args[1], IntArg):
            raise EmitError(f"{where}: getitem needs (value, int index)")
        source = self.by_name.get(node.args[0].name)
        if not isinstance(source, tuple):
            raise EmitError(f"{where}: getitem of {node.args[0].name!r}, which is not a multi-output value")
        index = node.args[1].value
        if not -len(source) <= index < len(source):
            raise EmitError(f"{where}: getitem index {index} out of range for {len(source)} results")
        self.by_name[node.name] = source[index]

    def emit_delegate(self, node: CallFunction, *, where: str) -> None:
        if not node.args or not isinstance(node.args[0], Ref):
            raise EmitError(f"{where}: call_delegate's first argument must name a lowered module")
        module_meta = self.metas.get(node.args[0].name)
        if not isinstance(module_meta, DelegateMeta):
            raise EmitError(f"{where}: {node.args[0].name!r} is not a get_attr of a lowered module")
        module = self.lowered.get(module_meta.module)
        if module is None:
            raise EmitError(
                f"{where}: lowered module {module_meta.module!r} is not in program.lowered_modules"
            )
        inputs = [self.scalar(arg, where=where) for arg in node.args[1:]]
        meta = self.graph.meta(node)
        item_metas = list(meta.items) if isinstance(meta, TupleMeta) else [meta] if meta is not None else []
        outs: list[int] = []
        for m in item_metas:
            if isinstance(m, TensorMeta):
                outs.append(self.tensor_value(m, where=where, planned=True, start=self.step))
            elif isinstance(m, (SymIntMeta, ScalarMeta)):
                outs.append(self.add(Int(int_val=0)))
            else:
                raise EmitError(f"{where}: delegate output of kind {type(m).__name__} is not supported")
        blob_index = self.state.delegate_blob(Blob(module.processed_bytes))
        self.delegates.append(BackendDelegate(
            id=module.backend_id,
            processed=BackendDelegateDataReference(location=DataLocation.INLINE, index=blob_index),
            compile_specs=tuple(CompileSpec(key=c.key, value=c.value) for c in module.compile_specs),
        ))
        self.instructions.append(Instruction(instr_args=DelegateCall(
            delegate_index=len(self.delegates) - 1, args=(*inputs, *outs),
        )))
        if isinstance(meta, TupleMeta):
            self.by_name[node.name] = tuple(outs)
        elif outs:
            self.by_name[node.name] = outs[0]

    def emit_output(
        self, node: Output, mutated: Mapping[str, Argument], buffer_value: Mapping[str, int], *, where: str
    ) -> None:
        # insert_write_back_for_buffers_pass: copy each new buffer value back into the buffer.
        for target, arg in mutated.items():
            if not isinstance(arg, Ref):
                raise EmitError(f"{where}: buffer mutation of {target!r} is not a value reference")
            buf = buffer_value.get(target)
            if buf is None:
                raise EmitError(f"{where}: mutated buffer {target!r} has no placeholder")
            src = self.ref(arg.name, where=where)
            false = self.add(Bool(bool_val=False))
            self.kernel(_WRITE_BACK, (buf, src, false, buf))
        for spec, arg in zip(self.program.signature.outputs, node.args):
            if isinstance(spec, BufferMutation):
                continue
            if not isinstance(spec, UserOutput):
                raise EmitError(f"{where}: output kind {type(spec).__name__} is not supported by the .pte emitter")
            if isinstance(arg, Ref):
                self.outputs.append(self.ref(arg.name, where=where))
            else:
                self.outputs.append(self.scalar(arg, where=where))

    def kernel(self, target: str, args: tuple[int, ...]) -> None:
        self.instructions.append(Instruction(instr_args=KernelCall(op_index=self.operator(target), args=args)))

    # --- planning and assembly ----------------------------------------------------------------

    def finish(self) -> ExecutionPlan:
        intervals = [Interval(size=s.size, start=s.start, end=s.end) for s in self.storages]
        plan = plan_memory(intervals, planner=self.options.planner, alignment=self.options.alignment)
        if self.options.check_plan:
            check_plan(intervals, plan)
        values: list[EValue] = []
        for value in self.values:
            if isinstance(value, _PendingTensor):
                allocation = None
                if value.storage is not None:
                    offset = plan.offsets[value.storage]
                    allocation = AllocationDetails(
                        memory_id=1, memory_offset_low=offset & 0xFFFFFFFF, memory_offset_high=offset >> 32
                    )
                values.append(EValue(val=Tensor(
                    scalar_type=value.scalar_type, sizes=value.sizes, dim_order=value.dim_order,
                    requires_grad=value.requires_grad, data_buffer_idx=value.data_buffer_idx,
                    allocation_info=allocation, shape_dynamism=value.dynamism,
                )))
            else:
                values.append(EValue(val=value))
        return ExecutionPlan(
            name=self.name,
            container_meta_type=self.container_meta(),
            values=tuple(values),
            inputs=tuple(self.inputs),
            outputs=tuple(self.outputs),
            chains=(Chain(inputs=(), outputs=(), instructions=tuple(self.instructions)),),
            operators=tuple(self.operators),
            delegates=tuple(self.delegates),
            non_const_buffer_sizes=(0, align_up(plan.total, self.options.alignment)),
        )

    def container_meta(self) -> ContainerMetadata:
        for entry in self.program.module_call_graph:
            if entry.fqn == "" and entry.signature is not None:
                return ContainerMetadata(
                    encoded_inp_str=entry.signature.in_spec, encoded_out_str=entry.signature.out_spec
                )
        return ContainerMetadata(encoded_inp_str="", encoded_out_str="")

    @property
    def output_names(self) -> frozenset[str]:
        if self._output_names is None:
            out = self.graph.nodes[-1]
            names = set()
            if isinstance(out, Output):
                for arg in out.args:
                    if isinstance(arg, Ref):
                        names.add(arg.name)
            self._output_names = frozenset(names)
        return self._output_names


def _float(value: float | str) -> float:
    return float(value)


def _literal_float(arg: Argument, where: str) -> float | str:
    if isinstance(arg, (FloatArg, IntArg)):
        return arg.value
    raise EmitError(f"{where}: float[] argument holds {type(arg).__name__}")


_SPECIAL_FLOATS: dict[str, SpecialFloat] = {"inf": "inf", "-inf": "-inf", "nan": "nan"}


def _literal(value: object) -> Argument:
    # A ScalarMeta value spells non-finite floats as strings ("inf", ...): those are floats here.
    special = _SPECIAL_FLOATS.get(value) if isinstance(value, str) else None
    if special is not None:
        return FloatArg(value=special)
    try:
        return literal_arg(value)
    except TypeError:
        raise EmitError(f"unsupported scalar input value {value!r}") from None


def emit(
    program: Program | Mapping[str, Program], options: EmitOptions | None = None
) -> PteProgram:
    """Emit one Program (method "forward") or several (method name -> Program) as a `.pte` program.

    Pure: the input is not modified. Constant payloads and delegate blobs are Blob views of the
    program's own data (never copied), deduplicated by content hash; methods are sorted by name.
    """
    options = options or EmitOptions()
    methods = {"forward": program} if isinstance(program, Program) else dict(program)
    if not methods:
        raise EmitError("no methods to emit; pass a Program or a non-empty mapping of name -> Program")
    state = _ProgramState()
    plans = []
    for name in sorted(methods):
        method = methods[name]
        if not isinstance(method, Program):
            raise EmitError(f"method {name!r} is a {type(method).__name__}, not a texir.ir.Program")
        plans.append(_MethodEmitter(name, method, state, options).emit_method())
    root = PteRoot(
        execution_plan=tuple(plans),
        constant_buffer=tuple(Buffer(storage=blob) for blob in state.constants),
        backend_delegate_data=tuple(BackendDelegateInlineData(data=blob) for blob in state.delegate_data),
    )
    return PteProgram(program=root)


def lowered_module_buffer(
    name: str,
    module: LoweredBackendModule,
    options: PteOptions | None = None,
    emit_options: EmitOptions | None = None,
) -> bytes:
    """The `.pte` bytes of a lowered module's wrapper program (inputs -> one delegate call ->
    outputs), the counterpart of ExecuTorch's `LoweredBackendModule.buffer()`."""
    from texir.lowering.lowered import delegate_wrapper_program
    from texir.serialize.pte.codec import dumps

    return dumps(emit(delegate_wrapper_program(name, module), emit_options), options)
