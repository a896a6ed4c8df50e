"""`to_backend`: lower a whole program, or every partition of a plan, in one linear pass.

Per graph, each partition becomes a sub-program (placeholders ordered parameters, buffers,
constants, user inputs; outputs ordered consumed buffer mutations, then user outputs) compiled by
its backend, and the parent graph gets, at the partition's place, ``get_attr lowered_module_N``,
one ``texir::call_delegate`` call and one ``getitem`` per user output. As in ExecuTorch, the call's
TupleMeta lists every sub-program output (consumed mutations first) while getitem indices count
user outputs only, since consumed mutations stay inside the delegate.
"""

from __future__ import annotations

import gc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import overload

import msgspec

from texir.ir import (
    Argument,
    BufferInput,
    BufferMutation,
    CallFunction,
    CompileSpec,
    ConstantTensorInput,
    DelegateMeta,
    GetAttr,
    Graph,
    GraphBuilder,
    GraphSignature,
    InputSpec,
    IntArg,
    ListArg,
    LoweredBackendModule,
    ModuleCallEntry,
    ModuleCallSignature,
    NamedLoweredModule,
    Node,
    Output,
    OutputSpec,
    ParameterInput,
    Placeholder,
    Program,
    Provenance,
    Ref,
    StateEntry,
    Subgraph,
    SubgraphMeta,
    TupleArg,
    TupleMeta,
    UserInput,
    UserOutput,
    ValueMeta,
    build_graph,
)
from texir.ir.analysis import node_inputs, value_metas
from texir.ir.verify import verify
from texir.lowering.backend import lower_with_backend
from texir.lowering.errors import PartitionerError
from texir.lowering.plan import (
    CALL_DELEGATE,
    GETITEM,
    DelegationSpec,
    PartitionPlan,
    Partitioner,
    node_key,
    validate_plan,
    walk_keyed_graphs,
)

__all__ = ["LoweringReport", "PartitionSummary", "lower_plan", "lower_plan_explained", "to_backend"]

_Cache = dict[tuple[str, tuple[CompileSpec, ...], Program], LoweredBackendModule]
_Consumable = ParameterInput | BufferInput | ConstantTensorInput
_Entry = tuple[Node, ValueMeta | None, Provenance | None]
"""A node with its value metadata and provenance (see `Graph.entries`)."""


@overload
def to_backend(program: Program, backend_id: str, compile_specs: Sequence[CompileSpec] = ...) -> LoweredBackendModule: ...


@overload
def to_backend(program: Program, backend_id: Partitioner) -> Program: ...


@overload
def to_backend(program: Mapping[str, Program], backend_id: Partitioner) -> dict[str, Program]: ...


def to_backend(
    program: Program | Mapping[str, Program],
    backend_id: str | Partitioner,
    compile_specs: Sequence[CompileSpec] = (),
) -> LoweredBackendModule | Program | dict[str, Program]:
    """Lower `program`.

    - ``to_backend(program, "backend-id", compile_specs)``: the whole program to one backend,
      returning its LoweredBackendModule (ExecuTorch's ``to_backend(backend_id, program, specs)``).
    - ``to_backend(program, partitioner)``: every partition of the partitioner's plan, returning
      the new Program with delegate calls.
    - ``to_backend({"forward": p, ...}, partitioner)``: each method; identical delegates of
      different methods are compiled once and share one LoweredBackendModule object.
    """
    if isinstance(backend_id, str):
        if not isinstance(program, Program):
            raise PartitionerError("to_backend(program, backend_id, ...) takes one Program, not a mapping")
        return lower_with_backend(backend_id, program, tuple(compile_specs))
    partitioner = backend_id
    cache: _Cache = {}
    if isinstance(program, Program):
        return lower_plan(program, _call_partitioner(partitioner, program), _cache=cache)
    return {
        name: lower_plan(method, _call_partitioner(partitioner, method), _cache=cache)
        for name, method in program.items()
    }


def _call_partitioner(partitioner: Partitioner, program: Program) -> PartitionPlan:
    plan = partitioner(program)
    if not isinstance(plan, PartitionPlan):
        raise PartitionerError(
            f"partitioner {partitioner!r} returned {type(plan).__name__}; return a texir.lowering.PartitionPlan"
        )
    return plan


# --------------------------------------------------------------------------------------------------
# Building blocks


