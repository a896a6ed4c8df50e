"""Lower every partition of a checked plan in one linear pass: `apply_plan`, the engine behind
`texir.lower` and `to_backend`.

Per graph, each partition becomes a sub-program (placeholders ordered parameters, buffers,
constants, user inputs; outputs ordered consumed buffer mutations, then user outputs) compiled by
its backend, and the parent graph gets, at the partition's place, ``get_attr lowered_module_N``,
one ``texir::call_delegate`` call and one ``getitem`` per user output. As in ExecuTorch, the call's
TupleMeta lists every sub-program output (consumed mutations first) while getitem indices count
user outputs only, since consumed mutations stay inside the delegate.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Mapping
from concurrent.futures import Executor

import msgspec

from texir.edge.unused_state import remove_unused_state
from texir.ir import (
    BackendNodeMeta,
    BufferInput,
    CallFunction,
    CompileSpec,
    ConstantTensorInput,
    DelegateMeta,
    GetAttr,
    Graph,
    GraphSignature,
    IntArg,
    LoweredBackendModule,
    NamedLoweredModule,
    Node,
    Output,
    ParameterInput,
    Placeholder,
    Program,
    Provenance,
    Ref,
    Subgraph,
    SubgraphMeta,
    TupleMeta,
    ValueMeta,
    build_graph,
)
from texir.ir.analysis import node_key, value_metas, walk_keyed_graphs
from texir.ir.names import (
    CALL_DELEGATE,
    GETITEM,
    NameAllocator,
    rename_arg,
    rename_node,
    rename_output_spec,
)
from texir.ir.verify import verify
from texir.lowering.preprocess import PreprocessCache, PreprocessRequest, run_preprocess_timed
from texir.lowering.errors import PartitionerError
from texir.lowering._parts import Consumable as _Consumable
from texir.lowering._parts import Entry as _Entry
from texir.lowering._parts import GraphWork as _GraphWork
from texir.lowering._parts import Part as _Part
from texir.lowering._parts import debug_handle_of as _handle
from texir.lowering._parts import (
    NodeOrder,
    Numbering,
    check_node_order,
    check_numbering,
    entries_in_final_order,
    lowering_order,
)
from texir.lowering._parts import order_like_executorch as _order_like_executorch
from texir.lowering.sub_program import build_sub_program
from texir.lowering.report import AppliedPlan, DelegateReport
from texir.lowering.plan import (
    CheckedPlan,
    PartitionPlan,
    validate_plan,
)

__all__ = [
    "AppliedPlan",
    "NodeOrder",
    "Numbering",
    "PreprocessOptions",
    "SharedModules",
    "check_node_order",
    "apply_plan",
]

SharedModules = dict[tuple[str, tuple[CompileSpec, ...], Program], LoweredBackendModule]


class PreprocessOptions(msgspec.Struct, frozen=True):
    """How backends run: through `cache` (None: none), on `executor` when given (any
    `concurrent.futures.Executor`), else in up to `jobs` worker processes."""

    cache: PreprocessCache | None = None
    jobs: int = 1
    executor: Executor | None = None
# --------------------------------------------------------------------------------------------------
# The pass


def apply_plan(
    program: Program,
    plan: PartitionPlan,
    *,
    preprocess: PreprocessOptions | None = None,
    order: NodeOrder = "program",
    shared: SharedModules | None = None,
    numbering: Numbering = "per_tag",
) -> AppliedPlan:
    """Validate `plan` on `program`, compile every partition, and return the lowered program with
    a summary of each partition in lowering order. `shared`: lowered modules by (backend, compile
    specs, sub-program), filled as partitions compile, so that the methods of one `to_backend`
    call share identical delegates. The engine behind `texir.lower` and `to_backend`, not a public
    entry point (texir.lowering does not export it). `numbering`: see `Numbering`."""
    check_node_order(order)
    check_numbering(numbering)
    # The pass allocates many small objects that all stay alive; the cyclic collector would only
    # rescan the (large, acyclic) IR again and again, so it is paused for the duration.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _lower(program, plan, shared, preprocess, order, numbering)
    finally:
        if enabled:
            gc.enable()


def _lower(
    program: Program, plan: PartitionPlan, shared: SharedModules | None, preprocess: PreprocessOptions | None,
    order: NodeOrder, numbering: Numbering = "per_tag",
) -> AppliedPlan:
    # Pass boundary: a malformed input gets the verifier's message (naming the node), not a failure
    # deep inside the pass. Linear in the program's size.
    verify(program)
    checked = validate_plan(program, plan)
    if not checked.graphs:
        return AppliedPlan(program=program, delegates=())
    top_consumable: dict[str, _Consumable] = {
        s.name: s for s in program.signature.inputs if isinstance(s, (ParameterInput, BufferInput, ConstantTensorInput))
    }
    works = _collect_partitions(program, checked)
    if order == "executorch":
        for work in works:
            _order_like_executorch(work, {} if work.path else top_consumable)
    _build_and_name(program, works, top_consumable, numbering)
    lowered, stats, (cached, compiled) = _compile(program, works, {} if shared is None else shared, preprocess)
    result = _assemble_program(program, works, top_consumable, lowered)
    # As exir's to_edge does before partitioning: parameters no node reads leave the program.
    result = remove_unused_state(result, kinds=(ParameterInput,))
    return AppliedPlan(
        program=result, delegates=_summaries(works, lowered, stats),
        preprocess_cached=cached, preprocess_compiled=compiled,
    )


def _collect_partitions(program: Program, checked: CheckedPlan) -> list[_GraphWork]:
    """Phase 1: each checked graph's partitions, members in graph order, in the plan's spec order."""
    specs = checked.plan.spec_map()
    spec_order = {tag: i for i, (tag, _) in enumerate(checked.plan.specs)}
    graphs = dict(walk_keyed_graphs(program.graph))
    notes: dict[str, list[BackendNodeMeta]] = {}
    for note in checked.plan.backend_meta:
        notes.setdefault(note.node, []).append(note)
    works = []
    for cg in checked.graphs:
        graph = graphs[cg.path]
        parts: dict[str, _Part] = {}
        for index, node in enumerate(graph.nodes):
            tag = cg.tag_of.get(node.name)
            if tag is None:
                continue
            # A constant shared under the 'duplicate' policy is a member of every partition using it.
            for t in (tag, *cg.copies.get(node.name, ())):
                part = parts.get(t)
                if part is None:
                    part = parts[t] = _Part(tag=t, spec=specs[t])
                part.members.append(node)
                part.names.add(node.name)
                if not isinstance(node, Placeholder):
                    part.last_index = index
        works.append(_GraphWork(
            checked=cg,
            graph=graph,
            parts=sorted(parts.values(), key=lambda p: spec_order[p.tag]),
            entry_of={entry[0].name: entry for entry in graph.entries()},
            backend_meta={
                node.name: [msgspec.structs.replace(m, node=node.name) for m in found]
                for node in graph.nodes
                if (found := notes.get(node_key(cg.path, node.name)))
            } if notes else {},
        ))
    return works


def _build_and_name(
    program: Program, works: list[_GraphWork], top_consumable: Mapping[str, _Consumable], numbering: Numbering,
) -> None:
    """Phase 2: sub-programs and getitem names in each graph's tag order, then lowered-module
    names, delegate-call names and debug handles in ExecuTorch's lowering order (`Numbering`)."""
    state_by_target = {e.target: e for e in program.state}
    all_names: set[str] = {m.name for m in program.lowered_modules}
    for _, graph in walk_keyed_graphs(program.graph):
        all_names.update(n.name for n in graph.nodes)
    module_names = NameAllocator(all_names)
    top_tags = works[0].checked.tag_of if works and not works[0].path else {}
    top_handle_base = max(
        (h or 0 for n, h in zip(program.graph.nodes, program.graph.debug_handles()) if n.name not in top_tags), default=0
    )
    allocators: list[NameAllocator] = []
    result_max: dict[int, int] = {}
    later_max: dict[int, int] = {}
    for work in works:
        names = NameAllocator({n.name for n in work.graph.nodes})
        allocators.append(names)
        prov_of = {name: prov for name, (_, _, prov) in work.entry_of.items()}
        suffix = 0
        for part in reversed(work.parts):
            later_max[id(part)] = suffix
            suffix = max(suffix, max((_handle(prov_of[n.name]) for n in part.members), default=0))
        for part in work.parts:
            build_sub_program(program, work, part, {} if work.path else top_consumable, state_by_target)
            part.getitem_names = [names.fresh("getitem") for _ in part.user_outputs]
            # The getitems of a partition's results carry their values' debug handles.
            results = [*part.user_outputs, *(n for n, _ in part.consumed_mutations)]
            result_max[id(part)] = max((_handle(prov_of[n]) for n in results), default=0)
    running_handle = 0
    for w, i in lowering_order(works, numbering):
        work, part = works[w], works[w].parts[i]
        part.module_name = module_names.fresh_indexed("lowered_module")
        allocators[w].used.add(part.module_name)
        part.call_name = allocators[w].fresh("executorch_call_delegate")
        # ExecuTorch numbers the call max(debug handles in the owning top graph) + 1 when it inserts it: nodes
        # in no partition, earlier calls, fused partitions' getitems, per tag the later partitions' members.
        if work.path:
            running_handle = max(top_handle_base, running_handle)
        elif numbering == "fused":
            running_handle = max(top_handle_base, running_handle, *(result_max[id(p)] for p in work.parts))
        else:
            running_handle = max(top_handle_base, later_max[id(part)], running_handle, result_max[id(part)])
        running_handle += 1
        part.debug_handle = running_handle


