"""The value table of one method: tensors, scalars, constants, operators and argument mapping."""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from typing import cast

from texir.emit.debug import DelegateDebug, MethodDebug
from texir.ir.analysis import iter_refs
from texir.ir.blob import Blob
from texir.ir.op_facts import op_table
from texir.ir.op_schema import ArgSchema, OpSchema
from texir.ir.types import (
    DTYPE_ITEMSIZE,
    Argument,
    BoolArg,
    CallFunction,
    DeviceArg,
    DType,
    DTypeArg,
    FloatArg,
    IntArg,
    LayoutArg,
    ListArg,
    MemoryFormatArg,
    NoneArg,
    Output,
    Placeholder,
    Program,
    Ref,
    StrArg,
    SymExprArg,
    TensorMeta,
    TupleArg,
    ValueMeta,
)
from texir.serialize.pte.dtypes import DTYPE_TO_SCALAR_TYPE
from texir.serialize.pte.schema import (
    BackendDelegate,
    Bool,
    BoolList,
    Double,
    DoubleList,
    Instruction,
    Int,
    IntList,
    KernelCall,
    Null,
    Operator,
    ExtraTensorInfo,
    OptionalTensorList,
    PtdEntry,
    ScalarType,
    String,
    Tensor,
    TensorDataLocation,
    TensorLayout,
    TensorList,
    TensorShapeDynamism,
)
from texir.emit.runtime_ops import RUNTIME, MissingKernelError, operator_name, runtime_operators
from texir.emit.common import (
    DEFAULT_EXTERNAL_TAG,
    MEMORY_FORMAT_CODE,
    Bounds,
    CondRegion,
    EmitError,
    EmitOptions,
    PendingTensor,
    PendingValue,
    ProgramState,
    Storage,
    as_float,
    dim_order_of,
    literal_float,
    split_op,
)




# Ops whose results never require grad (autograd gives them no derivative), and multi-result ops
# whose extra results are not differentiable (saved statistics), as eager autograd says.
_NON_DIFFERENTIABLE: frozenset[str] = frozenset({
    "aten::detach.default", "aten::detach_copy.default", "aten::histc.default",
    "aten::zeros_like.default", "aten::ones_like.default", "aten::empty_like.default",
    "aten::full_like.default", "aten::rand_like.default", "aten::randn_like.default",
    "aten::new_zeros.default", "aten::new_ones.default", "aten::new_empty.default",
    "aten::new_full.default", "aten::scalar_tensor.default",
})
_DIFFERENTIABLE_RESULTS: dict[str, tuple[bool, ...]] = {
    target: (True, False, False)
    for target in (
        "aten::_native_batch_norm_legit_no_training.default", "aten::_native_batch_norm_legit.default",
        "aten::_native_batch_norm_legit.no_stats", "aten::native_batch_norm.default",
        "aten::_native_batch_norm_legit_functional.default", "aten::native_layer_norm.default",
    )
}
_GRAD_DTYPES: frozenset[DType] = frozenset({
    DType.float16, DType.bfloat16, DType.float32, DType.float64, DType.complex64, DType.complex128,
})


def result_requires_grad(target: str, index: int, dtype: DType, inputs_require_grad: bool) -> bool:
    """Whether result `index` of `target` requires grad when an input does (`inputs_require_grad`)."""
    if not inputs_require_grad or dtype not in _GRAD_DTYPES:
        return False
    flags = _DIFFERENTIABLE_RESULTS.get(target)
    return flags[index] if flags is not None and index < len(flags) else True

