"""One partition's sub-program, as `texir.lowering.delegate` builds it before its backend runs."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from texir.ir import (
    BufferInput,
    BufferMutation,
    ConstantTensorInput,
    GetAttr,
    GraphBuilder,
    InputSpec,
    Node,
    Output,
    OutputSpec,
    ParameterInput,
    Placeholder,
    Program,
    Ref,
    StateEntry,
    UserInput,
    UserOutput,
)
from texir.ir.analysis import node_inputs
from texir.ir.op_facts import schemas_used_by
from texir.lowering._parts import Consumable, GraphWork, Part
from texir.lowering.lowered_modules import sub_program_call_graph

__all__ = ["build_sub_program"]


def build_sub_program(
    program: Program,
    work: GraphWork,
    part: Part,
    consumable: Mapping[str, Consumable],
    state_by_target: Mapping[str, StateEntry],
) -> None:
    """`part`'s sub-program (set on `part`, with its user inputs, user outputs and the buffer
    mutations it consumes): placeholders ordered parameters, buffers, constants, user inputs;
    outputs ordered consumed buffer mutations, then user outputs."""
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
    positions = work.checked.output_positions
    consumed_targets = {consumable[p.name].target for p in consumed[BufferInput]}
    mutation_target: dict[int, str] = {}
    if not work.path:
        for target in consumed_targets:
            for pos in work.checked.mutation_positions.get(target, ()):
                mutation_target[pos] = target

    mutations: list[tuple[str, str]] = []
    for node in body:
        outside_users = [u for u in work.checked.users[node.name] if u not in member_names]
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
        module_call_graph=sub_program_call_graph(len(part.user_inputs), len(part.user_outputs)),
        dialect=program.dialect,
        backend_meta=tuple(m for n in part.members for m in work.backend_meta.get(n.name, ())),
        op_schemas=schemas_used_by(sub_graph, program.op_schemas),
    )