@dataclass
class _Part:
    """One partition of one graph while it is being lowered."""

    tag: str
    spec: DelegationSpec
    members: list[Node] = field(default_factory=list)
    names: set[str] = field(default_factory=set)
    user_inputs: list[str] = field(default_factory=list)
    user_outputs: list[str] = field(default_factory=list)
    consumed_mutations: list[tuple[str, int]] = field(default_factory=list)
    """(value name, parent output position) of buffer mutations that move into the delegate."""
    sub_program: Program | None = None
    module_name: str = ""
    call_name: str = ""
    getitem_names: list[str] = field(default_factory=list)
    debug_handle: int = 0
    last_index: int = 0


class _Names:
    """FX-like unique naming: ``base``, ``base_1``, ``base_2``... skipping names in use."""

    def __init__(self, used: set[str]) -> None:
        self.used = used
        self.counters: dict[str, int] = {}

    def fresh_indexed(self, base: str) -> str:
        """``base_0``, ``base_1``, ... (ExecuTorch's lowered module names)."""
        count = self.counters.get(base, 0)
        while f"{base}_{count}" in self.used:
            count += 1
        self.counters[base] = count + 1
        self.used.add(f"{base}_{count}")
        return f"{base}_{count}"

    def fresh(self, base: str) -> str:
        count = self.counters.get(base, 0)
        while True:
            name = base if count == 0 else f"{base}_{count}"
            count += 1
            if name not in self.used:
                self.counters[base] = count
                self.used.add(name)
                return name


def _rename(arg: Argument, names: Mapping[str, str]) -> Argument:
    if isinstance(arg, Ref):
        new = names.get(arg.name)
        return arg if new is None else Ref(name=new)
    if isinstance(arg, ListArg):
        return ListArg(items=tuple(_rename(a, names) for a in arg.items))
    if isinstance(arg, TupleArg):
        return TupleArg(items=tuple(_rename(a, names) for a in arg.items))
    return arg


def _rename_node(node: Node, names: Mapping[str, str]) -> Node:
    if not names:
        return node
    if isinstance(node, CallFunction):
        if not any(n in names for n in node_inputs(node)):
            return node
        return msgspec.structs.replace(
            node,
            args=tuple(_rename(a, names) for a in node.args),
            kwargs=tuple((k, _rename(v, names)) for k, v in node.kwargs),
        )
    if isinstance(node, Output):
        return msgspec.structs.replace(node, args=tuple(_rename(a, names) for a in node.args))
    return node


def _spec_tree(children: int, kind: str) -> str:
    leaf = '{"type": null, "context": null, "children_spec": []}'
    return f'{{"type": "builtins.{kind}", "context": "null", "children_spec": [{", ".join([leaf] * children)}]}}'


def _module_call_graph(n_inputs: int, n_outputs: int) -> tuple[ModuleCallEntry, ...]:
    """ExecuTorch's sub-program call spec: in_spec of ``(tuple(user_inputs), {})``, out_spec a list."""
    in_spec = (
        '[1, {"type": "builtins.tuple", "context": "null", "children_spec": ['
        + _spec_tree(n_inputs, "tuple")
        + ', {"type": "builtins.dict", "context": "[]", "children_spec": []}]}]'
    )
    out_spec = f"[1, {_spec_tree(n_outputs, 'list')}]"
    return (
        ModuleCallEntry(
            fqn="",
            signature=ModuleCallSignature(inputs=(), outputs=(), in_spec=in_spec, out_spec=out_spec),
        ),
    )


def _handle(prov: Provenance | None) -> int:
    return prov.debug_handle if prov is not None and prov.debug_handle is not None else 0


# --------------------------------------------------------------------------------------------------
# The pass


@dataclass
class _GraphWork:
    path: tuple[str, ...]
    graph: Graph
    tag_of: dict[str, str]
    parts: list[_Part]
    users: dict[str, list[str]]
    entry_of: dict[str, _Entry]
    """Each node's entry (node, meta, prov), by name."""
    positions: dict[str, list[int]]
    """Output positions of each value returned by the graph."""
    mutation_positions: dict[str, list[int]]
    """Top-level graph: output positions of the BufferMutation of each buffer target."""


class PartitionSummary(msgspec.Struct, frozen=True, kw_only=True):
    """What one partition became (for reports such as `texir lower`)."""

    tag: str
    backend_id: str
    module: str
    """The lowered module's name in `Program.lowered_modules`."""
    graph: str
    """'' for the top-level graph, else the nested graph's path ('true_graph_0')."""
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    consumed: tuple[str, ...]
    """Targets of the parameters, buffers and constants the delegate owns."""


