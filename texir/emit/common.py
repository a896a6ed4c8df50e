"""What the emitter's parts share: options, errors, dtype and op tables, pending values, symbolic bounds."""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Mapping
from typing import Union

import msgspec
from pydantic import BaseModel, ConfigDict, Field

from texir.edge import DIM_ORDER_OPS
from texir.emit.memory_plan import (
    PlannerName,
)
from texir.errors import PteError
from texir.ir.blob import Blob
from texir.ir.literals import literal_arg
from texir.ir.names import CALL_DELEGATE, GETITEM
from texir.ir.types import (
    Argument,
    FloatArg,
    IntArg,
    MemoryFormat,
    NamedDataEntry,
    Program,
    SpecialFloat,
)
from texir.serialize.pte.schema import (
    ExtraTensorInfo,
    KernelTypes,
    PtdEntry,
    ScalarType,
    TensorShapeDynamism,
)

DEFAULT_EXTERNAL_TAG = "_default_external_constant"
"""The `.ptd` tag of constants under `EmitOptions(external_constants=True)` (ExecuTorch's name)."""


class EmitError(PteError):
    """An IR Program cannot be emitted as a `.pte` program."""


class EmitArgumentError(EmitError, TypeError):
    """`emit` was given something other than a Program or a mapping of method name -> Program."""


class EmitOptions(BaseModel):
    """Emitter options (validated)."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    planner: PlannerName = "greedy"
    """Memory planner: ExecuTorch's default greedy packing, or one slot per tensor ('naive')."""
    alignment: int = Field(default=16, ge=1)
    """Every planned tensor's size is rounded up to this many bytes."""
    alloc_graph_input: bool = True
    """Plan user-input tensors (the runtime copies inputs into the arena), as ExecuTorch does."""
    alloc_graph_output: bool = True
    """Plan output tensors, as ExecuTorch does. If False, outputs produced directly by a kernel get no
    allocation and the caller supplies their memory (the pybindings do)."""
    check_operators: bool = True
    """Refuse a program that calls an operator the ExecuTorch 1.5.1 runtime does not register
    (`texir.emit.runtime_ops`): it would fail to load on the device."""
    check_plan: bool = False
    """Verify that the memory plan never overlaps live tensors (tests turn this on)."""
    external_constants: bool | Callable[[str], str | None] = False
    """Keep parameters, buffers and constants (not lifted literals) out of the `.pte`, in `.ptd`
    files, as ExecuTorch's `ExecutorchBackendConfig.external_constants`: True puts them all in the
    file tagged `_default_external_constant`; a function of the state target (its fully qualified
    name) returns the tag of each one's file, or None to keep it inside. The `.pte` refers to each
    by name (`PteProgram.external`)."""
    external_named_data: str | None = None
    """Move every delegate's named data (e.g. XNNPACK weights) to the `.ptd` file with this tag, as
    ExecuTorch's backends do for constants tagged `delegate_constant_tag`."""
    emit_mutable_buffer_names: bool = False
    """Name each mutable buffer in the `.pte` (`extra_tensor_info.fully_qualified_name`), as
    ExecuTorch's `emit_mutable_buffer_names`."""
    share_mutable_buffers: bool = False
    """Give every buffer that some method mutates one place in a third memory arena (memory id 2)
    that all methods use, so state one method writes the others read (a KV cache filled by
    `prefill` and read by `decode`), as ExecuTorch's `MemoryPlanningPass(share_mutable_buffers=True)`.
    Offsets follow the first mutation of each buffer, methods in the order given."""
    remove_view_copy: bool = True
    """Turn reshapes the output does not return into memory views (the edge passes
    `normalize_view_copy_bases` and `replace_view_copies_with_views`), as ExecuTorch's
    `ExecutorchBackendConfig.remove_view_copy`; False leaves them copies. A program already in the
    `EDGE` dialect has had them run or not when it got there."""
    init_mutable_buffers: bool | tuple[str, ...] = False
    """Serialize the initial value of mutable buffers (the mutable-data segment) instead of leaving
    it undefined: True for all, or the buffers whose placeholder name contains one of these
    patterns (ExecuTorch's `InitializedMutableBufferPass(patterns)`)."""



# torch's c10::MemoryFormat codes, as the runtime reads a memory_format argument.
MEMORY_FORMAT_CODE: dict[MemoryFormat, int] = {
    MemoryFormat.contiguous_format: 0, MemoryFormat.preserve_format: 1,
    MemoryFormat.channels_last: 2, MemoryFormat.channels_last_3d: 3,
}

