"""Partition plans (node -> tag, tag -> DelegationSpec), the Partitioner protocol, and plan validation.

A plan names nodes by key: the node name for the top-level graph, and ``"branch/name"`` (subgraph
names joined by ``/``) for nodes of nested torch.cond / torch.map graphs. Validation runs over the
whole program before any backend is called and raises one typed `PlanError` naming nodes and tag.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, Protocol, runtime_checkable

import msgspec

from texir.ir import (
    BackendNodeMeta,
    BufferInput,
    BufferMutation,
    CallFunction,
    CompileSpec,
    ConstantTensorInput,
    DelegateMeta,
    GetAttr,
    Graph,
    Node,
    Output,
    ParameterInput,
    Placeholder,
    Program,
    Ref,
    SubgraphMeta,
    TupleMeta,
    UserOutput,
)
from texir.ir.analysis import node_inputs, node_key, walk_keyed_graphs
from texir.ir.names import CALL_DELEGATE, GETITEM
from texir.lowering.convexity import check_acyclic
from texir.lowering.errors import (
    DelegateClaimedError,
    MissingDelegationSpecError,
    MutationAlsoOutputError,
    MutationOutsidePartitionError,
    NoCopyConstantError,
    PlanArgumentError,
    PlanError,
    SharedConstantError,
    SplitMultiOutputError,
    SubgraphAttrError,
    TaggedPlaceholderError,
    UnknownNodeError,
)

__all__ = [
    "CALL_DELEGATE",
    "GETITEM",
    "CheckedGraph",
    "CheckedPlan",
    "DelegationSpec",
    "PartitionPlan",
    "Partitioner",
    "node_key",
    "ops_to_not_decompose",
    "validate_plan",
    "walk_keyed_graphs",
]



class DelegationSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Which backend compiles a partition, with which options."""

    backend_id: str
    compile_specs: tuple[CompileSpec, ...] = ()


class PartitionPlan(msgspec.Struct, frozen=True, kw_only=True):
    """A partitioner's answer. `tags` maps node keys to tags; `specs` maps every tag to its
    DelegationSpec, in the order partitions are lowered (and lowered modules numbered)."""

    tags: tuple[tuple[str, str], ...]
    specs: tuple[tuple[str, DelegationSpec], ...]
    ops_to_not_decompose: tuple[str, ...] = ()
    backend_meta: tuple[BackendNodeMeta, ...] = ()
    """Notes for the backend on tagged nodes (by node key), carried into each sub-program's
    `Program.backend_meta`: what ExecuTorch partitioners write into `node.meta` for their backend."""
    shared_constants: Literal["duplicate", "pass_in", "error"] = "duplicate"
    """A parameter, buffer or constant tagged for one partition but also used outside it:
    ``duplicate`` (ExecuTorch's default) gives every partition using it its own copy (an untagged
    user keeps the parent's), ``pass_in`` keeps it in the parent and passes it to every delegate
    using it, ``error`` refuses the plan, naming every such user."""
    no_copy: tuple[str, ...] = ()
    """Tagged constants (node keys, sorted) the partitioner forbids copying whatever
    `shared_constants` says (ExecuTorch's `node.meta["no_copy"]`): one used outside its partition
    is a `NoCopyConstantError`."""

    def __post_init__(self) -> None:
        # msgspec checks field types only on decode: a dict given here would fail far away, on unpacking
        for field in ("tags", "specs"):
            if isinstance(getattr(self, field), Mapping):
                raise PlanArgumentError(
                    f"PartitionPlan({field}=...) takes a tuple of pairs, not a dict; build a plan from dicts "
                    "with PartitionPlan.build(tags={node: tag}, specs={tag: DelegationSpec(...)})"
                )

    @classmethod
    def build(
        cls,
        tags: Mapping[str, str],
        specs: Mapping[str, DelegationSpec] | Sequence[tuple[str, DelegationSpec]],
        *,
        ops_to_not_decompose: Sequence[str] = (),
        shared_constants: Literal["duplicate", "pass_in", "error"] = "duplicate",
        backend_meta: Sequence[BackendNodeMeta] = (),
        no_copy: Sequence[str] = (),
    ) -> PartitionPlan:
        """A plan from mappings; tags (and notes) are stored sorted so equal plans compare equal."""
        spec_items = tuple(specs.items()) if isinstance(specs, Mapping) else tuple(specs)
        if shared_constants not in ("duplicate", "pass_in", "error"):
            raise PlanError(
                f"shared_constants={shared_constants!r}; use 'duplicate', 'pass_in' or 'error'"
            )
        return cls(
            tags=tuple(sorted(tags.items())),
            specs=spec_items,
            ops_to_not_decompose=tuple(ops_to_not_decompose),
            shared_constants=shared_constants,
            backend_meta=tuple(sorted(backend_meta, key=lambda m: (m.node, m.key))),
            no_copy=tuple(sorted(set(no_copy))),
        )

    def tag_map(self) -> dict[str, str]:
        return dict(self.tags)

    def spec_map(self) -> dict[str, DelegationSpec]:
        return dict(self.specs)