class LoweringReport(msgspec.Struct, frozen=True, kw_only=True):
    program: Program
    partitions: tuple[PartitionSummary, ...]


def lower_plan(program: Program, plan: PartitionPlan, *, _cache: _Cache | None = None) -> Program:
    """Validate `plan` on `program`, compile every partition, and return the lowered program."""
    return lower_plan_explained(program, plan, _cache=_cache).program


def lower_plan_explained(program: Program, plan: PartitionPlan, *, _cache: _Cache | None = None) -> LoweringReport:
    """`lower_plan`, also summarising each partition in lowering order."""
    # The pass allocates many small objects that all stay alive; the cyclic collector would only
    # rescan the (large, acyclic) IR again and again, so it is paused for the duration.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _lower(program, plan, _cache)
    finally:
        if enabled:
            gc.enable()


def _lower(program: Program, plan: PartitionPlan, _cache: _Cache | None) -> LoweringReport:
    # Pass boundary: a malformed input gets the verifier's message (naming the node), not a failure
    # deep inside the pass. Linear in the program's size.
    verify(program)
    validate_plan(program, plan)
    tags = plan.tag_map()
    if not tags:
        return LoweringReport(program=program, partitions=())
    specs = plan.spec_map()
    spec_order = {tag: i for i, (tag, _) in enumerate(plan.specs)}
    cache: _Cache = {} if _cache is None else _cache

    top_consumable: dict[str, _Consumable] = {
        s.name: s for s in program.signature.inputs if isinstance(s, (ParameterInput, BufferInput, ConstantTensorInput))
    }
    state_by_target = {e.target: e for e in program.state}
    all_names: set[str] = {m.name for m in program.lowered_modules}
    works: list[_GraphWork] = []
    for path, graph in walk_keyed_graphs(program.graph):
        all_names.update(n.name for n in graph.nodes)
        tag_of = {}
        parts: dict[str, _Part] = {}
        for index, node in enumerate(graph.nodes):
            tag = tags.get(node_key(path, node.name))
            if tag is None:
                continue
            tag_of[node.name] = tag
            part = parts.get(tag)
            if part is None:
                part = parts[tag] = _Part(tag=tag, spec=specs[tag])
            part.members.append(node)
            part.names.add(node.name)
            if not isinstance(node, Placeholder):
                part.last_index = index
        if parts:
            users: dict[str, list[str]] = {n.name: [] for n in graph.nodes}
            for node in graph.nodes:
                for name in dict.fromkeys(node_inputs(node)):
                    if name in users:
                        users[name].append(node.name)
            ordered = sorted(parts.values(), key=lambda p: spec_order[p.tag])
            out = graph.nodes[-1]
            positions: dict[str, list[int]] = {}
            if isinstance(out, Output):
                for pos, arg in enumerate(out.args):
                    if isinstance(arg, Ref):
                        positions.setdefault(arg.name, []).append(pos)
            mutation_positions: dict[str, list[int]] = {}
            if not path:
                for pos, ospec in enumerate(program.signature.outputs):
                    if isinstance(ospec, BufferMutation):
                        mutation_positions.setdefault(ospec.target, []).append(pos)
            works.append(
                _GraphWork(
                    path=path,
                    graph=graph,
                    tag_of=tag_of,
                    parts=ordered,
                    users=users,
                    entry_of={entry[0].name: entry for entry in graph.entries()},
                    positions=positions,
                    mutation_positions=mutation_positions,
                )
            )

    # Sub-programs and names, in ExecuTorch's order: top-level partitions, then nested graphs.
    module_names = _Names(all_names)
    top_tags = works[0].tag_of if works and not works[0].path else {}
    top_handle_base = max(
        (h or 0 for n, h in zip(program.graph.nodes, program.graph.debug_handles()) if n.name not in top_tags), default=0
    )
    running_handle = 0
    for work in works:
        names = _Names({n.name for n in work.graph.nodes})
        prov_of = {name: prov for name, (_, _, prov) in work.entry_of.items()}
        is_top = not work.path
        if is_top:
            suffix = [0] * (len(work.parts) + 1)
            for i in range(len(work.parts) - 1, -1, -1):
                members = work.parts[i].members
                suffix[i] = max(suffix[i + 1], max((_handle(prov_of[n.name]) for n in members), default=0))
        for i, part in enumerate(work.parts):
            _build_sub_program(program, work, part, top_consumable if is_top else {}, state_by_target)
            part.module_name = module_names.fresh_indexed("lowered_module")
            names.used.add(part.module_name)
            part.call_name = names.fresh("executorch_call_delegate")
            part.getitem_names = [names.fresh("getitem") for _ in part.user_outputs]
            # ExecuTorch numbers the call max(debug handles in the owning graph) + 1 at the moment
            # it is inserted: other nodes, later partitions, earlier calls, and the getitems of this
            # partition's results, which carry their values' handles.
            results = [*part.user_outputs, *(n for n, _ in part.consumed_mutations)]
            result_max = max((_handle(prov_of[n]) for n in results), default=0)
            if is_top:
                running_handle = max(top_handle_base, suffix[i + 1], running_handle, result_max) + 1
            else:
                running_handle = max(top_handle_base, running_handle) + 1  # nested: the top graph only
            part.debug_handle = running_handle

    # Every plan problem was found above; only now do backends run.
    lowered: list[NamedLoweredModule] = list(program.lowered_modules)
    for work in works:
        for part in work.parts:
            assert part.sub_program is not None
            key = (part.spec.backend_id, part.spec.compile_specs, part.sub_program)
            module = cache.get(key)
            if module is None:
                module = lower_with_backend(
                    part.spec.backend_id, part.sub_program, part.spec.compile_specs, tag=part.tag
                )
                cache[key] = module
            lowered.append(NamedLoweredModule(name=part.module_name, module=module))

    by_path = {work.path: work for work in works}
    new_graph, signature = _assemble(program, program.graph, (), by_path, top_consumable)
    kept_targets = {
        s.target for s in signature.inputs if isinstance(s, (ParameterInput, BufferInput, ConstantTensorInput))
    }
    result = msgspec.structs.replace(
        program,
        graph=new_graph,
        signature=signature,
        state=tuple(e for e in program.state if e.target in kept_targets),
        lowered_modules=tuple(lowered),
    )
    summaries = []
    for work in works:
        for part in work.parts:
            assert part.sub_program is not None
            summaries.append(
                PartitionSummary(
                    tag=part.tag,
                    backend_id=part.spec.backend_id,
                    module=part.module_name,
                    graph="/".join(work.path),
                    nodes=tuple(n.name for n in part.members if not isinstance(n, Placeholder)),
                    inputs=tuple(part.user_inputs),
                    outputs=tuple(part.user_outputs) + tuple(n for n, _ in part.consumed_mutations),
                    consumed=tuple(
                        s.target
                        for s in part.sub_program.signature.inputs
                        if isinstance(s, (ParameterInput, BufferInput, ConstantTensorInput))
                    ),
                )
            )
    return LoweringReport(program=result, partitions=tuple(summaries))