# Python SymInt arithmetic (FX targets) -> ExecuTorch prim kernels (EdgeToBackendOpsPass).
SYM_ARITH: dict[str, str] = {
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

# Graph plumbing that never becomes an instruction.
GETITEM_TARGET = GETITEM
CALL_DELEGATE_TARGET = CALL_DELEGATE
# The dim-order ops of the edge form: their out tensors take the order the op names.
DIM_ORDER_TARGETS = frozenset(DIM_ORDER_OPS.values())

PendingValue = Union["PendingTensor", KernelTypes]


class PendingTensor(msgspec.Struct):
    """A Tensor value whose allocation is filled in after memory planning."""

    scalar_type: ScalarType
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]
    requires_grad: bool
    dynamism: TensorShapeDynamism
    data_buffer_idx: int = 0
    storage: int | None = None
    extra: ExtraTensorInfo | None = None
    shared_offset: int | None = None
    """Offset in the shared-state arena (memory id 2) under `share_mutable_buffers`."""


class Storage(msgspec.Struct):
    """A planned tensor's bytes, live from step `start` to `end` of its `group`: 0 is the method's
    own graph, each torch.cond branch has a group of its own (steps count that branch's nodes)."""

    size: int
    start: int
    end: int
    group: int = 0


class CondRegion(msgspec.Struct):
    """The memory one torch.cond's branches run in, reserved in the arena of `group` (the graph
    holding the cond) from the cond's `step` until its last result (`results`, storage indices) is
    last read: after the runtime's moves those results are the branch's own tensors."""

    group: int
    step: int
    branches: tuple[int, ...]
    results: tuple[int, ...]


class ProgramState(msgspec.Struct):
    """Tables shared by all methods of one program: constants and delegate blobs, deduplicated."""

    constants: list[Blob] = msgspec.field(default_factory=lambda: [Blob(b"")])
    constant_index: dict[tuple[str, int], int] = msgspec.field(default_factory=dict)
    delegate_data: list[Blob] = msgspec.field(default_factory=list)
    delegate_index: dict[tuple[str, int], int] = msgspec.field(default_factory=dict)
    named: dict[str, tuple[NamedDataEntry, str]] = msgspec.field(default_factory=dict)
    """Named data of all delegates by key, with the delegate that first stored it."""
    mutable: list[Blob] = msgspec.field(default_factory=lambda: [Blob(b"")])
    mutable_index: dict[tuple[str, int], int] = msgspec.field(default_factory=dict)
    external: dict[str, dict[str, tuple[PtdEntry, str]]] = msgspec.field(default_factory=dict)
    """External entries by file tag and key, with where each was first stored."""
    external_index: dict[tuple[str, int], int] = msgspec.field(default_factory=dict)
    shared: dict[str, int] = msgspec.field(default_factory=dict)
    """Under `share_mutable_buffers`: each shared buffer's offset in arena 2, by fully qualified name."""
    shared_size: int | None = None
    """The shared arena's size, or None when buffers are not shared."""

    def mutable_initial(self, blob: Blob, digest: str | None = None) -> int:
        """Index of a mutable buffer's initial value in the mutable-data list (entry 0 is empty)."""
        key = (digest or blob.digest(), blob.nbytes)
        index = self.mutable_index.get(key)
        if index is None:
            index = self.mutable_index[key] = len(self.mutable)
            self.mutable.append(blob)
        return index

    def external_entry(self, tag: str, entry: PtdEntry, owner: str, digest: str | None = None) -> int:
        """Record an entry of the `.ptd` file `tag`; the same key twice must hold the same payload.
        Returns the payload's index among distinct external payloads (ExecuTorch writes it as the
        tensor's data_buffer_idx; the runtime looks the tensor up by name)."""
        if not tag:
            raise EmitError(f"{owner}: the external data tag of {entry.key!r} is empty; return a file name or None")
        digest = digest or entry.data.digest()
        for other_tag, entries in self.external.items():
            known = entries.get(entry.key)
            if known is None:
                continue
            first, first_owner = known
            if other_tag != tag or first.data.nbytes != entry.data.nbytes or first.data.digest() != digest:
                raise EmitError(
                    f"external data key {entry.key!r} is stored twice with different contents or files: by "
                    f"{first_owner} in {other_tag!r}.ptd and by {owner} in {tag!r}.ptd; give them distinct "
                    "names or the same payload and tag"
                )
            break
        else:
            self.external.setdefault(tag, {})[entry.key] = (entry, owner)
        key = (digest, entry.data.nbytes)
        index = self.external_index.get(key)
        if index is None:
            index = self.external_index[key] = len(self.external_index)
        return index

    def constant(self, blob: Blob, digest: str | None = None) -> int:
        # The IR already carries each state tensor's SHA-256; hashing again would read every weight.
        key = (digest or blob.digest(), blob.nbytes)
        index = self.constant_index.get(key)
        if index is None:
            index = len(self.constants)
            self.constants.append(blob)
            self.constant_index[key] = index
        return index

    def named_data(self, entry: NamedDataEntry, owner: str) -> None:
        """Merge one delegate's named-data entry: same key and payload once (alignments combined);
        the same key with another payload is an error naming both delegates."""
        if entry.data is None:
            raise EmitError(
                f"{owner}: named data {entry.key!r} has no payload (a snapshot written without "
                "include_data); load the program from a snapshot written with include_data=True"
            )
        known = self.named.get(entry.key)
        if known is None:
            self.named[entry.key] = (entry, owner)
            return
        first, first_owner = known
        if (first.sha256, first.nbytes) != (entry.sha256, entry.nbytes):
            raise EmitError(
                f"named data key {entry.key!r} has two payloads: {first.nbytes} bytes from {first_owner} and "
                f"{entry.nbytes} bytes from {owner}; a key must name one payload (rename one backend's keys)"
            )
        if entry.alignment != first.alignment:
            merged = math.lcm(first.alignment, entry.alignment)
            self.named[entry.key] = (msgspec.structs.replace(first, alignment=merged), first_owner)

    def delegate_blob(self, blob: Blob) -> int:
        key = (blob.digest(), blob.nbytes)
        index = self.delegate_index.get(key)
        if index is None:
            index = len(self.delegate_data)
            self.delegate_data.append(blob)
            self.delegate_index[key] = index
        return index