class CheckedGraph(msgspec.Struct, frozen=True, kw_only=True):
    """What validation learned about one graph holding tagged nodes; lowering reads it instead of
    working it out again. The tables are read-only."""

    path: tuple[str, ...]
    """'' path for the top-level graph, else the nested graphs' names."""
    tag_of: dict[str, str]
    """Tagged node -> tag, in graph order."""
    group_of: dict[str, str]
    """Node -> its group: the tag for tagged nodes other than placeholders, else a singleton key."""
    users: dict[str, tuple[str, ...]]
    """Node -> the nodes reading it, in graph order, without repeats."""
    succs: dict[str, tuple[str, ...]]
    """Group -> the groups reading it (the partition-contracted graph, which is acyclic)."""
    indegree: dict[str, int]
    """Group -> how many groups it reads."""
    output_positions: dict[str, tuple[int, ...]]
    """Value -> the output positions returning it."""
    mutation_positions: dict[str, tuple[int, ...]]
    """Top-level graph: buffer target -> output positions of its BufferMutation."""
    copies: dict[str, tuple[str, ...]] = {}
    """Top-level graph, policy ``duplicate``: tagged constant -> the other partitions that get
    their own copy of it."""


class CheckedPlan(msgspec.Struct, frozen=True, kw_only=True):
    """A plan `validate_plan` accepted, with the facts lowering needs (see `CheckedGraph`)."""

    plan: PartitionPlan
    graphs: tuple[CheckedGraph, ...]
    """Graphs with tagged nodes, the top-level graph first, then nested graphs depth first."""


@runtime_checkable
class Partitioner(Protocol):
    """A pure function from a Program to a PartitionPlan. It may also define
    ``ops_to_not_decompose(program) -> Sequence[str]`` (see `ops_to_not_decompose`) and
    ``nodes_to_decompose(program) -> Sequence[str]``: node keys of kept ops it will not take after
    all, which `lower` decomposes (ExecuTorch's per-node ``check_op_support``)."""

    def __call__(self, program: Program, /) -> PartitionPlan: ...


def ops_to_not_decompose(partitioner: object, program: Program) -> tuple[str, ...]:
    """The canonical op names `partitioner` wants kept from decomposition (empty if it says none)."""
    method = getattr(partitioner, "ops_to_not_decompose", None)
    if method is None:
        return ()
    return tuple(sorted(set(method(program))))


def _is_delegate_node(graph: Graph, node: Node, delegate_calls: set[str]) -> bool:
    if isinstance(node, GetAttr):
        return isinstance(graph.meta(node), DelegateMeta)
    if isinstance(node, CallFunction):
        if node.target == CALL_DELEGATE:
            return True
        if node.target == GETITEM and node.args:
            first = node.args[0]
            return getattr(first, "name", None) in delegate_calls
    return False