def _build_sub_program(
    program: Program,
    work: _GraphWork,
    part: _Part,
    consumable: Mapping[str, _Consumable],
    state_by_target: Mapping[str, StateEntry],
) -> None:
    graph = work.graph
    entry_of = work.entry_of
    member_names = part.names
    consumed: dict[type, list[Placeholder]] = {ParameterInput: [], BufferInput: [], ConstantTensorInput: []}
    body: list[Node] = []
    external: dict[str, None] = {}
    for node in part.members:
        if isinstance(node, Placeholder):
            consumed[type(consumable[node.name])].append(node)
            continue
        body.append(node)
        for name in node_inputs(node):
            if name not in member_names:
                external.setdefault(name)
    part.user_inputs = list(external)

    # Parent output positions of each value, and which of them are consumed buffer mutations.
    out = graph.nodes[-1]
    assert isinstance(out, Output)
    positions = work.positions
    consumed_targets = {consumable[p.name].target for p in consumed[BufferInput]}
    mutation_target: dict[int, str] = {}
    if not work.path:
        for target in consumed_targets:
            for pos in work.mutation_positions.get(target, ()):
                mutation_target[pos] = target

    mutations: list[tuple[str, str]] = []
    for node in body:
        outside_users = [u for u in work.users[node.name] if u not in member_names]
        if not outside_users:
            continue
        needs_user_output = any(u != out.name for u in outside_users)
        for pos in positions.get(node.name, ()):
            if pos in mutation_target:
                mutations.append((node.name, mutation_target[pos]))
                part.consumed_mutations.append((node.name, pos))
            else:
                needs_user_output = True
        if needs_user_output:
            part.user_outputs.append(node.name)

    ordered_consumed = consumed[ParameterInput] + consumed[BufferInput] + consumed[ConstantTensorInput]
    attr_targets = {n.target for n in body if isinstance(n, GetAttr)} if graph.subgraphs else set()
    out_args = tuple(Ref(name=n) for n, _ in mutations) + tuple(Ref(name=n) for n in part.user_outputs)
    # Consumed placeholders and body nodes keep their metadata and provenance; a user input is a
    # fresh placeholder with its value's metadata only.
    builder = GraphBuilder()
    builder.extend(entry_of[p.name] for p in ordered_consumed)
    for name in part.user_inputs:
        builder.add(Placeholder(name=name), entry_of[name][1])
    builder.extend(entry_of[n.name] for n in body)
    builder.add(Output(name=out.name, args=out_args))
    sub_graph = builder.build(s for s in graph.subgraphs if s.name in attr_targets)
    inputs: list[InputSpec] = [consumable[p.name] for p in ordered_consumed]
    inputs += [UserInput(arg=Ref(name=name)) for name in part.user_inputs]
    outputs: list[OutputSpec] = [BufferMutation(name=n, target=t) for n, t in mutations]
    outputs += [UserOutput(arg=Ref(name=n)) for n in part.user_outputs]
    targets = sorted({consumable[p.name].target for p in ordered_consumed})
    part.sub_program = Program(
        graph=sub_graph,
        signature=msgspec.structs.replace(program.signature, inputs=tuple(inputs), outputs=tuple(outputs)),
        state=tuple(state_by_target[t] for t in targets),
        range_constraints=program.range_constraints,
        module_call_graph=_module_call_graph(len(part.user_inputs), len(part.user_outputs)),
        dialect=program.dialect,
    )


