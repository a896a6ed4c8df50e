"""Python scalars as IR literals: the one place that spells floats and builds literal Arguments."""

from __future__ import annotations

import math

from texir.ir.types import Argument, BoolArg, FloatArg, FloatValue, IntArg, NoneArg, StrArg

_NONE = NoneArg()


def float_value(value: float) -> FloatValue:
    """A Python float as the IR spells it: finite values as floats, the others as strings."""
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "nan"
    return "inf" if value > 0 else "-inf"


def literal_arg(value: object) -> Argument:
    """The literal Argument for None, bool, int, float or str (bool before int, as Python needs).
    Raises TypeError for anything else; callers turn that into their own typed error."""
    if value is None:
        return _NONE
    if isinstance(value, bool):
        return BoolArg(value=value)
    if isinstance(value, int):
        return IntArg(value=value)
    if isinstance(value, float):
        return FloatArg(value=float_value(value))
    if isinstance(value, str):
        return StrArg(value=value)
    raise TypeError(f"{type(value).__name__} is not an IR literal")