def validate_plan(program: Program, plan: PartitionPlan) -> CheckedPlan:
    """Raise a `PlanError` for the first problem of `plan` on `program`; when every partition can
    be lowered in one pass, return the plan with what validation learned (`CheckedPlan`)."""
    tags = plan.tag_map()
    specs = plan.spec_map()
    for note in plan.backend_meta:
        if note.node not in tags:
            raise UnknownNodeError(
                f"backend_meta {note.key!r} is on node {note.node!r}, which the plan does not tag; "
                "notes are for the backend of a tagged node: tag the node or drop the note"
            )
    seen_keys: set[str] = set()
    missing: dict[str, str] = {}
    sig = program.signature
    consumable = {
        spec.name: spec
        for spec in sig.inputs
        if isinstance(spec, (ParameterInput, BufferInput, ConstantTensorInput))
    }
    out = program.graph.nodes[-1]
    mutation_of: dict[str, str] = {}  # buffer target -> mutated value name
    if isinstance(out, Output):
        for arg, ospec in zip(out.args, sig.outputs):
            if isinstance(ospec, BufferMutation):
                mutation_of[ospec.target] = ospec.name

    tags, copies = _shared_constant_policy(program, plan, tags, consumable, mutation_of)

    # Nested graphs holding tagged nodes: their cond/map cannot also move into a delegate.
    nested_tagged: dict[str, str] = {}
    for tagged_key, _ in plan.tags:
        parts = tagged_key.split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            nested_tagged.setdefault("/".join(parts[:depth]), tagged_key)

    checked: list[CheckedGraph] = []
    for path, graph in walk_keyed_graphs(program.graph):
        delegate_calls: set[str] = set()
        group_of: dict[str, str] = {}
        tag_of: dict[str, str] = {}
        for node in graph.nodes:
            key = node_key(path, node.name)
            if isinstance(node, CallFunction) and node.target == CALL_DELEGATE:
                delegate_calls.add(node.name)
            tag = tags.get(key)
            if tag is None:
                group_of[node.name] = "\0" + node.name
                continue
            seen_keys.add(key)
            if tag not in specs:
                missing.setdefault(tag, key)
            if isinstance(node, Output):
                raise TaggedPlaceholderError(
                    f"output node '{key}' is tagged '{tag}'; outputs are never delegated, untag it"
                )
            if isinstance(node, Placeholder) and (path or node.name not in consumable):
                what = "a placeholder of nested graph" if path else "a user input"
                raise TaggedPlaceholderError(
                    f"placeholder '{key}' is tagged '{tag}' but is {what}; only top-level parameters, "
                    "buffers and constants can be tagged (consumed by a delegate)"
                )
            if _is_delegate_node(graph, node, delegate_calls):
                raise DelegateClaimedError(
                    f"node '{key}' belongs to an already lowered delegate call and is tagged '{tag}'; "
                    "lowered calls cannot be claimed again, untag it"
                )
            if isinstance(node, GetAttr) and node_key(path, node.target) in nested_tagged:
                inner = nested_tagged[node_key(path, node.target)]
                raise SubgraphAttrError(
                    f"get_attr '{key}' is tagged '{tag}', but node '{inner}' inside that nested graph is "
                    f"tagged '{tags[inner]}' too; delegate either the whole cond/map or parts of its branches"
                )
            tag_of[node.name] = tag
            # A consumed placeholder has no inputs and may stay in the parent for other users, so
            # it never closes a cycle: keep it out of the partition's group.
            group_of[node.name] = "\0" + node.name if isinstance(node, Placeholder) else tag
        if missing:
            tag, key = next(iter(missing.items()))
            raise MissingDelegationSpecError(
                f"tag '{tag}' (node '{key}') has no DelegationSpec; add it to the plan's specs"
            )
        if tag_of:
            cg = _check_graph(program, graph, path, tag_of, group_of, consumable, mutation_of)
            if not path and copies:
                cg = msgspec.structs.replace(cg, copies=copies)
            checked.append(cg)

    unknown = sorted(set(tags) - seen_keys)
    if unknown:
        raise UnknownNodeError(
            f"the plan tags node(s) {unknown[:5]} (tag '{tags[unknown[0]]}') that the program does not "
            "have; use node names (nested graphs: 'branch/name')"
        )
    return CheckedPlan(plan=plan, graphs=tuple(checked))