def _output_metas(part: _Part) -> tuple[ValueMeta, ...]:
    assert part.sub_program is not None
    metas = value_metas(part.sub_program.graph)
    out = part.sub_program.graph.nodes[-1]
    assert isinstance(out, Output)
    result: list[ValueMeta] = []
    for arg in out.args:
        assert isinstance(arg, Ref)
        meta = metas.get(arg.name)
        if meta is None:
            raise PartitionerError(
                f"partition '{part.tag}' outputs '{arg.name}', which has no value metadata; "
                "delegate outputs need metadata"
            )
        result.append(meta)
    return tuple(result)


def _emit_partition(part: _Part, renames: Mapping[str, str], entry_of: Mapping[str, _Entry]) -> list[_Entry]:
    n_mut = len(part.consumed_mutations)
    metas = _output_metas(part)
    call = CallFunction(
        name=part.call_name,
        target=CALL_DELEGATE,
        args=(Ref(name=part.module_name), *(_rename(Ref(name=n), renames) for n in part.user_inputs)),
    )
    entries: list[_Entry] = [
        (GetAttr(name=part.module_name, target=part.module_name), DelegateMeta(module=part.module_name), None),
        (call, TupleMeta(items=metas), Provenance(debug_handle=part.debug_handle)),
    ]
    for i, (name, source) in enumerate(zip(part.getitem_names, part.user_outputs)):
        # As in ExecuTorch, a result keeps the provenance of the value it replaces, minus the
        # module and source-function stacks, which describe the delegated op, not the getitem.
        prov = entry_of[source][2]
        if prov is not None:
            prov = msgspec.structs.replace(prov, nn_module_stack=(), source_fn_stack=())
        getitem = CallFunction(name=name, target=GETITEM, args=(Ref(name=part.call_name), IntArg(value=i)))
        entries.append((getitem, metas[n_mut + i], prov))
    return entries


