"""Lowered modules of a program: listing its delegate calls, and the single-delegate wrapper program."""

from __future__ import annotations

from texir.errors import LoweringError
from texir.ir import (
    CallFunction,
    DelegateMeta,
    GetAttr,
    GraphBuilder,
    GraphSignature,
    IntArg,
    LoweredBackendModule,
    ModuleCallEntry,
    ModuleCallSignature,
    NamedLoweredModule,
    Output,
    Placeholder,
    Program,
    Ref,
    TupleMeta,
    UserInput,
    UserOutput,
    ValueMeta,
    value_metas,
)
from texir.ir.names import CALL_DELEGATE, GETITEM, NameAllocator

__all__ = ["delegate_wrapper_program", "get_lowered_submodules"]


def get_lowered_submodules(program: Program) -> tuple[tuple[str, LoweredBackendModule, CallFunction], ...]:
    """``(lowered module name, module, call node)`` for each delegate call of the top-level graph,
    in graph order (ExecuTorch's ``get_lowered_submodules``)."""
    modules = {entry.name: entry.module for entry in program.lowered_modules}
    graph = program.graph
    targets = {
        n.name: n.target for n in graph.nodes if isinstance(n, GetAttr) and isinstance(graph.meta(n), DelegateMeta)
    }
    result: list[tuple[str, LoweredBackendModule, CallFunction]] = []
    for node in graph.nodes:
        if not isinstance(node, CallFunction) or node.target != CALL_DELEGATE:
            continue
        first = node.args[0] if node.args else None
        target = targets.get(first.name) if isinstance(first, Ref) else None
        if target is None or target not in modules:
            raise LoweringError(
                f"delegate call '{node.name}' does not name a lowered module of the program as its first "
                "argument; its first argument must be a get_attr of Program.lowered_modules"
            )
        result.append((target, modules[target], node))
    return tuple(result)


def delegate_wrapper_program(name: str, module: LoweredBackendModule) -> Program:
    """The program that only calls `module`: user inputs -> one delegate call -> one getitem per
    output of the delegated program -> outputs. Parameters, buffers and constants stay inside the
    delegate, so the state is empty (ExecuTorch's ``LoweredBackendModule.program()``)."""
    original = module.original_program
    # The user-input placeholders, with their metadata and provenance.
    inputs = [
        entry
        for entry, spec in zip(
            (e for e in original.graph.entries() if isinstance(e[0], Placeholder)), original.signature.inputs
        )
        if isinstance(spec, UserInput)
    ]
    out = original.graph.nodes[-1]
    if not isinstance(out, Output):
        raise LoweringError(f"lowered module '{name}': its program has no trailing Output node")
    metas = value_metas(original.graph)
    items: list[ValueMeta] = []
    for arg in out.args:
        meta = metas.get(arg.name) if isinstance(arg, Ref) else None
        if meta is None:
            raise LoweringError(
                f"lowered module '{name}': output {arg!r} has no value metadata; delegate outputs need it"
            )
        items.append(meta)
    input_names = [node.name for node, _, _ in inputs]
    names = NameAllocator({*input_names, name})
    call_name = names.fresh("executorch_call_delegate")
    builder = GraphBuilder()
    builder.extend(inputs)
    builder.add(GetAttr(name=name, target=name), DelegateMeta(module=name))
    builder.add(
        CallFunction(
            name=call_name, target=CALL_DELEGATE, args=(Ref(name=name), *(Ref(name=n) for n in input_names))
        ),
        TupleMeta(items=tuple(items)),
    )
    getitems = [names.fresh("getitem") for _ in items]
    for i, g in enumerate(getitems):
        builder.add(CallFunction(name=g, target=GETITEM, args=(Ref(name=call_name), IntArg(value=i))), items[i])
    builder.add(Output(name="output", args=tuple(Ref(name=g) for g in getitems)))
    return Program(
        graph=builder.build(),
        signature=GraphSignature(
            inputs=tuple(UserInput(arg=Ref(name=n)) for n in input_names),
            outputs=tuple(UserOutput(arg=Ref(name=g)) for g in getitems),
        ),
        range_constraints=original.range_constraints,
        module_call_graph=original.module_call_graph,
        lowered_modules=(NamedLoweredModule(name=name, module=module),),
        dialect=original.dialect,
    )


def _spec_tree(children: int, kind: str) -> str:
    leaf = '{"type": null, "context": null, "children_spec": []}'
    return f'{{"type": "builtins.{kind}", "context": "null", "children_spec": [{", ".join([leaf] * children)}]}}'


def sub_program_call_graph(n_inputs: int, n_outputs: int) -> tuple[ModuleCallEntry, ...]:
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