def _shared_constant_policy(
    program: Program,
    plan: PartitionPlan,
    tags: dict[str, str],
    consumable: Mapping[str, ParameterInput | BufferInput | ConstantTensorInput],
    mutation_of: Mapping[str, str],
) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """Apply the plan's `shared_constants` policy to top-level constants that are tagged for one
    partition and used outside it. Returns the tags to lower with and, for ``duplicate``, the
    other partitions that get a copy of each such constant."""
    outside: dict[str, list[tuple[str, str | None]]] = {}
    for node in program.graph.nodes:
        user_tag = tags.get(node.name)
        for name in dict.fromkeys(node_inputs(node)):
            tag = tags.get(name)
            spec = consumable.get(name)
            if tag is None or spec is None or user_tag == tag or isinstance(node, Output):
                continue
            if isinstance(spec, BufferInput) and spec.target in mutation_of:
                continue  # a mutated buffer has one owner; validation explains the conflict
            outside.setdefault(name, []).append((node.name, user_tag))
    if not outside:
        return tags, {}
    for name in plan.no_copy:
        if name in outside:
            user, user_tag = outside[name][0]
            raise NoCopyConstantError(
                f"constant data node ({name}) is tagged with ({tags[name]}) but has user ({user}) which has "
                f"tag ({user_tag}), and its partitioner marked it no_copy (each partition may not get its own "
                "copy): tag that user with it too, or let the partitioner allow copies"
            )
    if plan.shared_constants == "error":
        name, users = next(iter(outside.items()))
        listed = ", ".join(f"'{u}' ({'tag ' + repr(t) if t else 'not delegated'})" for u, t in users)
        more = f" ({len(outside) - 1} more shared constants)" if len(outside) > 1 else ""
        raise SharedConstantError(
            f"'{name}' is tagged '{tags[name]}' but is also used by {listed}{more}; the plan's "
            "shared_constants policy is 'error': tag those users with it too, or choose 'duplicate' "
            "(each delegate gets a copy) or 'pass_in' (the parent keeps it and passes it in)"
        )
    tags = dict(tags)
    copies: dict[str, tuple[str, ...]] = {}
    for name, users in outside.items():
        if plan.shared_constants == "pass_in":
            del tags[name]
        else:
            others = sorted({t for _, t in users if t is not None})
            if others:
                copies[name] = tuple(others)
    return tags, copies


def _check_mutation_only_output(program: Program, buffer: str, target: str, value: str, tag: str) -> None:
    """A consumed buffer's update leaves its delegate as that update only (ExecuTorch's rule)."""
    out = program.graph.nodes[-1]
    others = [
        "a user output" if isinstance(spec, UserOutput)
        else f"the update of buffer {spec.target}" if isinstance(spec, BufferMutation)
        else type(spec).__name__
        for arg, spec in zip(out.args if isinstance(out, Output) else (), program.signature.outputs)
        if isinstance(arg, Ref) and arg.name == value
        and not (isinstance(spec, BufferMutation) and spec.target == target)
    ]
    if others:
        raise MutationAlsoOutputError(
            f"buffer '{buffer}' ({target}) is tagged '{tag}' (the delegate consumes it and owns its update) but "
            f"its new value '{value}' is also returned as {', '.join(others)}; "
            "a delegate returns a consumed buffer's update as that update only (ExecuTorch refuses this too, "
            "and backends are built for that): leave the buffer untagged (the delegate then returns the new value "
            "and the program writes it back)"
        )


