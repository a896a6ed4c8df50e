"""Copy each mutated buffer's or user input's new value back into it before the output (exir's
insert_write_back_for_buffers_pass)."""

from __future__ import annotations

import msgspec

from texir.edge._rewrite import EdgeError, all_names
from texir.ir.builder import GraphBuilder
from texir.ir.types import (
    BufferInput,
    BufferMutation,
    CallFunction,
    Output,
    Placeholder,
    Program,
    Ref,
    UserInput,
    UserInputMutation,
)

__all__ = ["WRITE_BACK_TARGET", "insert_write_back"]

WRITE_BACK_TARGET = "aten::copy_.default"


def insert_write_back(program: Program) -> Program:
    """`program` with an in-place `copy_(state, new_value)` per mutated buffer or user input, just
    before the output node, in output order. The mutation outputs stay in the signature: the emitter
    keeps mutated buffers planned for the whole method and returns a mutated user input (its new
    value) where the signature lists it, as ExecuTorch does."""
    graph = program.graph
    outputs = program.signature.outputs
    output = graph.nodes[-1]
    if not isinstance(output, Output):
        raise EdgeError("the graph does not end with an Output node; run texir.ir.verify(program)")
    mutations = [
        (spec, arg) for spec, arg in zip(outputs, output.args) if isinstance(spec, (BufferMutation, UserInputMutation))
    ]
    if not mutations:
        return program
    placeholders = [n for n in graph.nodes if isinstance(n, Placeholder)]
    placeholder_of: dict[tuple[str, str], str] = {}
    for ph, in_spec in zip(placeholders, program.signature.inputs):
        if isinstance(in_spec, BufferInput):
            placeholder_of["buffer", in_spec.target] = ph.name
        elif isinstance(in_spec, UserInput):
            placeholder_of["user input", ph.name] = ph.name
    # Idempotent: a write-back that is already there is not added twice.
    present = {
        (n.args[0].name, n.args[1].name)
        for n in graph.nodes
        if isinstance(n, CallFunction) and n.target == WRITE_BACK_TARGET and len(n.args) == 2
        and isinstance(n.args[0], Ref) and isinstance(n.args[1], Ref)
    }
    def kind(spec: BufferMutation | UserInputMutation) -> str:
        return "buffer" if isinstance(spec, BufferMutation) else "user input"

    mutations = [
        (m, a) for m, a in mutations
        if not (isinstance(a, Ref) and (placeholder_of.get((kind(m), m.target)), a.name) in present)
    ]
    if not mutations:
        return program
    names = all_names(program)
    builder = GraphBuilder()
    entries = graph.entries()
    builder.extend(entries[:-1])
    meta_of = {node.name: meta for node, meta, _ in entries}
    for mutation, arg in mutations:
        what = kind(mutation)
        if not isinstance(arg, Ref):
            raise EdgeError(f"{what} mutation of {mutation.target!r} is not a value reference")
        buffer = placeholder_of.get((what, mutation.target))
        if buffer is None:
            raise EdgeError(
                f"mutated {what} {mutation.target!r} has no placeholder; the signature must list it as a {what} input"
            )
        copy = CallFunction(name=names.fresh("copy_"), target=WRITE_BACK_TARGET, args=(Ref(name=buffer), arg))
        builder.add(copy, meta_of[buffer], entries[-1][2])
    builder.add(*entries[-1])
    return msgspec.structs.replace(program, graph=builder.build(graph.subgraphs))