def _assemble(
    program: Program,
    graph: Graph,
    path: tuple[str, ...],
    by_path: Mapping[tuple[str, ...], _GraphWork],
    consumable: Mapping[str, _Consumable],
) -> tuple[Graph, GraphSignature]:
    """The rebuilt graph (nested graphs first) and, for the top graph, the new signature."""
    subgraphs = tuple(
        Subgraph(name=s.name, graph=_assemble(program, s.graph, (*path, s.name), by_path, {})[0])
        for s in graph.subgraphs
    )
    work = by_path.get(path)
    signature = program.signature
    if work is None:
        return msgspec.structs.replace(graph, subgraphs=subgraphs), signature

    tag_of = work.tag_of
    part_of = {p.tag: p for p in work.parts}
    renames: dict[str, str] = {}
    for part in work.parts:
        renames.update(zip(part.user_outputs, part.getitem_names))

    # Groups: each partition (by tag) and every other node (by name). Tagged placeholders stay
    # singletons: they are consumed, or kept as placeholders when the parent still uses them.
    def group(node: Node) -> str:
        tag = tag_of.get(node.name)
        return "\0" + node.name if tag is None or isinstance(node, Placeholder) else tag

    node_group: dict[str, str] = {node.name: group(node) for node in graph.nodes}
    pending: dict[str, int] = {}
    dependents: dict[str, list[str]] = {}
    deps_seen: dict[str, set[str]] = {}
    for node in graph.nodes:
        g = node_group[node.name]
        seen = deps_seen.setdefault(g, set())
        pending.setdefault(g, 0)
        dependents.setdefault(g, [])
        for name in node_inputs(node):
            src = node_group.get(name)
            if src is None or src == g or src in seen:
                continue
            seen.add(src)
            pending[g] += 1
            dependents.setdefault(src, []).append(g)

    dropped: set[str] = set()
    for node in graph.nodes:
        if isinstance(node, Placeholder) and node.name in tag_of:
            if all(u in tag_of for u in work.users[node.name]):
                dropped.add(node.name)

    entry_of = work.entry_of
    emitted: list[_Entry] = []
    node_by_group: dict[str, Node] = {}
    reached: set[str] = set()
    done: set[str] = set()

    def emit(g: str) -> None:
        if g in part_of:
            emitted.extend(_emit_partition(part_of[g], renames, entry_of))
        else:
            node, meta, prov = entry_of[node_by_group[g].name]
            if node.name not in dropped:
                emitted.append((_rename_node(node, renames), meta, prov))

    def release(start: str) -> None:
        stack = [start]
        while stack:
            g = stack.pop()
            if g in done or g not in reached or pending[g] != 0:
                continue
            done.add(g)
            emit(g)
            ready = []
            for d in dependents[g]:
                pending[d] -= 1
                if pending[d] == 0 and d in reached:
                    ready.append(d)
            stack.extend(reversed(ready))

    out_node = graph.nodes[-1]
    for index, node in enumerate(graph.nodes[:-1]):
        g = node_group[node.name]
        if g in part_of:
            if index != part_of[g].last_index:
                continue
        else:
            node_by_group[g] = node
        reached.add(g)
        release(g)
    assert isinstance(out_node, Output)
    if len(done) != len(reached):  # pragma: no cover - validate_plan rules this out
        raise PartitionerError("internal error: partitions could not be ordered; please report")

    drop_positions = {pos for part in work.parts for _, pos in part.consumed_mutations}
    new_out = _rename_node(out_node, renames)
    assert isinstance(new_out, Output)
    if drop_positions:
        new_out = msgspec.structs.replace(
            new_out, args=tuple(a for i, a in enumerate(new_out.args) if i not in drop_positions)
        )
    emitted.append((new_out, None, entry_of[out_node.name][2]))
    kept_subgraphs = {n.target for n, meta, _ in emitted if isinstance(n, GetAttr) and isinstance(meta, SubgraphMeta)}
    new_graph = build_graph(emitted, subgraphs=tuple(s for s in subgraphs if s.name in kept_subgraphs))
    if path:
        return new_graph, signature

    placeholders_in = [n for n in program.graph.nodes if isinstance(n, Placeholder)]
    inputs = tuple(
        spec for ph, spec in zip(placeholders_in, signature.inputs) if ph.name not in dropped
    )
    outputs = tuple(
        _rename_output(spec, renames) for i, spec in enumerate(signature.outputs) if i not in drop_positions
    )
    return new_graph, msgspec.structs.replace(signature, inputs=inputs, outputs=outputs)


def _rename_output(spec: OutputSpec, names: Mapping[str, str]) -> OutputSpec:
    if isinstance(spec, UserOutput):
        return UserOutput(arg=_rename(spec.arg, names))
    new = names.get(spec.name)
    return spec if new is None else msgspec.structs.replace(spec, name=new)
