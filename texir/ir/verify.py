"""`verify(program)`: the IR's invariants, checked at every pass boundary."""

from __future__ import annotations

import operator

from texir.errors import IRError
from texir.ir.analysis import iter_refs, node_args, output_node
from texir.ir.op_schema import OpSchemaError, parse_schema
from texir.ir.types import (
    BufferInput,
    BufferMutation,
    DIALECTS,
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
    unknown_dialect_message,
)


def _input_name(spec: InputSpec) -> str | None:
    if isinstance(spec, UserInput):
        return spec.arg.name if isinstance(spec.arg, Ref) else None
    return spec.name


def _output_name(spec: OutputSpec) -> str | None:
    if isinstance(spec, UserOutput):
        return spec.arg.name if isinstance(spec.arg, Ref) else None
    return spec.name


_meta_id = operator.attrgetter("meta_id")


def check_indices(graph: Graph, where: str = "graph") -> None:
    """Check that every table index of `graph` resolves: `meta_id`s, provenance column lengths and
    location indices. Cheap (no per-node Python code on well-formed input), so snapshot decoding
    runs it on every graph; `check_tables` (run by `verify`) checks the canonical order too."""
    nodes, metas = graph.nodes, graph.metas
    try:
        # Every node but the trailing Output has a meta_id; filter(None) drops None (and 0s,
        # which cannot be out of range), so max() runs without Python-level code.
        top = max(filter(None, map(_meta_id, nodes[:-1])), default=0)
        last = getattr(nodes[-1], "meta_id", None) if nodes else None
        if last is not None:
            top = max(top, last)
        ok = top < len(metas) or not nodes
    except AttributeError:  # an Output before the end; let check_tables name the bad node
        ok = False
    table = graph.provenance
    if table is not None:
        n = len(nodes)
        sizes = (len(table.debug_handle), len(table.ancestor), len(table.torch_fn_name), len(table.location))
        ok = ok and sizes == (n, n, n, n) and max(filter(None, table.location), default=0) < len(table.locations)
    if not ok:
        check_tables(graph, where)


def check_tables(graph: Graph, where: str = "graph") -> None:
    """Check `graph`'s tables: every `meta_id` and location index in range, metadata interned in
    order of first use with no unused entry (what `GraphBuilder` makes), provenance columns one
    entry per node. Snapshot decoding runs this on every graph it reads."""
    metas = graph.metas
    expected = 0
    for index, node in enumerate(graph.nodes):
        meta_id = getattr(node, "meta_id", None)
        if meta_id is None or meta_id < expected:
            continue
        if meta_id > expected or meta_id >= len(metas):
            problem = "is out of range" if meta_id >= len(metas) else "skips ahead of first use"
            raise IRError(
                f"{where}: node #{index} '{node.name}' has meta_id {meta_id}, which {problem} "
                f"({len(metas)} metas); build graphs with GraphBuilder, which interns in order"
            )
        expected += 1
    if expected != len(metas):
        raise IRError(
            f"{where}: metas holds {len(metas)} entries but nodes use {expected}; drop unused metadata "
            "(build graphs with GraphBuilder)"
        )
    table = graph.provenance
    if table is None:
        return
    n = len(graph.nodes)
    for column in ("debug_handle", "ancestor", "torch_fn_name", "location"):
        size = len(getattr(table, column))
        if size != n:
            raise IRError(
                f"{where}.provenance.{column}: {size} entries for {n} nodes; give one entry per node"
            )
    locations = table.locations
    for index, loc in enumerate(table.location):
        if loc is not None and loc >= len(locations):
            raise IRError(
                f"{where}.provenance.location[{index}] (node '{graph.nodes[index].name}'): "
                f"{loc} is out of range ({len(locations)} locations)"
            )
        name = table.torch_fn_name[index]
        if name is not None and (loc is None or locations[loc].torch_fn_type is None):
            raise IRError(
                f"{where}.provenance.torch_fn_name[{index}] (node '{graph.nodes[index].name}'): "
                "a torch_fn name needs a location with torch_fn_type"
            )


def verify_graph(graph: Graph, *, where: str = "graph", lowered: frozenset[str] = frozenset()) -> None:
    """Check one graph and its nested graphs: unique names, defs before uses, one trailing output,
    get_attr targets that resolve."""
    if not graph.nodes or not isinstance(graph.nodes[-1], Output):
        raise IRError(f"{where}: the last node must be the Output node; append one Output(args=...)")
    check_tables(graph, where)
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
    if program.dialect not in DIALECTS:  # msgspec checks the Literal on decode only, not for IR built in code
        raise IRError(unknown_dialect_message(program.dialect, "program.dialect"))
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

    if list(program.op_schemas) != sorted(set(program.op_schemas)):
        raise IRError("program.op_schemas: the schema strings must be sorted and unique; sort them")
    for i, text in enumerate(program.op_schemas):
        try:
            parse_schema(text)
        except OpSchemaError as exc:
            raise IRError(f"program.op_schemas[{i}]: {exc}; record torch's own str(op._schema)") from exc

    for entry in program.lowered_modules:
        try:
            verify(entry.module.original_program)
        except IRError as exc:
            raise IRError(f"lowered module '{entry.name}': {exc}") from exc
