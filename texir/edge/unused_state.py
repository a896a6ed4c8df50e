"""Drop parameters, buffers and lifted constants the graph never reads (the clean-up exir does after delegation)."""

from __future__ import annotations

import msgspec

from texir.ir.analysis import node_inputs
from texir.ir.builder import GraphBuilder
from texir.ir.types import (
    BufferInput,
    BufferMutation,
    ConstantTensorInput,
    ParameterInput,
    Placeholder,
    Program,
)

__all__ = ["remove_unused_state"]

_STATE_SPECS = (ParameterInput, BufferInput, ConstantTensorInput)


StateKind = type[ParameterInput] | type[BufferInput] | type[ConstantTensorInput]


def remove_unused_state(program: Program, *, kinds: tuple[StateKind, ...] = _STATE_SPECS) -> Program:
    """`program` without the placeholders, signature inputs and state entries of parameters,
    buffers and constants (those of `kinds`) that no node reads (a mutated buffer counts as read).
    Pure. exir's ``to_edge`` drops unused parameters only; its emitter keeps the rest."""
    graph = program.graph
    read: set[str] = set()
    for node in graph.nodes:
        read.update(node_inputs(node))
    mutated = {s.target for s in program.signature.outputs if isinstance(s, BufferMutation)}
    placeholders = [n for n in graph.nodes if isinstance(n, Placeholder)]
    dropped: set[str] = set()
    for node, spec in zip(placeholders, program.signature.inputs):
        if isinstance(spec, kinds) and node.name not in read and spec.target not in mutated:
            dropped.add(node.name)
    if not dropped:
        return program
    builder = GraphBuilder()
    builder.extend(e for e in graph.entries() if e[0].name not in dropped)
    inputs = tuple(
        spec for node, spec in zip(placeholders, program.signature.inputs) if node.name not in dropped
    )
    kept_targets = {spec.target for spec in inputs if isinstance(spec, _STATE_SPECS)}
    return msgspec.structs.replace(
        program,
        graph=builder.build(graph.subgraphs),
        signature=msgspec.structs.replace(program.signature, inputs=inputs),
        state=tuple(entry for entry in program.state if entry.target in kept_targets),
    )