def _compile(
    program: Program, works: list[_GraphWork], cache: SharedModules, options: PreprocessOptions | None
) -> tuple[tuple[NamedLoweredModule, ...], dict[str, tuple[bool, float]], tuple[float, float]]:
    """Phase 3: every partition through its backend (identical sub-programs compiled once; with
    `options`, through its preprocess cache and worker processes). Every plan problem was found
    before: only now do backends run. Also the seconds of the cache's hits and of the rest."""
    lowered: list[NamedLoweredModule] = list(program.lowered_modules)
    parts = [part for work in works for part in work.parts]
    keys = []
    pending: dict[tuple[str, tuple[CompileSpec, ...], Program], PreprocessRequest] = {}
    for part in parts:
        assert part.sub_program is not None  # built in phase 2
        key = (part.spec.backend_id, part.spec.compile_specs, part.sub_program)
        keys.append(key)
        if key not in cache and key not in pending:
            pending[key] = PreprocessRequest(part.spec.backend_id, part.sub_program, part.spec.compile_specs, part.tag)
    compiled: dict[tuple[str, tuple[CompileSpec, ...], Program], tuple[bool, float]] = {}
    hit_seconds = wall = 0.0
    if pending:
        requests = list(pending.values())
        start = time.perf_counter()
        results = run_preprocess_timed(requests, cache=None if options is None else options.cache,
                                       jobs=1 if options is None else options.jobs,
                                       executor=None if options is None else options.executor)
        wall = time.perf_counter() - start
        hit_seconds = sum(r.seconds for r in results if r.cache_hit)
        cache.update((key, r.module) for key, r in zip(pending, results))
        compiled.update((key, (r.cache_hit, r.seconds)) for key, r in zip(pending, results))
    stats: dict[str, tuple[bool, float]] = {}
    for part, key in zip(parts, keys):
        lowered.append(NamedLoweredModule(name=part.module_name, module=cache[key]))
        # the first partition of a sub-program compiled now is not a hit; its twins are
        stats[part.module_name] = compiled.pop(key, (True, 0.0))
    return tuple(lowered), stats, (hit_seconds, max(wall - hit_seconds, 0.0))


