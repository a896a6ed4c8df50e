"""Checks a bundled program's cases against the methods of its `.pte`, as the runtime will use them."""

from __future__ import annotations

import math

from texir.errors import PteError
from texir.serialize.bpte import schema as b
from texir.serialize.pte import schema as s
from texir.serialize.pte.codec import ELEMENT_SIZE, read_pte
from texir.serialize.pte.dtypes import SCALAR_TYPE_TO_DTYPE

__all__ = ["BundleCaseError", "check_cases", "describe_value", "dtype_name"]


class BundleCaseError(PteError):
    """A bundled case does not fit its method (input count, kind, dtype or shape), or names a
    method the program does not have."""


_KIND: dict[type, type] = {s.Tensor: b.Tensor, s.Int: b.Int, s.Bool: b.Bool, s.Double: b.Double}
"""The `.pte` EValue kind of a method input -> the bundled value kind that feeds it."""


def dtype_name(scalar_type: s.ScalarType) -> str:
    """torch's name of a ScalarType ('float32' for FLOAT)."""
    dtype = SCALAR_TYPE_TO_DTYPE.get(scalar_type)
    return dtype.value if dtype is not None else scalar_type.name.lower()


def describe_value(val: b.ValueUnion | s.KernelTypes) -> str:
    """'Tensor float32[2, 8]', 'Int 3': a value or a method's input as an error message names it."""
    if isinstance(val, b.Tensor | s.Tensor):
        return f"Tensor {dtype_name(val.scalar_type)}[{', '.join(str(d) for d in val.sizes)}]"
    for field in ("int_val", "bool_val", "double_val"):
        if hasattr(val, field):
            return f"{type(val).__name__} {getattr(val, field)!r}"
    return type(val).__name__


def _shape_error(given: b.Tensor, wanted: s.Tensor) -> str | None:
    """Why `given`'s sizes cannot be the method's tensor `wanted`, or None when they can."""
    if len(given.sizes) != len(wanted.sizes):
        return f"rank {len(given.sizes)}, the method's tensor has rank {len(wanted.sizes)}"
    if wanted.shape_dynamism == s.TensorShapeDynamism.STATIC:
        if tuple(given.sizes) != tuple(wanted.sizes):
            return "other sizes than the method's static shape"
    elif wanted.shape_dynamism == s.TensorShapeDynamism.DYNAMIC_BOUND:
        if any(g > w for g, w in zip(given.sizes, wanted.sizes)):
            return "a dimension above the method's upper bound"
    return None


def _check_value(v: b.Value, wanted: s.KernelTypes, what: str) -> None:
    val = v.val
    kind = _KIND.get(type(wanted))
    if kind is None:
        raise BundleCaseError(
            f"{what}: the method's value is {type(wanted).__name__}, which a bundled case cannot feed or "
            "check (bundled values are Tensor, Int, Bool or Double)"
        )
    if not isinstance(val, kind):
        raise BundleCaseError(f"{what}: given {describe_value(val)}, the method expects {describe_value(wanted)}")
    if isinstance(val, b.Tensor) and isinstance(wanted, s.Tensor):
        if val.scalar_type != wanted.scalar_type:
            raise BundleCaseError(
                f"{what}: given {describe_value(val)}, the method expects dtype {dtype_name(wanted.scalar_type)} "
                f"({describe_value(wanted)})"
            )
        why = _shape_error(val, wanted)
        if why is not None:
            raise BundleCaseError(f"{what}: given {describe_value(val)}, {why} ({describe_value(wanted)})")
        if any(d < 0 for d in val.sizes):
            raise BundleCaseError(f"{what}: negative size in {list(val.sizes)}")
        if tuple(val.dim_order) != tuple(wanted.dim_order):
            raise BundleCaseError(
                f"{what}: dim_order {list(val.dim_order)}, the method's tensor has dim_order "
                f"{list(wanted.dim_order)}; give its elements in that memory order"
            )
        nbytes = math.prod(val.sizes) * ELEMENT_SIZE[val.scalar_type]
        if val.data.nbytes != nbytes:
            raise BundleCaseError(
                f"{what}: {val.data.nbytes} data bytes for {describe_value(val)}, which needs {nbytes}"
            )


def _plan_value(plan: s.ExecutionPlan, index: int, what: str) -> s.KernelTypes:
    if not 0 <= index < len(plan.values):
        raise BundleCaseError(f"{what}: value index {index} is outside the method's {len(plan.values)} values")
    return plan.values[index].val


def check_cases(bundle: b.BundledProgram) -> None:
    """Raise `BundleCaseError` naming the method, case and input (or output) unless every suite
    names a method of the program, once, in name order, and every case gives that method's inputs
    (count, kind, dtype, shape within its bounds) and either no expected outputs or all of them."""
    try:
        program = read_pte(bundle.program.view()).program
    except PteError as exc:
        raise BundleCaseError(f"BundledProgram.program is not a readable .pte: {exc}") from exc
    plans = {plan.name: plan for plan in program.execution_plan}
    names = [suite.method_name for suite in bundle.method_test_suites]
    if names != sorted(set(names)):
        raise BundleCaseError(
            f"method_test_suites must hold one suite per method, sorted by name (as ExecuTorch writes them); "
            f"got {names}"
        )
    for suite in bundle.method_test_suites:
        plan = plans.get(suite.method_name)
        if plan is None:
            raise BundleCaseError(
                f"cases for method {suite.method_name!r}, which the program lacks; its methods: "
                f"{', '.join(sorted(plans)) or 'none'}"
            )
        for k, case in enumerate(suite.test_cases):
            where = f"method {suite.method_name!r} case {k}"
            if len(case.inputs) != len(plan.inputs):
                raise BundleCaseError(
                    f"{where}: {len(case.inputs)} inputs given, the method takes {len(plan.inputs)}"
                )
            for i, (v, index) in enumerate(zip(case.inputs, plan.inputs)):
                _check_value(v, _plan_value(plan, index, f"{where} input {i}"), f"{where} input {i}")
            if not case.expected_outputs:
                continue
            if len(case.expected_outputs) != len(plan.outputs):
                raise BundleCaseError(
                    f"{where}: {len(case.expected_outputs)} expected outputs given, the method returns "
                    f"{len(plan.outputs)} (give all or none)"
                )
            for i, (v, index) in enumerate(zip(case.expected_outputs, plan.outputs)):
                wanted = _plan_value(plan, index, f"{where} output {i}")
                if not isinstance(wanted, s.Tensor):
                    raise BundleCaseError(
                        f"{where} output {i}: the method returns {describe_value(wanted)}; the runtime checks "
                        "tensor outputs only, so give this case no expected outputs"
                    )
                _check_value(v, wanted, f"{where} output {i}")
