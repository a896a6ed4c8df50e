"""`verify(program)`: the IR's invariants, checked at every pass boundary."""

from __future__ import annotations

from texir.errors import IRError
from texir.ir.analysis import iter_refs, node_args, output_node
from texir.ir.types import (
    BufferInput,
    BufferMutation,
    CallFunction,
    ConstantTensorInput,
    GetAttr,
    Graph,
    InputSpec,
    Output,
    OutputSpec,
    ParameterInput,
    Placeholder,
    Program,
    Ref,
    UserInput,
    UserInputMutation,
    UserOutput,
)


def _input_name(spec: InputSpec) -> str | None:
    if isinstance(spec, UserInput):
        return spec.arg.name if isinstance(spec.arg, Ref) else None
    return spec.name


def _output_name(spec: OutputSpec) -> str | None:
    if isinstance(spec, UserOutput):
        return spec.arg.name if isinstance(spec.arg, Ref) else None
    return spec.name


def verify_graph(graph: Graph, *, where: str = "graph", lowered: frozenset[str] = frozenset()) -> None:
    """Check one graph and its nested graphs: unique names, defs before uses, one trailing output,
    get_attr targets that resolve."""
    if not graph.nodes or not isinstance(graph.nodes[-1], Output):
        raise IRError(f"{where}: the last node must be the Output node; append one Output(args=...)")
    sub_names = [s.name for s in graph.subgraphs]
    if len(set(sub_names)) != len(sub_names):
        raise IRError(f"{where}: duplicate subgraph names {sorted(sub_names)}; give each a unique name")
    subs = set(sub_names)
    defined: set[str] = set()
    seen_non_placeholder = False
    for index, node in enumerate(graph.nodes):
        if node.name in defined:
            raise IRError(f"{where}: node name '{node.name}' is defined twice (node #{index}); rename one")
        if isinstance(node, Output) and index != len(graph.nodes) - 1:
            raise IRError(f"{where}: Output node '{node.name}' at #{index} is not last; only one Output, at the end")
        if isinstance(node, Placeholder):
            if seen_non_placeholder:
                raise IRError(f"{where}: placeholder '{node.name}' follows other nodes; move placeholders first")
        else:
            seen_non_placeholder = True
        for arg in node_args(node):
            for ref in iter_refs(arg):
                if ref not in defined:
                    raise IRError(
                        f"{where}: node '{node.name}' uses '{ref}' before it is defined; "
                        "order nodes topologically or define the value"
                    )
        if isinstance(node, CallFunction) and "::" not in node.target:
            raise IRError(
                f"{where}: node '{node.name}' has target '{node.target}'; "
                "targets are canonical 'namespace::op.overload' strings"
            )
        if isinstance(node, GetAttr) and node.target not in subs and node.target not in lowered:
            raise IRError(
                f"{where}: get_attr '{node.name}' names '{node.target}', which is neither a subgraph "
                "nor a lowered module of the program"
            )
        defined.add(node.name)
    for sub in graph.subgraphs:
        verify_graph(sub.graph, where=f"{where}.{sub.name}", lowered=lowered)


def verify(program: Program) -> None:
    """Raise `IRError` naming the first broken invariant of `program` (and of its lowered modules)."""
    lowered_names = [m.name for m in program.lowered_modules]
    if len(set(lowered_names)) != len(lowered_names):
        raise IRError(f"program: duplicate lowered module names {sorted(lowered_names)}")
    verify_graph(program.graph, lowered=frozenset(lowered_names))

    placeholders = [n for n in program.graph.nodes if isinstance(n, Placeholder)]
    sig_in = program.signature.inputs
    if len(placeholders) != len(sig_in):
        raise IRError(
            f"signature: {len(sig_in)} input specs for {len(placeholders)} placeholders; "
            "give one InputSpec per placeholder, in order"
        )
    state_targets = {e.target for e in program.state}
    for i, (ph, spec) in enumerate(zip(placeholders, sig_in)):
        name = _input_name(spec)
        if name is not None and name != ph.name:
            raise IRError(f"signature.inputs[{i}] names '{name}' but placeholder #{i} is '{ph.name}'")
        if isinstance(spec, (ParameterInput, BufferInput, ConstantTensorInput)) and spec.target not in state_targets:
            raise IRError(
                f"signature.inputs[{i}] ({type(spec).__name__} '{spec.name}') has target '{spec.target}' "
                "missing from program.state; add its TensorData"
            )

    out = output_node(program.graph)
    if len(out.args) != len(program.signature.outputs):
        raise IRError(
            f"signature: {len(program.signature.outputs)} output specs for {len(out.args)} output "
            "values; give one OutputSpec per output argument, in order"
        )
    input_targets = {
        s.target for s in sig_in if isinstance(s, (ParameterInput, BufferInput))
    }
    user_input_names = {_input_name(s) for s in sig_in if isinstance(s, UserInput)}
    for i, (arg, ospec) in enumerate(zip(out.args, program.signature.outputs)):
        name = _output_name(ospec)
        if name is not None and not (isinstance(arg, Ref) and arg.name == name):
            raise IRError(f"signature.outputs[{i}] names '{name}' but output argument #{i} is {arg!r}")
        if isinstance(ospec, BufferMutation) and ospec.target not in input_targets:
            raise IRError(
                f"signature.outputs[{i}] mutates buffer '{ospec.target}', which is not a buffer input"
            )
        if isinstance(ospec, UserInputMutation) and ospec.target not in user_input_names:
            raise IRError(
                f"signature.outputs[{i}] mutates user input '{ospec.target}', which is not a user input"
            )

    for i, rc in enumerate(program.range_constraints):
        hi = "inf" if rc.max is None else str(rc.max)
        if rc.max is not None and rc.max < rc.min:
            raise IRError(f"range_constraints[{i}] ('{rc.symbol}'): empty range [{rc.min}, {hi}]; set max >= min")
        if rc.hint is not None and not (rc.min <= rc.hint and (rc.max is None or rc.hint <= rc.max)):
            raise IRError(
                f"range_constraints[{i}] ('{rc.symbol}'): hint {rc.hint} is outside [{rc.min}, {hi}]; "
                "give a hint inside the range, or none"
            )

    for entry in program.lowered_modules:
        try:
            verify(entry.module.original_program)
        except IRError as exc:
            raise IRError(f"lowered module '{entry.name}': {exc}") from exc