class ValueTable:
    """Values, storages, operators and instructions of one method, built in emission order."""

    def __init__(self, name: str, program: Program, state: ProgramState, options: EmitOptions) -> None:
        self.name = name
        self.program = program
        self.ops = op_table(program.op_schemas)
        """The operator schemas the program can call (texir.ir.op_facts)."""
        self.state = state
        self.options = options
        self.bounds = Bounds(program)
        self.where = f"method {name!r}"
        self.values: list[PendingValue] = []
        self.by_name: dict[str, int | tuple[int, ...]] = {}
        self.inline: dict[str, Argument | None] = {}
        """The literal of each `texir::inline_constant` node, emitted by its user (`inline_operands`);
        None once emitted (a second use is an error)."""
        self.metas: dict[str, ValueMeta | None] = {}
        self.storages: list[Storage] = []
        self.group = 0
        """The storage group nodes are emitted into (see `Storage`); `groups` counts them."""
        self.groups = 1
        self.cond_regions: list[CondRegion] = []
        self.xnnpack_groups: set[int] = set()
        """Groups calling an XNNPACK delegate (their arena is padded, as ExecuTorch pads it)."""
        self.operators: list[Operator] = []
        self.operator_index: dict[tuple[str, str], int] = {}
        self.instructions: list[Instruction] = []
        self.delegates: list[BackendDelegate] = []
        self.inputs: list[int] = []
        self.outputs: list[int] = []
        # instruction index -> debug handle(s); delegate calls: outputs and backend map
        self.debug_handles: list[tuple[int, int | tuple[int, ...]]] = []
        self.without_handle: set[int] = set()
        """Instructions ExecuTorch's emitter writes without a debug handle (its `et_view`)."""
        self.debug_num_outputs: list[tuple[int, int]] = []
        self.debug_delegates: list[tuple[int, DelegateDebug]] = []
        self.step = 0
        self.last_step = len(program.graph.nodes)
        self.graph = program.graph
        self._output_names: frozenset[str] | None = None
        self.lowered = {m.name: m.module for m in program.lowered_modules}
        self.state_by_target = {entry.target: entry.value for entry in program.state}

    # --- values -------------------------------------------------------------------------------

    def add(self, value: PendingValue) -> int:
        self.values.append(value)
        return len(self.values) - 1

    def tensor_value(
        self, meta: TensorMeta, *, where: str, planned: bool, start: int,
        allowed_orders: frozenset[tuple[int, ...]] | None = None,
        forced_order: tuple[int, ...] | None = None,
        requires_grad: bool | None = None,
    ) -> int:
        """A new Tensor value. With `allowed_orders`, a non-contiguous dim order from the metadata is
        kept only if one of the op's tensor inputs has it (as ExecuTorch re-derives layouts after
        turning views into copies); otherwise the tensor is contiguous."""
        sizes = tuple(self.bounds.upper(d, where=where) for d in meta.shape)
        dynamic = any(isinstance(d, str) for d in meta.shape)
        order = dim_order_of(tuple(self.bounds.upper(s, where=where) for s in meta.strides))
        if forced_order is not None and len(forced_order) == len(sizes):
            order = forced_order
        elif allowed_orders is not None and order not in allowed_orders:
            order = tuple(range(len(sizes)))
        if meta.dtype not in DTYPE_TO_SCALAR_TYPE:
            raise EmitError(f"{where}: dtype {meta.dtype} has no ExecuTorch scalar type")
        tensor = PendingTensor(
            scalar_type=DTYPE_TO_SCALAR_TYPE[meta.dtype], sizes=sizes, dim_order=order,
            requires_grad=meta.requires_grad if requires_grad is None else requires_grad,
            dynamism=TensorShapeDynamism.DYNAMIC_BOUND if dynamic else TensorShapeDynamism.STATIC,
        )
        if planned:
            nbytes = math.prod(sizes) * DTYPE_ITEMSIZE[meta.dtype]
            tensor.storage = len(self.storages)
            self.storages.append(Storage(size=nbytes, start=start, end=start, group=self.group))
        return self.add(tensor)

    def grad_flows(self, target: str, bound: Mapping[str, Argument]) -> bool:
        """Whether `target`'s floating results require grad as ExecuTorch's edge program leaves them:
        its to_edge passes retrace every op with autograd on, so a result requires grad when the op
        is differentiable and one of its tensor inputs requires grad (a parameter, or a value
        computed from one). The runtime does not read the flag; it is written for equal files."""
        if target in _NON_DIFFERENTIABLE:
            return False
        for value in bound.values():
            for name in iter_refs(value):
                found = self.by_name.get(name)
                for index in (found,) if isinstance(found, int) else (found or ()):
                    item = self.values[index]
                    items = item.items if isinstance(item, (TensorList, OptionalTensorList)) else (index,)
                    if any(i >= 0 and getattr(self.values[i], "requires_grad", False) for i in items):
                        return True
        return False

    def use(self, index: int) -> None:
        value = self.values[index]
        if isinstance(value, PendingTensor) and value.storage is not None:
            storage = self.storages[value.storage]
            # A branch reads its operands at the cond's step of the enclosing graph (the steps of
            # different groups do not compare).
            if storage.group == self.group:
                storage.end = max(storage.end, self.step)
        elif isinstance(value, (TensorList, OptionalTensorList)):
            for item in value.items:
                if item >= 0:
                    self.use(item)

    def ref(self, name: str, *, where: str) -> int:
        found = self.by_name.get(name)
        if found is None:
            if name in self.inline:
                raise EmitError(
                    f"{where}: inline constant {name!r} is read where it cannot be emitted inline (it has one "
                    "user, which takes it as a Tensor operand of an op with an out variant); give each use its "
                    "own texir::inline_constant, or pass the literal itself"
                )
            raise EmitError(f"{where}: value {name!r} is used before it is defined or has no value")
        if isinstance(found, tuple):
            raise EmitError(
                f"{where}: multi-output value {name!r} is used directly; read its items with getitem"
            )
        self.use(found)
        return found

    def constant_tensor(
        self, meta: TensorMeta, blob: Blob, *, where: str, digest: str | None = None, store: bool = True
    ) -> int:
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
        return self.add(PendingTensor(
            scalar_type=DTYPE_TO_SCALAR_TYPE[meta.dtype], sizes=sizes, dim_order=tuple(range(len(sizes))),
            requires_grad=meta.requires_grad, dynamism=TensorShapeDynamism.STATIC,
            data_buffer_idx=self.state.constant(blob, digest) if store else 0,
        ))

    def external_tensor(
        self, meta: TensorMeta, blob: Blob, *, fqn: str, tag: str, where: str, digest: str | None = None
    ) -> int:
        """A constant kept in the `.ptd` file `tag` under its fully qualified name."""
        idx = self.constant_tensor(meta, blob, where=where, digest=digest, store=False)
        pending = cast(PendingTensor, self.values[idx])  # constant_tensor adds one
        layout = TensorLayout(scalar_type=pending.scalar_type, sizes=pending.sizes, dim_order=pending.dim_order)
        pending.data_buffer_idx = self.state.external_entry(
            tag, PtdEntry(key=fqn, data=blob, layout=layout), where, digest
        )
        pending.extra = ExtraTensorInfo(fully_qualified_name=fqn, location=TensorDataLocation.EXTERNAL)
        return idx

    def external_tag(self, node: Placeholder, fqn: str, *, where: str) -> str | None:
        """The `.ptd` tag of a constant under `EmitOptions.external_constants`, or None. Lifted
        literals (`c_lifted_tensor_N`) stay inside, as ExecuTorch's external_constants_pass."""
        choice = self.options.external_constants
        if choice is False or "_lifted_tensor" in node.name:
            return None
        if choice is True:
            return DEFAULT_EXTERNAL_TAG
        try:
            tag = choice(fqn)
        except Exception as exc:  # a user callback's failure of any kind becomes one typed error
            raise EmitError(f"{where}: EmitOptions.external_constants({fqn!r}) raised {type(exc).__name__}: {exc}") from exc
        if tag is not None and (not isinstance(tag, str) or not tag or "/" in tag or tag.startswith(".")):
            raise EmitError(
                f"{where}: EmitOptions.external_constants({fqn!r}) returned {tag!r}; return a file name "
                "(non-empty, no '/', not starting with '.') or None to keep the constant in the .pte"
            )
        return tag

    def mutable_buffer(self, node: Placeholder, fqn: str, meta: TensorMeta, *, where: str) -> int:
        """A planned mutable buffer (in the shared arena if it is shared); named and given its
        initial value as the options ask."""
        shared = self.state.shared.get(fqn)
        idx = self.tensor_value(meta, where=where, planned=shared is None, start=0)
        pending = cast(PendingTensor, self.values[idx])  # tensor_value adds one
        pending.shared_offset = shared
        if self.options.emit_mutable_buffer_names:
            pending.extra = ExtraTensorInfo(fully_qualified_name=fqn)
        patterns = self.options.init_mutable_buffers
        if patterns is True or (patterns and any(p in node.name for p in patterns)):
            if shared is not None:
                raise EmitError(
                    f"{where}: mutable buffer {fqn!r} is shared between methods (share_mutable_buffers) and "
                    "cannot also get an initial value from init_mutable_buffers; drop one of the two options"
                )
            data = self.state_by_target.get(fqn)
            if data is None or data.data is None:
                raise EmitError(
                    f"{where}: mutable buffer {fqn!r} should get its initial value (init_mutable_buffers) but "
                    "the program holds no payload for it; convert with data or drop it from init_mutable_buffers"
                )
            if pending.dynamism != TensorShapeDynamism.STATIC or data.data.nbytes != math.prod(pending.sizes) * DTYPE_ITEMSIZE[meta.dtype]:
                raise EmitError(
                    f"{where}: the initial value of mutable buffer {fqn!r} ({data.data.nbytes} bytes) does not "
                    f"match its static shape {list(pending.sizes)} ({meta.dtype})"
                )
            pending.data_buffer_idx = self.state.mutable_initial(data.data, data.sha256)
        return idx

    def scalar_tensor(self, arg: Argument, *, where: str) -> int:
        """ScalarToTensorPass: a Python scalar where the schema wants a Tensor becomes a 0-dim constant.
        Plain `emit` (and any nested graph) does this here, at the point of use, rather than in the
        edge pass (`lift_scalar_operands`, which `lower`'s TO_EDGE runs): lifting makes placeholders,
        which reorders the value table and changes the bytes of every `.pte` of such a program, and
        the IR has no inline constant to lift to instead (docs/limitations.md)."""
        if isinstance(arg, BoolArg):
            dtype, data = DType.bool, struct.pack("<?", arg.value)
        elif isinstance(arg, IntArg):
            dtype, data = DType.int64, struct.pack("<q", arg.value)
        elif isinstance(arg, FloatArg):
            dtype, data = DType.float32, struct.pack("<f", as_float(arg.value))
        else:
            raise EmitError(f"{where}: cannot turn {type(arg).__name__} into a tensor argument")
        return self.constant_tensor(TensorMeta(dtype=dtype, shape=(), strides=()), Blob(data), where=where)

    def operator(self, target: str) -> int:
        key = split_op(target)
        index = self.operator_index.get(key)
        if index is None:
            if self.options.check_operators and operator_name(*key) not in runtime_operators():
                raise MissingKernelError(
                    f"{self.where}: operator {operator_name(*key)} is not registered in the {RUNTIME} runtime, "
                    "so the .pte would fail to load (OperatorMissing). Delegate it to a backend that takes it; "
                    "or, if the program was converted without decomposing (from_exported_program(ep) with "
                    "decompose=False), decompose it to core ATen first (texir.lower and `texir lower` always "
                    "do). EmitOptions(check_operators=False) writes it anyway"
                )
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
            return self.add(Double(double_val=as_float(arg.value)))
        if isinstance(arg, StrArg):
            return self.add(String(string_val=arg.value))
        if isinstance(arg, DTypeArg):
            if arg.value not in DTYPE_TO_SCALAR_TYPE:
                raise EmitError(f"{where}: dtype {arg.value} has no ExecuTorch scalar type")
            return self.add(Int(int_val=int(DTYPE_TO_SCALAR_TYPE[arg.value])))
        if isinstance(arg, LayoutArg):
            return self.add(Int(int_val=0 if arg.value == "strided" else 1))
        if isinstance(arg, MemoryFormatArg):
            return self.add(Int(int_val=MEMORY_FORMAT_CODE[arg.value]))
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
                return self.add(PendingTensor(ScalarType.BYTE, (0,), (0,), False, TensorShapeDynamism.STATIC))
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
            return self.add(DoubleList(items=tuple(as_float(literal_float(i, where)) for i in seq)))
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

    def kernel(self, target: str, args: tuple[int, ...]) -> None:
        self.instructions.append(Instruction(instr_args=KernelCall(op_index=self.operator(target), args=args)))

    # --- planning and assembly ----------------------------------------------------------------

    def debug(self) -> MethodDebug:
        return MethodDebug(
            name=self.name, handles=tuple(self.debug_handles), num_outputs=tuple(self.debug_num_outputs),
            delegates=tuple(self.debug_delegates),
        )

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
