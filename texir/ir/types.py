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

The scalar enums, value metadata and provenance live in texir.ir.meta and are re-exported here: this
module is the schema's one entry point, and its SCHEMA_VERSION covers both.
"""

from __future__ import annotations

from typing import Final, Literal, TypeAlias, Union, get_args

from texir.ir._struct import _Frozen, _Tagged
from texir.ir.blob import Blob
from texir.ir.meta import (
    CustomObjMeta,
    DelegateMeta,
    Dim,
    DType,
    DTYPE_ITEMSIZE,
    FloatValue,
    Index,
    Layout,
    Location,
    MemoryFormat,
    ModuleFrame,
    NoneMeta,
    Provenance,
    ProvenanceTable,
    ScalarMeta,
    SourceFn,
    SpecialFloat,
    SubgraphMeta,
    SymBoolMeta,
    SymFloatMeta,
    SymIntMeta,
    TensorMeta,
    TokenMeta,
    TupleMeta,
    ValueMeta,
)

__all__ = [
    "Argument", "BackendNodeMeta", "BoolArg", "BufferInput", "BufferMutation", "CallFunction", "CompileSpec",
    "ConstantMethod", "ConstantTensorInput", "CustomObjInput", "CustomObjMeta", "DIALECTS", "DTYPE_ITEMSIZE", "DType",
    "DTypeArg", "DebugHandleEntry", "DelegateMeta", "DeviceArg", "Dialect", "Dim", "FloatArg", "FloatValue", "GetAttr",
    "GradientToParameter", "GradientToUserInput", "Graph", "GraphSignature", "InputSpec", "IntArg", "Layout",
    "LayoutArg", "ListArg", "Location", "LossOutput", "LoweredBackendModule", "MemoryFormat", "MemoryFormatArg",
    "ModuleCallEntry", "ModuleCallSignature", "ModuleFrame", "NamedDataEntry", "NamedLoweredModule", "Node",
    "NoneArg", "NoneMeta", "Output", "OutputSpec", "ParameterInput", "Placeholder", "Program", "Provenance",
    "ProvenanceTable", "RangeConstraint", "Ref", "SCHEMA_VERSION", "ScalarMeta", "SourceFn", "SpecialFloat",
    "StateEntry", "StrArg", "Subgraph", "SubgraphMeta", "SymBoolMeta", "SymExprArg", "SymFloatMeta", "SymIntMeta",
    "TensorData", "TensorMeta", "TokenInput", "TokenMeta", "TokenOutput", "TupleArg", "TupleMeta", "UserInput",
    "UserInputMutation", "UserOutput", "ValueMeta", "unknown_dialect_message",
]

# Bump on any schema change by the rules in tests/test_schema_version.py.
SCHEMA_VERSION: tuple[int, int] = (3, 0)
"""3.0: `Program.dialect` narrowed from any string to `Dialect` (the wire form is unchanged, so 2.x
snapshots are read by the 3.0 decoder, which refuses a dialect outside `DIALECTS`); a lowered
module's `delegate_info` (its backend's `_delegate_info_meta`, JSON text), absent in 2.x."""

Dialect: TypeAlias = Literal["ATEN", "TRAINING", "EDGE_PARTITIONABLE", "EDGE"]
"""The stage a program has reached: `ATEN` / `TRAINING` as torch.export gives it, `EDGE_PARTITIONABLE`
after the to_edge rewrites (`texir.edge.pipeline.TO_EDGE`), `EDGE` after `TO_EXECUTORCH` too."""
DIALECTS: Final[tuple[Dialect, ...]] = get_args(Dialect)


def unknown_dialect_message(value: object, field: str) -> str:
    """What an error about a dialect outside `DIALECTS` says (the verifier, the parser, the snapshot
    reader and the torch.export import share it)."""
    return (
        f"{field}: unknown dialect {value!r}; texir's dialects are {', '.join(DIALECTS)}: convert an "
        "ExportedProgram with texir.adapters.from_exported_program (ATEN or TRAINING) and let texir's "
        "stages set the others"
    )


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
    delegate_info: str | None = None
    """What the backend attached for tools beside its blob (ExecuTorch's
    `PreprocessResult._delegate_info_meta`), as JSON text with sorted keys; never written to a .pte."""


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
    dialect: Dialect = "ATEN"
    backend_meta: tuple[BackendNodeMeta, ...] = ()
    op_schemas: tuple[str, ...] = ()  # custom ops' schema strings, sorted (texir.ir.op_facts)
