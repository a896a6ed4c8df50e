"""Built-in partitioners: whole program, maximal convex partitions of supported ops, explicit groups.

Each is a frozen, pure callable `Program -> PartitionPlan`. Options are validated with pydantic
when the partitioner is built, so a bad option fails at construction with a message naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

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
    Ref,
    SubgraphMeta,
    ValueMeta,
)
from texir.ir.analysis import node_inputs, value_metas
from texir.ir.names import CALL_DELEGATE, GETITEM
from texir.lowering.errors import PartitionerError
from texir.lowering.plan import (
    DelegationSpec,
    PartitionPlan,
    node_key,
    walk_keyed_graphs,
)

__all__ = [
    "NodeGroupPartitioner",
    "OpSupportPartitioner",
    "WholeProgramPartitioner",
    "tag_constants",
    "tag_mutated_buffers",
]

OpPredicate = Callable[[CallFunction, Mapping[str, ValueMeta]], bool]
"""Whether a backend supports a call node: gets the node and its graph's value metadata by name
(``metas[node.name]`` for its result, ``metas[ref.name]`` for an input)."""


class _Options(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(frozen=True, arbitrary_types_allowed=True, extra="forbid")

    backend_id: str = pydantic.Field(min_length=1)
    compile_specs: tuple[CompileSpec, ...] = ()
    tag_constants: bool = False
    tag_mutated_buffers: bool = False


def _options(
    backend_id: str, compile_specs: Sequence[CompileSpec], tag_constants: bool, tag_mutated_buffers: bool
) -> _Options:
    """The options every built-in partitioner shares, validated."""
    try:
        return _Options(
            backend_id=backend_id,
            compile_specs=tuple(compile_specs),
            tag_constants=tag_constants,
            tag_mutated_buffers=tag_mutated_buffers,
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
    """`tags` plus each top-level parameter, buffer (not mutated) or constant whose tagged users all
    carry one tag (as ExecuTorch's ``tag_constant_data``). A constant used by two partitions stays
    untagged, so both delegates receive it as an input rather than one owning it."""
    result = dict(tags)
    mutated = {s.target for s in program.signature.outputs if isinstance(s, BufferMutation)}
    _tag_placeholders(program, result, lambda spec: not (isinstance(spec, BufferInput) and spec.target in mutated))
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
        if len(found) == 1 and name not in tags:
            chosen[name] = (next(iter(found)), specs[name])
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
    return PartitionPlan.build(tags, [(tag, spec) for tag in tag_order], ops_to_not_decompose=keep)


class WholeProgramPartitioner:
    """Every top-level call (nested graphs go along with their cond/map) in one partition 'tag0'."""

    def __init__(
        self,
        backend_id: str,
        compile_specs: Sequence[CompileSpec] = (),
        *,
        tag_constants: bool = False,
        tag_mutated_buffers: bool = False,
    ) -> None:
        self.options = _options(backend_id, compile_specs, tag_constants, tag_mutated_buffers)

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
    """Maximal convex partitions of supported call nodes, in every graph (nested ones included).

    `ops` is a collection of canonical op names (``"aten::add.Tensor"``) or an `OpPredicate` on the
    call node and its graph's value metadata (to check dtypes or shapes). One greedy pass in graph order: a supported node joins the partitions of its supported
    inputs that no path outside them connects to it (merging them), else starts a new partition.
    Partitions are numbered 'tag0', 'tag1', ... in order of their first node, so plans do not
    depend on PYTHONHASHSEED. A getitem follows the multi-output node it reads.
    """

    def __init__(
        self,
        backend_id: str,
        ops: Collection[str] | OpPredicate,
        compile_specs: Sequence[CompileSpec] = (),
        *,
        tag_constants: bool = False,
        tag_mutated_buffers: bool = False,
    ) -> None:
        self.options = _options(backend_id, compile_specs, tag_constants, tag_mutated_buffers)
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
        """Why this partitioner leaves `node` out (for `texir lower --explain`)."""
        if self._ops:
            return f"op '{node.target}' is not among the supported ops"
        return f"the support predicate rejected op '{node.target}'"

    def ops_to_not_decompose(self, program: Program) -> tuple[str, ...]:
        del program
        return self._ops

    def __call__(self, program: Program) -> PartitionPlan:
        tags: dict[str, str] = {}
        order: list[str] = []
        counter = 0
        for path, graph in walk_keyed_graphs(program.graph):
            roots = _convex_groups(graph, self._supported)
            local: dict[int, str] = {}
            for node in graph.nodes:
                root = roots.get(node.name)
                if root is None:
                    continue
                tag = local.get(root)
                if tag is None:
                    tag = local[root] = f"tag{counter}"
                    counter += 1
                    order.append(tag)
                tags[node_key(path, node.name)] = tag
            _with_subgraph_attrs(graph, tags, path)
        return _finish(program, tags, self.options, order, self._ops)


class _UnionFind:
    def __init__(self) -> None:
        self.parent: list[int] = []

    def make(self) -> int:
        self.parent.append(len(self.parent))
        return len(self.parent) - 1

    def find(self, x: int) -> int:
        parent = self.parent
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root


def _convex_groups(graph: Graph, supported: OpPredicate) -> dict[str, int]:
    """Node name -> partition root for supported nodes, in one linear pass.

    Each node gets a level: the most "exits" on any path to it, an exit being an unsupported node
    that some supported node reaches (unsupported nodes no partition reaches can never close a
    cycle, so they do not count). Levels never decrease along a path and grow after each exit,
    so connecting supported neighbours of equal level yields partitions that are convex and never
    depend on each other: a path that left a partition and came back would have crossed an exit
    and could not return to the partition's level.
    """
    uf = _UnionFind()
    metas = value_metas(graph)
    part: dict[str, int] = {}
    level: dict[str, int] = {}
    exit_: dict[str, bool] = {}  # unsupported and reached from a supported node
    tainted: dict[str, bool] = {}
    # Supported nodes that read no partition's output (weight permutes, ...) and have no user yet:
    # their level is not fixed, so their first supported user may adopt them at its own level.
    floating: set[str] = set()
    delegate_calls: set[str] = set()
    for node in graph.nodes:
        inputs = [n for n in dict.fromkeys(node_inputs(node)) if n in level]
        adoptable = [i for i in inputs if i in floating]
        floating.difference_update(adoptable)
        lvl = max((level[i] + exit_[i] for i in inputs if i not in adoptable), default=0)
        ok = False
        if isinstance(node, CallFunction):
            if node.target == CALL_DELEGATE:
                delegate_calls.add(node.name)
            elif node.target == GETITEM:
                first = node.args[0] if node.args else None
                ok = isinstance(first, Ref) and first.name in part
            else:
                try:
                    ok = bool(supported(node, metas)) and not isinstance(graph.meta(node), DelegateMeta)
                except Exception as exc:
                    raise PartitionerError(
                        f"the support predicate raised {type(exc).__name__} on node '{node.name}' "
                        f"({node.target}): {exc}"
                    ) from exc
        level[node.name] = lvl
        if not ok:
            tainted[node.name] = any(tainted[i] for i in inputs)
            exit_[node.name] = tainted[node.name]
            continue
        if not any(tainted[i] for i in inputs):
            floating.add(node.name)
        tainted[node.name] = True
        exit_[node.name] = False
        for i in adoptable:
            level[i] = lvl
        root = -1
        for i in inputs:
            if i in part and level[i] == lvl:
                other = uf.find(part[i])
                if root < 0:
                    root = other
                elif other != root:
                    # Keep the older root so tags follow first appearance.
                    low, high = min(root, other), max(root, other)
                    uf.parent[high] = low
                    root = low
        part[node.name] = root if root >= 0 else uf.make()
    return {name: uf.find(root) for name, root in part.items()}


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
    ) -> None:
        self.options = _options(backend_id, compile_specs, tag_constants, tag_mutated_buffers)
        try:
            self.groups = _GroupOptions(groups={k: tuple(v) for k, v in groups.items()}).groups
        except pydantic.ValidationError as exc:
            raise PartitionerError(f"invalid groups: {exc.errors()[0]['msg']}") from None

    def __repr__(self) -> str:
        return f"NodeGroupPartitioner({self.options.backend_id!r}, {len(self.groups)} groups)"

    def __call__(self, program: Program) -> PartitionPlan:
        tags = {name: tag for tag, names in self.groups.items() for name in names}
        return _finish(program, tags, self.options, list(self.groups))