def _assemble_program(
    program: Program,
    works: list[_GraphWork],
    top_consumable: Mapping[str, _Consumable],
    lowered: tuple[NamedLoweredModule, ...],
) -> Program:
    """Phase 4: the parent program with delegate calls in place of its partitions."""
    by_path = {work.path: work for work in works}
    new_graph, signature = _assemble(program, program.graph, (), by_path, top_consumable)
    kept_targets = {
        s.target for s in signature.inputs if isinstance(s, (ParameterInput, BufferInput, ConstantTensorInput))
    }
    return msgspec.structs.replace(
        program,
        graph=new_graph,
        signature=signature,
        state=tuple(e for e in program.state if e.target in kept_targets),
        lowered_modules=lowered,
        backend_meta=_kept_notes(program, new_graph),
    )


def _kept_notes(program: Program, graph: Graph) -> tuple[BackendNodeMeta, ...]:
    if not program.backend_meta:
        return ()
    names = {n.name for n in graph.nodes}
    return tuple(m for m in program.backend_meta if m.node in names)


def _summaries(
    works: list[_GraphWork], lowered: tuple[NamedLoweredModule, ...], stats: Mapping[str, tuple[bool, float]]
) -> tuple[DelegateReport, ...]:
    modules = {m.name: m.module for m in lowered}
    summaries = []
    for work in works:
        for part in work.parts:
            assert part.sub_program is not None  # built in phase 2
            module = modules[part.module_name]
            hit, seconds = stats.get(part.module_name, (False, 0.0))
            nodes = [n for n in part.members if not isinstance(n, Placeholder)]
            summaries.append(
                DelegateReport(
                    tag=part.tag,
                    backend=part.spec.backend_id,
                    module=part.module_name,
                    graph="/".join(work.path),
                    nodes=tuple(n.name for n in nodes),
                    targets=tuple(n.target if isinstance(n, CallFunction) else "" for n in nodes),
                    inputs=tuple(part.user_inputs),
                    outputs=tuple(part.user_outputs) + tuple(n for n, _ in part.consumed_mutations),
                    consumed=tuple(
                        s.target
                        for s in part.sub_program.signature.inputs
                        if isinstance(s, (ParameterInput, BufferInput, ConstantTensorInput))
                    ),
                    blob_bytes=len(module.processed_bytes),
                    named_data=len(module.named_data),
                    named_data_bytes=sum(e.nbytes for e in module.named_data),
                    cache_hit=hit,
                    seconds=seconds,
                )
            )
    return tuple(summaries)


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
        args=(Ref(name=part.module_name), *(rename_arg(Ref(name=n), renames) for n in part.user_inputs)),
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

    tag_of = work.checked.tag_of
    part_of = {p.tag: p for p in work.parts}
    renames: dict[str, str] = {}
    for part in work.parts:
        renames.update(zip(part.user_outputs, part.getitem_names))

    # Groups (each partition by tag, every other node by name) and the contracted graph between
    # them come from validation: emit each group once all the groups it reads are out.
    node_group = work.checked.group_of
    pending = dict(work.checked.indegree)
    dependents = work.checked.succs

    dropped: set[str] = set()
    for node in graph.nodes:
        if isinstance(node, Placeholder) and node.name in tag_of:
            if all(u in tag_of for u in work.checked.users[node.name]):
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
                emitted.append((rename_node(node, renames, rename_self=False), meta, prov))

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
    assert isinstance(out_node, Output)
    if work.final is not None:
        calls = {p.tag: _emit_partition(p, renames, work.entry_of) for p in work.parts}
        emitted.extend(entries_in_final_order(work, calls, renames, dropped, out_node.name))
    else:
        for index, node in enumerate(graph.nodes[:-1]):
            g = node_group[node.name]
            if g in part_of:
                if index != part_of[g].last_index:
                    continue
            else:
                node_by_group[g] = node
            reached.add(g)
            release(g)
        if len(done) != len(reached):  # pragma: no cover - validate_plan rules this out
            raise PartitionerError("internal error: partitions could not be ordered; please report")

    drop_positions = {pos for part in work.parts for _, pos in part.consumed_mutations}
    new_out = rename_node(out_node, renames, rename_self=False)
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
        rename_output_spec(spec, renames) for i, spec in enumerate(signature.outputs) if i not in drop_positions
    )
    return new_graph, msgspec.structs.replace(signature, inputs=inputs, outputs=outputs)
