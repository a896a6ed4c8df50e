"""Frozen IR data types: everything a `torch.export.ExportedProgram` holds, as msgspec Structs.

Conventions (see STYLE.md):
- every type is a frozen, keyword-only Struct; sum types are tagged unions on the field ``kind``;
- references between nodes are by name (`Ref`); a graph is a topologically ordered tuple of nodes;
- maps are tuples of pairs or of named entries, kept in a fixed order, so every object hashes;
- each node defines exactly one value, named after the node. Its metadata lives once per graph in a uniqued table
  (`Graph.metas`, like MLIR's uniqued types); the node holds its index (`Node.meta_id`), resolved by
  `graph.meta(node)`. Node provenance is held column-wise (`Graph.provenance`: entry i of each column belongs to
  ``nodes[i]``), with the parts nodes share (stack trace, module stack, source fn, torch fn type) uniqued as
  `Location`s; `graph.prov(i)` assembles a node's `Provenance`. Real graphs repeat a few dozen metas and
  locations over thousands of nodes, so this keeps snapshots ~3x smaller and decoding ~2.5x faster than inline
  metadata (benchmarks/bench_ir.py). Build graphs with `texir.ir.GraphBuilder`, which interns.
"""

from __future__ import annotations

import enum
from typing import Annotated, Literal, TypeAlias, Union

import msgspec

from texir.ir.blob import Blob

__all__ = [
    "Argument", "BackendNodeMeta", "BoolArg", "BufferInput", "BufferMutation", "CallFunction", "CompileSpec",
    "ConstantMethod", "ConstantTensorInput", "CustomObjInput", "CustomObjMeta", "DTYPE_ITEMSIZE", "DType",
    "DTypeArg", "DebugHandleEntry", "DelegateMeta", "DeviceArg", "Dim", "FloatArg", "FloatValue", "GetAttr",
    "GradientToParameter", "GradientToUserInput", "Graph", "GraphSignature", "InputSpec", "IntArg", "Layout",
    "LayoutArg", "ListArg", "Location", "LossOutput", "LoweredBackendModule", "MemoryFormat", "MemoryFormatArg",
    "ModuleCallEntry", "ModuleCallSignature", "ModuleFrame", "NamedDataEntry", "NamedLoweredModule", "Node",
    "NoneArg", "NoneMeta", "Output", "OutputSpec", "ParameterInput", "Placeholder", "Program", "Provenance",
    "ProvenanceTable", "RangeConstraint", "Ref", "SCHEMA_VERSION", "ScalarMeta", "SourceFn", "SpecialFloat",
    "StateEntry", "StrArg", "Subgraph", "SubgraphMeta", "SymBoolMeta", "SymExprArg", "SymFloatMeta", "SymIntMeta",
    "TensorData", "TensorMeta", "TokenInput", "TokenMeta", "TokenOutput", "TupleArg", "TupleMeta", "UserInput",
    "UserInputMutation", "UserOutput", "ValueMeta",
]

# Bump on any schema change by the rules in tests/test_schema_version.py.
SCHEMA_VERSION: tuple[int, int] = (2, 3)


# gc=False: IR objects are immutable and built bottom-up, so they can never form reference cycles;
# untracked structs make decoding a 100k-node snapshot ~1.7x faster. omit_defaults=True keeps
# snapshots small (a default field is simply absent and decodes to its default).
class _Frozen(msgspec.Struct, frozen=True, kw_only=True, gc=False, omit_defaults=True):
    """Base of every non-union IR struct."""


