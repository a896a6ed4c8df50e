"""Python scalars in Tensor positions become lifted 0-dim constants (exir's ScalarToTensorPass, then lift_constant_tensor_pass)."""

from __future__ import annotations

import hashlib
import struct

import msgspec

from texir.ir.blob import Blob
from texir.ir.builder import GraphBuilder
from texir.ir.op_facts import op_table
from texir.ir.types import (
    Argument,
    BoolArg,
    BufferInput,
    CallFunction,
    DType,
    FloatArg,
    IntArg,
    Placeholder,
    Program,
    Ref,
    StateEntry,
    TensorData,
    TensorMeta,
    UserInput,
)

__all__ = ["LIFTED_PREFIX", "lift_scalar_operands"]

LIFTED_PREFIX = "_lifted_tensor_constant"


def _tensor_of(arg: Argument) -> tuple[DType, bytes] | None:
    # As torch.tensor(value): bool -> bool, int -> int64, float -> float32 (the default dtype).
    if isinstance(arg, BoolArg):
        return DType.bool, struct.pack("<?", arg.value)
    if isinstance(arg, IntArg):
        return DType.int64, struct.pack("<q", arg.value)
    if isinstance(arg, FloatArg):
        return DType.float32, struct.pack("<f", float(arg.value))
    return None


def lift_scalar_operands(program: Program) -> Program:
    """`program` with each bool/int/float literal that its op's schema types as a Tensor replaced by
    a new placeholder (`_lifted_tensor_constant<i>`, one per use, before the user inputs): a
    persistent buffer, numbered on from the program's buffers, as ExecuTorch's
    lift_constant_tensor_pass makes it (ExecuTorch's tools count on the kind: its
    `LoweredBackendModule.program()` drops only parameter and buffer placeholders). The top-level graph only: nested graphs keep their
    literals for the emitter. Pure."""
    graph = program.graph
    ops = op_table(program.op_schemas)
    used = {n.name for n in graph.nodes} | {e.target for e in program.state}
    counter = sum(isinstance(s, BufferInput) for s in program.signature.inputs)
    lifted: list[tuple[Placeholder, TensorMeta, StateEntry]] = []
    body: dict[str, CallFunction] = {}

    def lift(arg: Argument) -> Argument:
        nonlocal counter
        found = _tensor_of(arg)
        if found is None:
            return arg
        while f"{LIFTED_PREFIX}{counter}" in used:
            counter += 1
        name = f"{LIFTED_PREFIX}{counter}"
        used.add(name)
        counter += 1
        dtype, data = found
        meta = TensorMeta(dtype=dtype, shape=(), strides=())
        value = TensorData(meta=meta, sha256=hashlib.sha256(data).hexdigest(), nbytes=len(data), data=Blob(data))
        lifted.append((Placeholder(name=name), meta, StateEntry(target=name, value=value)))
        return Ref(name=name)

    for node in graph.nodes:
        if not isinstance(node, CallFunction):
            continue
        facts = ops.op_facts(node.target)
        if facts is None:
            continue
        kinds = {a.name: a.kind for a in facts.schema.in_args}
        positional = [a for a in facts.schema.arguments if not a.kwarg_only]
        if not any(kinds.get(a.name) == "tensor" and _tensor_of(v) for a, v in zip(positional, node.args)) and not any(
            kinds.get(k) == "tensor" and _tensor_of(v) for k, v in node.kwargs
        ):
            continue
        args = tuple(lift(v) if kinds.get(a.name) == "tensor" else v for a, v in zip(positional, node.args))
        args += node.args[len(positional):]
        kwargs = tuple((k, lift(v) if kinds.get(k) == "tensor" else v) for k, v in node.kwargs)
        body[node.name] = msgspec.structs.replace(node, args=args, kwargs=kwargs)
    if not lifted:
        return program

    entries = list(graph.entries())
    specs = program.signature.inputs
    placeholders = [e for e in entries if isinstance(e[0], Placeholder)]
    first_user = next((i for i, s in enumerate(specs) if isinstance(s, UserInput)), len(specs))
    builder = GraphBuilder()
    builder.extend(placeholders[:first_user])
    for lifted_node, lifted_meta, _ in lifted:
        builder.add(lifted_node, lifted_meta)
    builder.extend(placeholders[first_user:])
    for node, meta, prov in entries[len(placeholders):]:
        builder.add(body.get(node.name, node), meta, prov)
    new_specs = (
        *specs[:first_user],
        *(BufferInput(name=n.name, target=n.name, persistent=True) for n, _, _ in lifted),
        *specs[first_user:],
    )
    return msgspec.structs.replace(
        program,
        graph=builder.build(graph.subgraphs),
        signature=msgspec.structs.replace(program.signature, inputs=new_specs),
        state=tuple(sorted((*program.state, *(s for _, _, s in lifted)), key=lambda e: e.target)),
    )
