"""Built-in partitioners: whole program, maximal convex partitions of supported ops, explicit groups.

Each is a frozen, pure callable `Program -> PartitionPlan`. Options are validated with pydantic
when the partitioner is built, so a bad option fails at construction with a message naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Literal

import msgspec
import pydantic

from texir.ir import (
    BufferInput,
    BufferMutation,
    CallFunction,
    CompileSpec,
    ConstantTensorInput,
    DelegateMeta,
    GetAttr,
    Graph,
    Output,
    ParameterInput,
    Program,
    Provenance,
    Ref,
    SubgraphMeta,
    ValueMeta,
)
from texir.ir.analysis import node_inputs, node_key, value_metas, walk_keyed_graphs
from texir.ir.names import CALL_DELEGATE, GETITEM
from texir.lowering.capability import maximal_partitions
from texir.lowering.errors import PartitionerError
from texir.lowering.plan import (
    DelegationSpec,
    PartitionPlan,
)

__all__ = [
    "NodeContext",
    "NodeFilter",
    "NodeGroupPartitioner",
    "OpSupportPartitioner",
    "WholeProgramPartitioner",
    "tag_constants",
    "tag_mutated_buffers",
]

OpPredicate = Callable[[CallFunction, Mapping[str, ValueMeta]], bool]
"""Whether a backend supports a call node: gets the node and its graph's value metadata by name
(``metas[node.name]`` for its result, ``metas[ref.name]`` for an input)."""

SharedConstants = Literal["duplicate", "pass_in", "error"]


class NodeContext(msgspec.Struct, frozen=True, kw_only=True):
    """What a node filter sees of a call node: the node, its graph's value metadata and where it
    came from (module stack, source function), so support can depend on provenance."""

    node: CallFunction
    metas: Mapping[str, ValueMeta]
    provenance: Provenance | None
    graph: tuple[str, ...]
    """The nested-graph path ('' parts for the top-level graph: an empty tuple)."""

    @property
    def module_stack(self) -> tuple[str, ...]:
        """Module paths from the outermost module in, e.g. ``("layers.0", "layers.0.attn")``."""
        return tuple(f.path for f in self.provenance.nn_module_stack) if self.provenance else ()

    @property
    def module_types(self) -> tuple[str, ...]:
        """Module types along `module_stack`, e.g. ``("torch.nn.modules.linear.Linear",)``."""
        return tuple(f.type for f in self.provenance.nn_module_stack) if self.provenance else ()

    @property
    def source_fn(self) -> str | None:
        """The innermost source function or module class (``source_fn_stack``), e.g. ``"linear"``."""
        if self.provenance is None or not self.provenance.source_fn_stack:
            return None
        return self.provenance.source_fn_stack[-1].target


NodeFilter = Callable[[NodeContext], bool]


class _Options(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(frozen=True, arbitrary_types_allowed=True, extra="forbid")

    backend_id: str = pydantic.Field(min_length=1)
    compile_specs: tuple[CompileSpec, ...] = ()
    tag_constants: bool = False
    tag_mutated_buffers: bool = False
    shared_constants: SharedConstants = "duplicate"


def _options(
    backend_id: str,
    compile_specs: Sequence[CompileSpec],
    tag_constants: bool,
    tag_mutated_buffers: bool,
    shared_constants: str = "duplicate",
) -> _Options:
    """The options every built-in partitioner shares, validated."""
    try:
        return _Options(
            backend_id=backend_id,
            compile_specs=tuple(compile_specs),
            tag_constants=tag_constants,
            tag_mutated_buffers=tag_mutated_buffers,
            shared_constants=shared_constants,  # type: ignore[arg-type]  # pydantic checks the literal
        )
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise PartitionerError(f"invalid partitioner option '{field}': {first['msg']}") from None


def _is_delegate_call(node: CallFunction, delegate_calls: set[str]) -> bool:
    if node.target == CALL_DELEGATE:
        return True
    first = node.args[0] if node.args else None
    return node.target == GETITEM and isinstance(first, Ref) and first.name in delegate_calls


def _with_subgraph_attrs(graph: Graph, tags: dict[str, str], path: tuple[str, ...]) -> None:
    """Tag each nested-graph get_attr whose users all carry one tag with that tag."""
    user_tags: dict[str, set[str | None]] = {}
    attrs = {n.name for n in graph.nodes if isinstance(n, GetAttr) and isinstance(graph.meta(n), SubgraphMeta)}
    if not attrs:
        return
    for node in graph.nodes:
        for name in node_inputs(node):
            if name in attrs:
                user_tags.setdefault(name, set()).add(tags.get(node_key(path, node.name)))
    for name, found in user_tags.items():
        if len(found) == 1:
            (tag,) = found
            if tag is not None:
                tags[node_key(path, name)] = tag


def tag_constants(program: Program, tags: Mapping[str, str]) -> dict[str, str]:
    """`tags` plus each top-level parameter, buffer (not mutated) or constant that tagged nodes
    use, tagged as ExecuTorch's ``tag_constant_data`` does: with its users' tag, or the least of
    them when several partitions use it (the plan's `shared_constants` policy then decides whether
    each delegate gets its own copy, all receive it as an input, or lowering refuses)."""
    result = dict(tags)
    mutated = {s.target for s in program.signature.outputs if isinstance(s, BufferMutation)}
    _tag_placeholders(
        program, result, lambda spec: not (isinstance(spec, BufferInput) and spec.target in mutated), shared=True
    )
    return result


def tag_mutated_buffers(program: Program, tags: Mapping[str, str]) -> dict[str, str]:
    """`tags` plus each mutated buffer whose readers and whose mutation all carry one tag (like
    ExecuTorch's ``tag_mutated_buffer``, which also tags buffers that untagged nodes read; those
    would then read a stale copy, so they stay untagged here): the delegate owns the buffer and its
    update."""
    result = dict(tags)
    mutation_value = {s.target: s.name for s in program.signature.outputs if isinstance(s, BufferMutation)}

    def wanted(spec: ParameterInput | BufferInput | ConstantTensorInput) -> bool:
        return isinstance(spec, BufferInput) and spec.target in mutation_value

    chosen = _tag_placeholders(program, result, wanted, dry_run=True)
    # The delegate's copy is the only one updated, so every reader must be in the partition.
    untagged_readers: set[str] = set()
    for node in program.graph.nodes:
        if node.name not in result and not isinstance(node, Output):
            untagged_readers.update(n for n in node_inputs(node) if n in chosen)
    for name, (tag, spec) in chosen.items():
        if result.get(mutation_value[spec.target]) == tag and name not in untagged_readers:
            result[name] = tag
    return result


def _tag_placeholders(
    program: Program,
    tags: dict[str, str],
    wanted: Callable[[ParameterInput | BufferInput | ConstantTensorInput], bool],
    *,
    dry_run: bool = False,
    shared: bool = False,
) -> dict[str, tuple[str, ParameterInput | BufferInput | ConstantTensorInput]]:
    specs = {
        s.name: s
        for s in program.signature.inputs
        if isinstance(s, (ParameterInput, BufferInput, ConstantTensorInput)) and wanted(s)
    }
    user_tags: dict[str, dict[str, None]] = {name: {} for name in specs}
    for node in program.graph.nodes:
        tag = tags.get(node.name)
        if tag is None or isinstance(node, Output):
            continue
        for name in node_inputs(node):
            if name in user_tags:
                user_tags[name].setdefault(tag)
    chosen = {}
    for name, found in user_tags.items():
        if (len(found) == 1 or (shared and found)) and name not in tags:
            chosen[name] = (min(found), specs[name])
            if not dry_run:
                tags[name] = chosen[name][0]
    return chosen


def _finish(
    program: Program, tags: dict[str, str], opts: _Options, tag_order: Sequence[str], keep: Sequence[str] = ()
) -> PartitionPlan:
    if opts.tag_constants:
        tags = tag_constants(program, tags)
    if opts.tag_mutated_buffers:
        tags = tag_mutated_buffers(program, tags)
    spec = DelegationSpec(backend_id=opts.backend_id, compile_specs=opts.compile_specs)
    return PartitionPlan.build(
        tags,
        [(tag, spec) for tag in tag_order],
        ops_to_not_decompose=keep,
        shared_constants=opts.shared_constants,
    )


class WholeProgramPartitioner:
    """Every top-level call (nested graphs go along with their cond/map) in one partition 'tag0'."""

    def __init__(
        self,
        backend_id: str,
        compile_specs: Sequence[CompileSpec] = (),
        *,
        tag_constants: bool = False,
        tag_mutated_buffers: bool = False,
        shared_constants: SharedConstants = "duplicate",
    ) -> None:
        self.options = _options(backend_id, compile_specs, tag_constants, tag_mutated_buffers, shared_constants)

    def __repr__(self) -> str:
        return f"WholeProgramPartitioner({self.options.backend_id!r})"

    def __call__(self, program: Program) -> PartitionPlan:
        tags: dict[str, str] = {}
        delegate_calls: set[str] = set()
        for node in program.graph.nodes:
            if isinstance(node, CallFunction):
                if _is_delegate_call(node, delegate_calls):
                    if node.target == CALL_DELEGATE:
                        delegate_calls.add(node.name)
                    continue
                tags[node.name] = "tag0"
        _with_subgraph_attrs(program.graph, tags, ())
        return _finish(program, tags, self.options, ["tag0"] if tags else [])


class OpSupportPartitioner:
    """Maximal partitions of supported call nodes, in every graph (nested ones included): the
    partitions torch's ``CapabilityBasedPartitioner`` proposes (see `texir.lowering.capability`),
    so independent supported nodes share a partition whenever no cycle results.

    `ops` is a collection of canonical op names (``"aten::add.Tensor"``) or an `OpPredicate` on the
    call node and its graph's value metadata (to check dtypes or shapes); `node_filter`, if given,
    must accept a node too and sees its provenance (module stack, source function). Each of
    `keep_together` (node keys; nested: 'branch/name') lands in one partition or none, as with
    ExecuTorch's group-based partitioner (a dequantize chain with its linear, say).
    `shared_constants` is the plan's policy for a constant tagged for one partition and used by
    another (see `PartitionPlan`). Partitions are numbered 'tag0', 'tag1', ... in order of their
    first node, so plans do not depend on PYTHONHASHSEED. A getitem follows the multi-output node
    it reads.
    """

    def __init__(
        self,
        backend_id: str,
        ops: Collection[str] | OpPredicate,
        compile_specs: Sequence[CompileSpec] = (),
        *,
        tag_constants: bool = False,
        tag_mutated_buffers: bool = False,
        node_filter: NodeFilter | None = None,
        keep_together: Sequence[Sequence[str]] = (),
        shared_constants: SharedConstants = "duplicate",
    ) -> None:
        self.options = _options(backend_id, compile_specs, tag_constants, tag_mutated_buffers, shared_constants)
        if node_filter is not None and not callable(node_filter):
            raise PartitionerError(f"node_filter must be a function of a NodeContext, got {type(node_filter).__name__}")
        self.node_filter = node_filter
        try:
            self.keep_together: tuple[tuple[str, ...], ...] = tuple(
                _GroupOptions(groups={f"group {i}": tuple(g) for i, g in enumerate(keep_together)}).groups.values()
            )
        except pydantic.ValidationError as exc:
            raise PartitionerError(f"invalid keep_together groups: {exc.errors()[0]['msg']}") from None
        self._filtered: set[str] = set()
        """The nodes of the op set (or predicate) that the node filter refused in the last call, by name."""
        if callable(ops):
            self._supported: OpPredicate = ops
            self._ops: tuple[str, ...] = ()
        else:
            names = tuple(sorted(set(ops)))
            bad = [op for op in names if not isinstance(op, str) or "::" not in op]
            if bad:
                raise PartitionerError(
                    f"invalid op name(s) {bad[:3]}; use canonical names such as 'aten::add.Tensor'"
                )
            support = frozenset(names)
            self._supported = lambda node, metas: node.target in support
            self._ops = names

    def __repr__(self) -> str:
        return f"OpSupportPartitioner({self.options.backend_id!r}, ops={list(self._ops) or 'predicate'})"

    def explain(self, node: CallFunction) -> str:
        """Why this partitioner leaves `node` out (for `texir lower --explain`), as of its last call."""
        if node.name in self._filtered:
            return f"op '{node.target}' is supported but the node filter turned the node down"
        if self._ops:
            if node.target in self._ops:
                return f"op '{node.target}' is supported but the node was left in no partition"
            return f"op '{node.target}' is not among the supported ops"
        return f"the support predicate rejected op '{node.target}'"

    def supports_op(self, node: CallFunction) -> bool:
        """Whether `node`'s op is among the supported ops (with a predicate, which cannot tell an op it
        lacks from a node it refuses: whether the node filter refused a node the predicate took)."""
        return node.target in self._ops if self._ops else node.name in self._filtered

    def ops_to_not_decompose(self, program: Program) -> tuple[str, ...]:
        del program
        return self._ops

    def nodes_to_decompose(self, program: Program) -> tuple[str, ...]:
        """The nodes of kept ops (`ops`) that the node filter refuses: `lower` decomposes them, so
        their pieces are partitioned like any other node (ExecuTorch's per-node check_op_support)."""
        node_filter = self.node_filter
        if node_filter is None or not self._ops:
            return ()
        refused: list[str] = []
        for path, graph in walk_keyed_graphs(program.graph):
            metas = value_metas(graph)
            for index, node in enumerate(graph.nodes):
                if isinstance(node, CallFunction) and node.target in self._ops:
                    context = NodeContext(node=node, metas=metas, provenance=graph.prov(index), graph=path)
                    try:
                        accepted = bool(node_filter(context))
                    except Exception as exc:
                        raise PartitionerError(
                            f"the node filter raised {type(exc).__name__} on node '{node_key(path, node.name)}' "
                            f"({node.target}): {exc}"
                        ) from exc
                    if not accepted:
                        refused.append(node_key(path, node.name))
        return tuple(refused)

    def __call__(self, program: Program) -> PartitionPlan:
        tags: dict[str, str] = {}
        order: list[str] = []
        groups: dict[tuple[str, ...], list[list[str]]] = {}
        for group in self.keep_together:
            paths = {tuple(key.split("/")[:-1]) for key in group}
            if len(paths) != 1:
                raise PartitionerError(
                    f"keep-together group {list(group)[:4]} spans several graphs; a partition lives in one graph"
                )
            (path,) = paths
            groups.setdefault(path, []).append([key.rsplit("/", 1)[-1] for key in group])
        self._filtered = set()
        for path, graph in walk_keyed_graphs(program.graph):
            supported = self._support(graph, path)
            for members in maximal_partitions(graph, supported, groups.get(path, ())):
                tag = f"tag{len(order)}"
                order.append(tag)
                for name in members:
                    tags[node_key(path, name)] = tag
            _with_subgraph_attrs(graph, tags, path)
        return _finish(program, tags, self.options, order, self._ops)

    def _support(self, graph: Graph, path: tuple[str, ...]) -> dict[str, bool]:
        """Which call nodes of `graph` the predicate (and the node filter) accept."""
        metas = value_metas(graph)
        result: dict[str, bool] = {}
        delegate_calls: set[str] = set()
        for index, node in enumerate(graph.nodes):
            if not isinstance(node, CallFunction) or _is_delegate_call(node, delegate_calls):
                if isinstance(node, CallFunction) and node.target == CALL_DELEGATE:
                    delegate_calls.add(node.name)
                continue
            if node.target == GETITEM or isinstance(graph.meta(node), DelegateMeta):
                continue
            try:
                ok = bool(self._supported(node, metas))
                if ok and self.node_filter is not None:
                    context = NodeContext(node=node, metas=metas, provenance=graph.prov(index), graph=path)
                    ok = bool(self.node_filter(context))
                    if not ok:
                        self._filtered.add(node.name)
            except Exception as exc:
                raise PartitionerError(
                    f"the support predicate raised {type(exc).__name__} on node '{node_key(path, node.name)}' "
                    f"({node.target}): {exc}"
                ) from exc
            result[node.name] = ok
        return result


class _GroupOptions(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")

    groups: dict[str, tuple[str, ...]]

    @pydantic.field_validator("groups")
    @classmethod
    def _disjoint(cls, groups: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        owner: dict[str, str] = {}
        for tag, names in groups.items():
            if not tag:
                raise ValueError("tags must be non-empty strings")
            if not names:
                raise ValueError(f"group '{tag}' is empty")
            for name in names:
                if name in owner:
                    raise ValueError(f"node '{name}' is in groups '{owner[name]}' and '{tag}'")
                owner[name] = tag
        return groups


class NodeGroupPartitioner:
    """Explicit partitions: `groups` maps each tag to node keys (names; nested: 'branch/name')."""

    def __init__(
        self,
        backend_id: str,
        groups: Mapping[str, Sequence[str]],
        compile_specs: Sequence[CompileSpec] = (),
        *,
        tag_constants: bool = False,
        tag_mutated_buffers: bool = False,
        shared_constants: SharedConstants = "duplicate",
    ) -> None:
        self.options = _options(backend_id, compile_specs, tag_constants, tag_mutated_buffers, shared_constants)
        try:
            self.groups = _GroupOptions(groups={k: tuple(v) for k, v in groups.items()}).groups
        except pydantic.ValidationError as exc:
            raise PartitionerError(f"invalid groups: {exc.errors()[0]['msg']}") from None

    def __repr__(self) -> str:
        return f"NodeGroupPartitioner({self.options.backend_id!r}, {len(self.groups)} groups)"

    def __call__(self, program: Program) -> PartitionPlan:
        tags = {name: tag for tag, names in self.groups.items() for name in names}
        return _finish(program, tags, self.options, list(self.groups))
