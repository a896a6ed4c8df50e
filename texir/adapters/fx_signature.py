"""torch.export's graph signature -> texir's `InputSpec`/`OutputSpec`, one spec at a time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.fx
from torch.export import ExportedProgram
from torch.export import graph_signature as gs

from texir.errors import ConversionError, UnsupportedError
from texir.ir import types as ir
from texir.ir.literals import literal_arg

__all__ = [
    "SignatureMismatchError", "argument_spec", "input_spec", "literal_arg_at", "output_spec", "placeholder_renames",
    "output_items", "signature_inputs", "signature_outputs",
]


class SignatureMismatchError(ConversionError):
    """An ExportedProgram's graph signature does not describe its graph: its input specs and
    placeholders (or output specs and outputs) differ in number, or a spec's name belongs to
    another node of the graph."""


def signature_inputs(ep: ExportedProgram) -> tuple[tuple[gs.InputSpec, torch.fx.Node], ...]:
    """Each input spec of `ep` with the placeholder it describes. The pairing is by position, as
    torch's ExportedProgram defines it: the names agree in what torch.export returns, but not once
    FX has rebuilt the graph (`copy.deepcopy(ep)` renames a placeholder named like a Python builtin
    or keyword, `input` -> `input_1`, and leaves the signature as it was)."""
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    specs = ep.graph_signature.input_specs
    _check_count(f"has {len(placeholders)} placeholders ({_names(placeholders)})", len(placeholders), specs, "input")
    return tuple(zip(specs, placeholders))


def signature_outputs(ep: ExportedProgram) -> tuple[tuple[gs.OutputSpec, Any], ...]:
    """Each output spec of `ep` with the value the output node returns there (a node or a
    constant), by position as `signature_inputs`."""
    (output,) = (n for n in ep.graph.nodes if n.op == "output")
    (results,) = output.args
    items = output_items(results)
    specs = ep.graph_signature.output_specs
    _check_count(f"returns {len(items)} values", len(items), specs, "output")
    return tuple(zip(specs, items))


def output_items(results: Any) -> tuple[Any, ...]:
    """An output node's argument as the values it returns, one each."""
    return tuple(results) if isinstance(results, (tuple, list)) else (results,)


def placeholder_renames(ep: ExportedProgram) -> dict[torch.fx.Node, str]:
    """The placeholders of `ep` whose name is not their input spec's, each with the spec's name:
    the user's name, which torch's own retrace gives the placeholder back. A spec's name that
    another node of the graph has is a `SignatureMismatchError`."""
    renames = {
        node: spec.arg.name for spec, node in signature_inputs(ep)
        if not isinstance(spec.arg, gs.ConstantArgument) and isinstance(getattr(spec.arg, "name", None), str)
        and spec.arg.name != node.name
    }
    if renames:
        taken = {n.name: n for n in ep.graph.nodes if n not in renames}
        for node, name in renames.items():
            other = taken.get(name)
            if other is not None:
                raise SignatureMismatchError(
                    f"placeholder {node.name!r} is the graph signature's input {name!r}, but node {name!r} "
                    f"({other.op} {other.target}) already has that name; export the model again with "
                    "torch.export.export"
                )
    return renames


def _check_count(graph_has: str, count: int, specs: Sequence[Any], side: str) -> None:
    if count != len(specs):
        raise SignatureMismatchError(
            f"the graph {graph_has} but its graph signature has {len(specs)} {side} specs "
            f"({_names(s.arg for s in specs)}); export the model again with torch.export.export, or keep "
            f"the graph and the signature's {side}_specs of an edited program in step"
        )


def _names(items: Any) -> str:
    shown = [getattr(i, "name", repr(i)) for i in items]
    return ", ".join(shown[:8]) + (", ..." if len(shown) > 8 else "")


def argument_spec(spec: Any, where: str) -> ir.Argument:
    if isinstance(spec, gs.ConstantArgument):
        return literal_arg_at(spec.value, where)
    name = getattr(spec, "name", None)
    if not isinstance(name, str):
        raise UnsupportedError(f"{where}: argument spec {spec!r} is not supported")
    return ir.Ref(name=name)


def literal_arg_at(value: Any, where: str) -> ir.Argument:
    try:
        return literal_arg(value)
    except TypeError:
        raise UnsupportedError(
            f"{where}: constant {value!r} of type {type(value).__name__} is not supported"
        ) from None


def input_spec(spec: gs.InputSpec) -> ir.InputSpec:
    kind = spec.kind
    name = getattr(spec.arg, "name", "")
    where = f"signature input {name!r}"
    if kind is gs.InputKind.USER_INPUT:
        return ir.UserInput(arg=argument_spec(spec.arg, where))
    if kind is gs.InputKind.TOKEN:
        return ir.TokenInput(name=name)
    target = spec.target
    if target is None:
        raise ConversionError(f"{where}: {kind.name} input without a target")
    if kind is gs.InputKind.PARAMETER:
        return ir.ParameterInput(name=name, target=target)
    if kind is gs.InputKind.BUFFER:
        return ir.BufferInput(name=name, target=target, persistent=bool(spec.persistent))
    if kind is gs.InputKind.CONSTANT_TENSOR:
        return ir.ConstantTensorInput(name=name, target=target)
    if kind is gs.InputKind.CUSTOM_OBJ:
        return ir.CustomObjInput(name=name, target=target)
    raise UnsupportedError(f"{where}: input kind {kind.name} is not supported")


def output_spec(spec: gs.OutputSpec, value: str | None = None) -> ir.OutputSpec:
    """`spec` in the IR; `value`, when given, is the IR name of the node the graph returns in its
    place, which the spec then names (the two agree unless FX renamed the node: `signature_inputs`)."""
    kind = spec.kind
    name = getattr(spec.arg, "name", "")
    where = f"signature output {name!r}"
    if value is not None and value != name:
        name = value
        if kind is gs.OutputKind.USER_OUTPUT:
            return ir.UserOutput(arg=ir.Ref(name=value))
    if kind is gs.OutputKind.USER_OUTPUT:
        return ir.UserOutput(arg=argument_spec(spec.arg, where))
    if kind is gs.OutputKind.LOSS_OUTPUT:
        return ir.LossOutput(name=name)
    if kind is gs.OutputKind.TOKEN:
        return ir.TokenOutput(name=name)
    target = spec.target
    if target is None:
        raise ConversionError(f"{where}: {kind.name} output without a target")
    if kind is gs.OutputKind.BUFFER_MUTATION:
        return ir.BufferMutation(name=name, target=target)
    if kind is gs.OutputKind.USER_INPUT_MUTATION:
        return ir.UserInputMutation(name=name, target=target)
    if kind is gs.OutputKind.GRADIENT_TO_PARAMETER:
        return ir.GradientToParameter(name=name, target=target)
    if kind is gs.OutputKind.GRADIENT_TO_USER_INPUT:
        return ir.GradientToUserInput(name=name, target=target)
    raise UnsupportedError(
        f"{where}: output kind {kind.name} is not supported; run ep.run_decompositions() to "
        "functionalize the program first"
    )