class _Tagged(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", gc=False, omit_defaults=True):
    """Base of every tagged-union variant; the tag is the lower-case variant name unless given."""


# --------------------------------------------------------------------------------------------------
# Scalar enums


class DType(enum.StrEnum):
    """torch dtypes by their torch name (``torch.float32`` -> ``"float32"``)."""

    bool, uint8, int8, int16 = "bool", "uint8", "int8", "int16"
    int32, int64, uint16, uint32 = "int32", "int64", "uint16", "uint32"
    uint64, float16, bfloat16, float32 = "uint64", "float16", "bfloat16", "float32"
    float64, complex64, complex128, float8_e5m2 = "float64", "complex64", "complex128", "float8_e5m2"
    float8_e4m3fn, float8_e5m2fnuz, float8_e4m3fnuz, qint8 = "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz", "qint8"
    quint8, qint32, quint4x2, quint2x4 = "quint8", "qint32", "quint4x2", "quint2x4"
    bits16 = "bits16"


DTYPE_ITEMSIZE: dict[DType, int] = {
    DType.bool: 1, DType.uint8: 1, DType.int8: 1, DType.int16: 2, DType.int32: 4, DType.int64: 8,
    DType.uint16: 2, DType.uint32: 4, DType.uint64: 8, DType.float16: 2, DType.bfloat16: 2,
    DType.float32: 4, DType.float64: 8, DType.complex64: 8, DType.complex128: 16,
    DType.float8_e5m2: 1, DType.float8_e4m3fn: 1, DType.float8_e5m2fnuz: 1, DType.float8_e4m3fnuz: 1,
    DType.qint8: 1, DType.quint8: 1, DType.qint32: 4, DType.quint4x2: 1, DType.quint2x4: 1,
    DType.bits16: 2,
}


class Layout(enum.StrEnum):
    strided = "strided"
    sparse_coo, sparse_csr, sparse_csc = "sparse_coo", "sparse_csr", "sparse_csc"
    sparse_bsr, sparse_bsc = "sparse_bsr", "sparse_bsc"
    mkldnn = "_mkldnn"
    jagged = "jagged"


class MemoryFormat(enum.StrEnum):
    contiguous_format, channels_last = "contiguous_format", "channels_last"
    channels_last_3d, preserve_format = "channels_last_3d", "preserve_format"


# An index into a per-graph table (`Graph.metas`, `ProvenanceTable.locations`).
Index: TypeAlias = Annotated[int, msgspec.Meta(ge=0)]

# A dimension or stride: a concrete int, or a symbolic expression in sympy syntax ("s0", "2*s0 + 1").
Dim: TypeAlias = Union[int, str]

# Floats that JSON cannot hold (and NaN, which breaks structural equality) are spelled as strings.
SpecialFloat: TypeAlias = Literal["inf", "-inf", "nan"]
FloatValue: TypeAlias = Union[float, SpecialFloat]


# --------------------------------------------------------------------------------------------------
# Value metadata: what a node's value is (its FX ``meta["val"]``)


class TensorMeta(_Tagged, frozen=True, kw_only=True, tag="tensor"):
    """A tensor's metadata. Shapes and strides may hold symbolic expressions."""

    dtype: DType
    shape: tuple[Dim, ...]
    strides: tuple[Dim, ...]
    """Element strides, same length as `shape`; the dim order follows from them."""
    storage_offset: Dim = 0
    layout: Layout = Layout.strided
    device: str = "cpu"
    requires_grad: bool = False


class SymIntMeta(_Tagged, frozen=True, kw_only=True, tag="symint"):
    """A symbolic int; `expr` is its sympy expression, or an int once it is known."""

    expr: Dim


class SymFloatMeta(_Tagged, frozen=True, kw_only=True, tag="symfloat"):
    expr: str


class SymBoolMeta(_Tagged, frozen=True, kw_only=True, tag="symbool"):
    expr: str


class ScalarMeta(_Tagged, frozen=True, kw_only=True, tag="scalar"):
    """A plain Python value computed by a node (rare: most scalars are arguments)."""

    value: Union[bool, int, FloatValue, str, None]


class TupleMeta(_Tagged, frozen=True, kw_only=True, tag="tuple"):
    """Several values, as returned by multi-output ops (``max.dim``, ``split``)."""

    items: tuple[ValueMeta, ...]
    is_list: bool = False
    """True when the op returns ``Tensor[]`` (a list), False for a tuple."""


class NoneMeta(_Tagged, frozen=True, kw_only=True, tag="none"):
    """The value None (e.g. an in-place op's result or a missing optional output)."""


class CustomObjMeta(_Tagged, frozen=True, kw_only=True, tag="custom_obj"):
    class_fqn: str


class TokenMeta(_Tagged, frozen=True, kw_only=True, tag="token"):
    """An effect token threaded through side-effecting ops."""


class SubgraphMeta(_Tagged, frozen=True, kw_only=True, tag="subgraph"):
    """The value of a `get_attr` node naming a nested graph (a torch.cond/torch.map branch)."""

    graph: str


class DelegateMeta(_Tagged, frozen=True, kw_only=True, tag="delegate"):
    """The value of a `get_attr` node naming a lowered backend module of the program."""

    module: str


ValueMeta: TypeAlias = Union[
    TensorMeta, SymIntMeta, SymFloatMeta, SymBoolMeta, ScalarMeta, TupleMeta, NoneMeta,
    CustomObjMeta, TokenMeta, SubgraphMeta, DelegateMeta,
]


# --------------------------------------------------------------------------------------------------
# Provenance


class ModuleFrame(_Frozen, frozen=True, kw_only=True):
    """One entry of FX ``nn_module_stack``: key -> (module path, module type)."""

    key: str
    path: str
    type: str


class SourceFn(_Frozen, frozen=True, kw_only=True):
    """One entry of FX ``source_fn_stack``: (name, target as a string)."""

    name: str
    target: str


class Provenance(_Frozen, frozen=True, kw_only=True):
    """Where a node came from (a view: `Graph.prov` assembles it from `Graph.provenance`).
    Debug handles follow ExecuTorch's numbering: nodes sharing their greatest ``from_node``
    ancestor share one handle; placeholders and outputs have none."""

    debug_handle: int | None = None
    ancestor: str | None = None
    """Identifier of the greatest ``from_node`` ancestor (its name and graph id)."""
    stack_trace: str | None = None
    nn_module_stack: tuple[ModuleFrame, ...] = ()
    source_fn_stack: tuple[SourceFn, ...] = ()
    torch_fn: tuple[str, str] | None = None
    """(call name, function type), e.g. ``("add_25", "method_descriptor.add")``."""
    custom: str | None = None
    """FX ``meta["custom"]`` as JSON text, as torch.export serializes it (e.g. Arm's quantizer notes)."""


class Location(_Frozen, frozen=True, kw_only=True):
    """The part of a node's provenance that many nodes share; uniqued per graph."""

    stack_trace: str | None = None
    nn_module_stack: tuple[ModuleFrame, ...] = ()
    source_fn_stack: tuple[SourceFn, ...] = ()
    torch_fn_type: str | None = None
    """Second half of `Provenance.torch_fn`; the first half (unique per call) is a column."""
    custom: str | None = None  # `Provenance.custom`


class ProvenanceTable(_Frozen, frozen=True, kw_only=True):
    """Provenance of a graph's nodes, column-wise: entry i of every column belongs to the graph's
    i-th node. Per-node values are columns; shared ones are `Location`s referenced by index."""

    debug_handle: tuple[int | None, ...]
    ancestor: tuple[str | None, ...]
    torch_fn_name: tuple[str | None, ...]
    location: tuple[Index | None, ...]
    """Index into `locations`, or None."""
    locations: tuple[Location, ...] = ()


# --------------------------------------------------------------------------------------------------
# Arguments


class Ref(_Tagged, frozen=True, kw_only=True, tag="ref"):
    """A use of the value defined by node `name` (in the same graph)."""

    name: str


class NoneArg(_Tagged, frozen=True, kw_only=True, tag="none"):
    pass


class IntArg(_Tagged, frozen=True, kw_only=True, tag="int"):
    value: int


class FloatArg(_Tagged, frozen=True, kw_only=True, tag="float"):
    value: FloatValue


class BoolArg(_Tagged, frozen=True, kw_only=True, tag="bool"):
    value: bool


class StrArg(_Tagged, frozen=True, kw_only=True, tag="str"):
    value: str


class ListArg(_Tagged, frozen=True, kw_only=True, tag="list"):
    items: tuple[Argument, ...]


class TupleArg(_Tagged, frozen=True, kw_only=True, tag="tuple"):
    items: tuple[Argument, ...]


class DTypeArg(_Tagged, frozen=True, kw_only=True, tag="dtype"):
    value: DType


class DeviceArg(_Tagged, frozen=True, kw_only=True, tag="device"):
    value: str
    """As torch prints it: ``"cpu"``, ``"cuda:0"``."""


class LayoutArg(_Tagged, frozen=True, kw_only=True, tag="layout"):
    value: Layout


class MemoryFormatArg(_Tagged, frozen=True, kw_only=True, tag="memory_format"):
    value: MemoryFormat


class SymExprArg(_Tagged, frozen=True, kw_only=True, tag="symexpr"):
    """A symbolic int/float/bool expression used directly as an argument (not via a node)."""

    expr: str
    type: Literal["int", "float", "bool"] = "int"


Argument: TypeAlias = Union[
    Ref, NoneArg, IntArg, FloatArg, BoolArg, StrArg, ListArg, TupleArg, DTypeArg, DeviceArg,
    LayoutArg, MemoryFormatArg, SymExprArg,
]


# --------------------------------------------------------------------------------------------------
# Nodes and graphs


class Placeholder(_Tagged, frozen=True, kw_only=True, tag="placeholder"):
    name: str
    meta_id: Index | None = None
    """Index of the value's metadata in `Graph.metas` (resolve with `graph.meta(node)`)."""


class CallFunction(_Tagged, frozen=True, kw_only=True, tag="call_function"):
    """A call. `target` is a canonical op string: ``"aten::add.Tensor"`` for torch ops (default
    overload spelled ``.default``), ``"higher_order::cond"``, ``"_operator::getitem"``, and
    ``"texir::call_delegate"`` for delegate calls."""

    name: str
    target: str
    args: tuple[Argument, ...] = ()
    kwargs: tuple[tuple[str, Argument], ...] = ()
    meta_id: Index | None = None


class GetAttr(_Tagged, frozen=True, kw_only=True, tag="get_attr"):
    """Fetches a nested graph (`Graph.subgraphs`) or a lowered module (`Program.lowered_modules`)
    by `target`; its meta is `SubgraphMeta` or `DelegateMeta`."""

    name: str
    target: str
    meta_id: Index | None = None


class Output(_Tagged, frozen=True, kw_only=True, tag="output"):
    """The graph's results; always the last node."""

    name: str = "output"
    args: tuple[Argument, ...] = ()


Node: TypeAlias = Union[Placeholder, CallFunction, GetAttr, Output]


class Subgraph(_Frozen, frozen=True, kw_only=True):
    name: str
    graph: Graph


class Graph(_Frozen, frozen=True, kw_only=True):
    """Topologically ordered nodes ending in one `Output`, their uniqued value metadata and
    provenance, and nested graphs by name. Build with `texir.ir.GraphBuilder`: it interns
    metadata and locations in first-use order, so equal contents give structurally equal graphs."""

    nodes: tuple[Node, ...]
    metas: tuple[ValueMeta, ...] = ()
    """Distinct value metadata in order of first use; `Node.meta_id` indexes it."""
    provenance: ProvenanceTable | None = None
    """None when no node has provenance."""
    subgraphs: tuple[Subgraph, ...] = ()

    def meta(self, node: Node) -> ValueMeta | None:
        """The metadata of `node`'s value (None for outputs and nodes without metadata)."""
        index = getattr(node, "meta_id", None)
        return None if index is None else self.metas[index]

    def prov(self, index: int) -> Provenance | None:
        """The provenance of ``nodes[index]``, or None when it has none."""
        table = self.provenance
        if table is None:
            return None
        handle, ancestor = table.debug_handle[index], table.ancestor[index]
        name, loc = table.torch_fn_name[index], table.location[index]
        if loc is None:
            if handle is None and ancestor is None:
                return None
            return Provenance(debug_handle=handle, ancestor=ancestor)
        where = table.locations[loc]
        return Provenance(
            debug_handle=handle,
            ancestor=ancestor,
            stack_trace=where.stack_trace,
            nn_module_stack=where.nn_module_stack,
            source_fn_stack=where.source_fn_stack,
            torch_fn=None if name is None or where.torch_fn_type is None else (name, where.torch_fn_type),
            custom=where.custom,
        )

    def debug_handles(self) -> tuple[int | None, ...]:
        """The debug handle of each node, in node order (None where a node has none)."""
        table = self.provenance
        return (None,) * len(self.nodes) if table is None else table.debug_handle

    def entries(self) -> list[tuple[Node, ValueMeta | None, Provenance | None]]:
        """``(node, meta, prov)`` for every node in order: what `GraphBuilder.add` takes."""
        metas = self.metas
        return [
            (node, None if (m := getattr(node, "meta_id", None)) is None else metas[m], self.prov(i))
            for i, node in enumerate(self.nodes)
        ]


# --------------------------------------------------------------------------------------------------
# Signature


class UserInput(_Tagged, frozen=True, kw_only=True, tag="user_input"):
    arg: Argument
    """A `Ref` to the placeholder, or a literal for an input torch.export specialized away."""


class ParameterInput(_Tagged, frozen=True, kw_only=True, tag="parameter"):
    name: str
    target: str


class BufferInput(_Tagged, frozen=True, kw_only=True, tag="buffer"):
    name: str
    target: str
    persistent: bool = True


class ConstantTensorInput(_Tagged, frozen=True, kw_only=True, tag="constant_tensor"):
    name: str
    target: str


class CustomObjInput(_Tagged, frozen=True, kw_only=True, tag="custom_obj"):
    name: str
    target: str


class TokenInput(_Tagged, frozen=True, kw_only=True, tag="token"):
    name: str


InputSpec: TypeAlias = Union[
    UserInput, ParameterInput, BufferInput, ConstantTensorInput, CustomObjInput, TokenInput
]


class UserOutput(_Tagged, frozen=True, kw_only=True, tag="user_output"):
    arg: Argument


class BufferMutation(_Tagged, frozen=True, kw_only=True, tag="buffer_mutation"):
    name: str
    target: str


class UserInputMutation(_Tagged, frozen=True, kw_only=True, tag="user_input_mutation"):
    name: str
    target: str


class LossOutput(_Tagged, frozen=True, kw_only=True, tag="loss"):
    name: str


class GradientToParameter(_Tagged, frozen=True, kw_only=True, tag="gradient_to_parameter"):
    name: str
    target: str


class GradientToUserInput(_Tagged, frozen=True, kw_only=True, tag="gradient_to_user_input"):
    name: str
    target: str


class TokenOutput(_Tagged, frozen=True, kw_only=True, tag="token"):
    name: str


OutputSpec: TypeAlias = Union[
    UserOutput, BufferMutation, UserInputMutation, LossOutput, GradientToParameter,
    GradientToUserInput, TokenOutput,
]


class GraphSignature(_Frozen, frozen=True, kw_only=True):
    """`inputs[i]` describes the i-th placeholder; `outputs[i]` the i-th output argument."""

    inputs: tuple[InputSpec, ...]
    outputs: tuple[OutputSpec, ...]


# --------------------------------------------------------------------------------------------------
# State


class TensorData(_Frozen, frozen=True, kw_only=True):
    """A tensor's value. `data` is None in snapshots written without data; `sha256` always holds
    the content hash of the contiguous little-endian bytes."""

    meta: TensorMeta
    sha256: str
    nbytes: int
    data: Blob | None = None


class ConstantMethod(_Frozen, frozen=True, kw_only=True):
    """A method without inputs that returns constants (ExecuTorch's `constant_methods`, e.g.
    `get_max_seq_len`): the flattened leaves and the pytree spec of the returned structure, in
    torch's `treespec_dumps` JSON. A dtype or layout leaf is stored as its ExecuTorch code (int).
    Build one from Python values with `texir.adapters.constant_method`."""

    values: tuple[bool | int | float | str | TensorData, ...]
    out_spec: str


class StateEntry(_Frozen, frozen=True, kw_only=True):
    """A parameter, buffer or lifted constant by fully qualified name. Which torch table it came
    from (state_dict or constants) follows from the signature."""

    target: str
    value: TensorData


class RangeConstraint(_Frozen, frozen=True, kw_only=True):
    symbol: str
    min: int
    max: int | None = None
    """None means unbounded."""
    hint: int | None = None
    """The symbol's value in the example inputs it was exported with (a backed symbol's hint);
    None for unbacked symbols. IR -> FX gives the rebuilt fake tensors these sizes."""


class ModuleCallSignature(_Frozen, frozen=True, kw_only=True):
    inputs: tuple[Argument, ...]
    outputs: tuple[Argument, ...]
    in_spec: str
    """pytree TreeSpec JSON (``torch.utils._pytree.treespec_dumps``)."""
    out_spec: str
    forward_arg_names: tuple[str, ...] | None = None


class ModuleCallEntry(_Frozen, frozen=True, kw_only=True):
    fqn: str
    signature: ModuleCallSignature | None = None


# --------------------------------------------------------------------------------------------------
# Delegation


class CompileSpec(_Frozen, frozen=True, kw_only=True):
    key: str
    value: bytes


class DebugHandleEntry(_Frozen, frozen=True, kw_only=True):
    """A backend-side identifier and the debug handles of the nodes it implements."""

    identifier: Union[int, str]
    debug_handles: tuple[int, ...]


class NamedDataEntry(_Frozen, frozen=True, kw_only=True):
    """A payload a backend stores by key beside its blob (ExecuTorch's NamedDataStore, e.g. XNNPACK
    weights). As in `TensorData`, `data` is None in snapshots written without data."""

    key: str
    sha256: str
    nbytes: int
    alignment: int = 1
    data: Blob | None = None


class LoweredBackendModule(_Frozen, frozen=True, kw_only=True):
    """A partition compiled by a backend. `original_program` is the delegated sub-program
    (placeholders ordered parameters, buffers, constants, user inputs)."""

    backend_id: str
    processed_bytes: bytes
    compile_specs: tuple[CompileSpec, ...]
    original_program: Program
    debug_handle_map: tuple[DebugHandleEntry, ...] | None = None
    named_data: tuple[NamedDataEntry, ...] = ()


class BackendNodeMeta(_Frozen, frozen=True, kw_only=True):
    """A partitioner's note on a node for its backend (e.g. XNNPACK's implicit q/dq tag); JSON value."""

    node: str
    key: str
    value: str


class NamedLoweredModule(_Frozen, frozen=True, kw_only=True):
    name: str
    module: LoweredBackendModule


class Program(_Frozen, frozen=True, kw_only=True):
    """One method of an exported program. Invariants are checked by `texir.ir.verify`."""

    graph: Graph
    signature: GraphSignature
    state: tuple[StateEntry, ...] = ()
    """Sorted by target."""
    range_constraints: tuple[RangeConstraint, ...] = ()
    module_call_graph: tuple[ModuleCallEntry, ...] = ()
    lowered_modules: tuple[NamedLoweredModule, ...] = ()
    """Lowered backend modules called from the graph, by `get_attr` target."""
    dialect: str = "ATEN"
    backend_meta: tuple[BackendNodeMeta, ...] = ()
    op_schemas: tuple[str, ...] = ()  # custom ops' schema strings, sorted (texir.ir.op_facts)