def _check_graph(
    program: Program,
    graph: Graph,
    path: tuple[str, ...],
    tag_of: dict[str, str],
    group_of: dict[str, str],
    consumable: Mapping[str, ParameterInput | BufferInput | ConstantTensorInput],
    mutation_of: Mapping[str, str],
) -> CheckedGraph:
    where = f" in nested graph '{'/'.join(path)}'" if path else ""
    nodes_by_name = {node.name: node for node in graph.nodes}
    # Constants and subgraph get_attrs go with their users' partition.
    for node in graph.nodes:
        tag = tag_of.get(node.name)
        if isinstance(node, (CallFunction, Output)):
            for name in node_inputs(node):
                src = nodes_by_name.get(name)
                src_tag = tag_of.get(name)
                if src is None:
                    continue
                if (
                    isinstance(src, Placeholder)
                    and src_tag is not None
                    and tag is None
                    and isinstance(consumable.get(name), BufferInput)
                    and consumable[name].target in mutation_of
                ):
                    raise MutationOutsidePartitionError(
                        f"buffer '{name}' ({consumable[name].target}) is consumed and mutated by partition "
                        f"'{src_tag}', but '{node.name}' outside it reads the buffer{where}; it would read a "
                        "stale copy: tag that reader too, or leave the buffer untagged"
                    )
                if (
                    isinstance(src, Placeholder)
                    and src_tag is not None
                    and tag is not None
                    and src_tag != tag
                    and isinstance(consumable.get(name), BufferInput)
                    and consumable[name].target in mutation_of
                ):
                    raise SharedConstantError(
                        f"mutated buffer '{name}' is tagged '{src_tag}' (that delegate owns its updates) but "
                        f"node '{node.name}' of partition '{tag}' also uses it{where}; a buffer's state has one "
                        "owner: tag its readers for one partition, or leave it untagged"
                    )
                if (
                    isinstance(node, CallFunction)
                    and node.target == GETITEM
                    and isinstance(src, CallFunction)
                    and isinstance(graph.meta(src), TupleMeta)
                    and src.target != CALL_DELEGATE
                    and src_tag != tag
                ):
                    raise SplitMultiOutputError(
                        f"'{name}' returns several values and is tagged {src_tag!r}, but its result "
                        f"'{node.name}' is tagged {tag!r}{where}; a delegate passes tensors only, so tag "
                        "the getitems with the node they read"
                    )
                if isinstance(src, GetAttr) and isinstance(graph.meta(src), SubgraphMeta) and src_tag != tag and (
                    src_tag is not None or tag is not None
                ):
                    raise SubgraphAttrError(
                        f"node '{node.name}' (tag {tag!r}) uses nested graph get_attr '{name}' "
                        f"(tag {src_tag!r}){where}; tag the get_attr with its user"
                    )
        if isinstance(node, Placeholder) and tag is not None:
            spec = consumable[node.name]
            if isinstance(spec, BufferInput) and spec.target in mutation_of:
                value = mutation_of[spec.target]
                if tag_of.get(value) != tag:
                    raise MutationOutsidePartitionError(
                        f"buffer '{node.name}' ({spec.target}) is tagged '{tag}' but its mutation '{value}' "
                        f"is {'tagged ' + repr(tag_of[value]) if value in tag_of else 'not delegated'}; "
                        f"tag '{value}' with '{tag}' too, or leave the buffer untagged"
                    )
                _check_mutation_only_output(program, node.name, spec.target, value, tag)
    succs, indegree = check_acyclic(graph, group_of, tag_of, where)
    users: dict[str, list[str]] = {n.name: [] for n in graph.nodes}
    for node in graph.nodes:
        for name in dict.fromkeys(node_inputs(node)):
            if name in users:
                users[name].append(node.name)
    positions: dict[str, list[int]] = {}
    out = graph.nodes[-1]
    if isinstance(out, Output):
        for pos, arg in enumerate(out.args):
            if isinstance(arg, Ref):
                positions.setdefault(arg.name, []).append(pos)
    mutation_positions: dict[str, list[int]] = {}
    if not path:
        for pos, ospec in enumerate(program.signature.outputs):
            if isinstance(ospec, BufferMutation):
                mutation_positions.setdefault(ospec.target, []).append(pos)
    return CheckedGraph(
        path=path,
        tag_of=tag_of,
        group_of=group_of,
        users={k: tuple(v) for k, v in users.items()},
        succs=succs,
        indegree=indegree,
        output_positions={k: tuple(v) for k, v in positions.items()},
        mutation_positions={k: tuple(v) for k, v in mutation_positions.items()},
    )