def split_op(target: str) -> tuple[str, str]:
    name, _, overload = target.partition(".")
    # ExecuTorch's prim kernels are registered with a literal "default" overload name.
    if overload == "default" and not name.startswith("executorch_prim::"):
        overload = ""
    return name, overload


class Bounds:
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
            value = eval_bound(ast.parse(dim, mode="eval").body, self._max)
        except Unbounded as exc:
            raise EmitError(
                f"{where}: dimension {dim!r} has no upper bound (symbol {exc}); give its "
                "torch.export.Dim a max=... so the tensor can be planned (DYNAMIC_BOUND)"
            ) from None
        except (SyntaxError, ValueError, TypeError, ZeroDivisionError) as exc:
            raise EmitError(f"{where}: cannot bound dimension {dim!r}: {exc}") from None
        result = int(math.ceil(value))
        self._cache[dim] = result
        return result


class Unbounded(Exception):
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


def eval_bound(node: ast.expr, maxima: Mapping[str, int | None]) -> float:
    """Evaluate a sympy-printed size expression with every symbol at its maximum."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.Name):
        bound = maxima.get(node.id)
        if bound is None or bound > 2**62:
            raise Unbounded(node.id)
        return bound
    if isinstance(node, ast.BinOp) and type(node.op) in _BOUND_BINOPS:
        return _BOUND_BINOPS[type(node.op)](eval_bound(node.left, maxima), eval_bound(node.right, maxima))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -eval_bound(node.operand, maxima)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _BOUND_FUNCS:
        return _BOUND_FUNCS[node.func.id](*(eval_bound(a, maxima) for a in node.args))
    raise ValueError(f"unsupported expression {ast.dump(node)}")


def dim_order_of(strides: tuple[int, ...]) -> tuple[int, ...]:
    # The dim with the largest stride comes first; ties keep dim order (size-1 dims).
    return tuple(sorted(range(len(strides)), key=lambda d: -strides[d]))


def as_float(value: float | str) -> float:
    return float(value)


def literal_float(arg: Argument, where: str) -> float | str:
    if isinstance(arg, (FloatArg, IntArg)):
        return arg.value
    raise EmitError(f"{where}: float[] argument holds {type(arg).__name__}")


_SPECIAL_FLOATS: dict[str, SpecialFloat] = {"inf": "inf", "-inf": "-inf", "nan": "nan"}


def literal_of(value: object) -> Argument:
    # A ScalarMeta value spells non-finite floats as strings ("inf", ...): those are floats here.
    special = _SPECIAL_FLOATS.get(value) if isinstance(value, str) else None
    if special is not None:
        return FloatArg(value=special)
    try:
        return literal_arg(value)
    except TypeError:
        raise EmitError(f"unsupported scalar input value {value!r}") from None
