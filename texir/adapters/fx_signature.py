"""torch.export's graph signature -> texir's `InputSpec`/`OutputSpec`, one spec at a time."""

from __future__ import annotations

from typing import Any

from torch.export import graph_signature as gs

from texir.errors import ConversionError, UnsupportedError
from texir.ir import types as ir
from texir.ir.literals import literal_arg

__all__ = ["argument_spec", "input_spec", "literal_arg_at", "output_spec"]


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


def output_spec(spec: gs.OutputSpec) -> ir.OutputSpec:
    kind = spec.kind
    name = getattr(spec.arg, "name", "")
    where = f"signature output {name!r}"
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
