"""FX call targets and their canonical strings (`aten::add.Tensor`, `_operator::getitem`, ...), both ways."""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.fx
from torch._ops import HigherOrderOperator, OpOverload

from texir.adapters import delegate_op
from texir.adapters.foreign import foreign_target
from texir.errors import UnsupportedError
from texir.ir.names import CALL_DELEGATE

__all__ = ["canonical_target", "dispatch_form", "resolve_target"]

# --------------------------------------------------------------------------------------------------
# Call targets: canonical spellings, both ways


def _builtin_table() -> dict[Any, str]:
    table: dict[Any, str] = {}
    for name in (
        "getitem", "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "abs",
        "eq", "ne", "lt", "le", "gt", "ge", "and_", "or_", "xor", "not_", "invert", "lshift",
        "rshift", "matmul",
    ):
        table[getattr(operator, name)] = f"_operator::{name}"
    for name in ("ceil", "floor", "trunc", "sqrt", "exp", "log", "sin", "cos", "tan"):
        table[getattr(math, name)] = f"math::{name}"
    for name in dir(torch):
        if name.startswith(("sym_", "_sym_")) and callable(getattr(torch, name)):
            table[getattr(torch, name)] = f"torch::{name}"
    for name in ("_check", "_check_is_size"):
        table[getattr(torch, name)] = f"torch::{name}"
    table[round] = "builtins::round"
    return table


_BUILTIN_TO_NAME: dict[Any, str] = _builtin_table()
_NAME_TO_BUILTIN: dict[str, Any] = {v: k for k, v in _BUILTIN_TO_NAME.items()}
_TARGET_NAME_CACHE: dict[Any, str] = {}
_TARGET_CACHE: dict[str, Any] = {}


def canonical_target(target: Any) -> str | None:
    """The canonical string of an FX call target, or None when texir cannot name it."""
    try:
        return _TARGET_NAME_CACHE[target]
    except (KeyError, TypeError):
        pass
    name: str | None
    if isinstance(target, OpOverload):
        name = f"{target._schema.name}.{target._overloadname}"
    elif target is delegate_op.texir_call_delegate:
        name = CALL_DELEGATE
    else:
        # Another stack's operators (ExecuTorch's edge ops and delegate call), taught by a layer above.
        name = foreign_target(target)
        if name is None and isinstance(target, HigherOrderOperator):
            # Not cached: a namer registered later may claim it (ExecuTorch's delegate call).
            return f"higher_order::{target.name()}"  # type: ignore[no-untyped-call]  # unannotated in torch
        if name is None:
            name = _BUILTIN_TO_NAME.get(target)
    if name is not None:
        _TARGET_NAME_CACHE[target] = name
    return name


def resolve_target(name: str) -> Any:
    """The FX call target for a canonical string (OpOverload, HigherOrderOperator or builtin)."""
    target = _TARGET_CACHE.get(name)
    if target is not None:
        return target
    target = _NAME_TO_BUILTIN.get(name)
    if target is None:
        if name == CALL_DELEGATE:
            target = delegate_op.texir_call_delegate
        else:
            namespace, sep, rest = name.partition("::")
            if not sep or not rest:
                raise UnsupportedError(
                    f"op {name!r} is not a canonical target; spell it 'namespace::op.overload'"
                )
            try:
                if namespace == "higher_order":
                    target = getattr(torch.ops.higher_order, rest)
                else:
                    opname, _, overload = rest.partition(".")
                    target = getattr(getattr(getattr(torch.ops, namespace), opname), overload or "default")
            except (AttributeError, RuntimeError) as exc:
                raise UnsupportedError(
                    f"op {name!r} is unknown to this torch build; import the library that "
                    "registers it before converting"
                ) from exc
    _TARGET_CACHE[name] = target
    return target


def dispatch_form(func: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """`args`, `kwargs` as the dispatcher hands them to the retrace: parameters that are not
    keyword-only passed positionally (export writes some nodes, `_assert_tensor_metadata`, with
    keywords), defaults in between filled in and trailing defaults left out."""
    params = [a for a in func._schema.arguments if not a.kwarg_only]
    named = [a for a in params[len(args):] if a.name in kwargs]
    if not named:
        return args, kwargs
    out, rest = list(args), dict(kwargs)
    for param in params[len(args):]:
        if param.name in rest:
            out.append(rest.pop(param.name))
        elif param.has_default_value():
            out.append(param.default_value)
        else:  # pragma: no cover - a call without a required parameter does not trace
            raise ValueError(f"{func}: parameter {param.name!r} missing")
    while len(out) > len(args) and _is_default(params[len(out) - 1], out[-1]):
        out.pop()
    return tuple(out), rest


def _is_default(param: Any, value: Any) -> bool:
    if not param.has_default_value() or isinstance(value, torch.Tensor):
        return False
    default = param.default_value
    return value is default or (type(value) is type(default) and bool(value == default))
