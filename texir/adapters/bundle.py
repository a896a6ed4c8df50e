"""Bundled-program cases from torch values: inputs as given, expected outputs from eager runs.

    from texir.adapters.bundle import eager_cases, random_inputs
    from texir.serialize import bpte
    sets = [args, *random_inputs(args, 2, seed=0)]
    bundle = bpte.make_bundle(pte_bytes, {"forward": eager_cases(module, sets)})
    bpte.dump(bundle, "model.bpte")
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from texir.adapters.tensors import tensor_data_from_tensor
from texir.errors import ConversionError
from texir.serialize import bpte
from texir.serialize.pte.dtypes import DTYPE_TO_SCALAR_TYPE

__all__ = ["bundled_value", "eager_case", "eager_cases", "random_inputs", "user_case"]


def bundled_value(x: Any, *, where: str = "value") -> bpte.Value:
    """A tensor (its elements in row-major order), bool, int or float as a bundled Value."""
    if isinstance(x, torch.Tensor):
        data = tensor_data_from_tensor(x.detach().contiguous(), where=where)
        scalar_type = DTYPE_TO_SCALAR_TYPE.get(data.meta.dtype)
        if scalar_type is None:
            raise ConversionError(f"{where}: dtype {x.dtype} has no ExecuTorch ScalarType")
        if data.data is None:
            raise ConversionError(f"{where}: no tensor bytes to bundle")
        return bpte.Value(
            val=bpte.Tensor(
                scalar_type=scalar_type,
                sizes=tuple(int(d) for d in x.shape),
                data=data.data,
                dim_order=tuple(range(x.dim())),
            )
        )
    if isinstance(x, bool):  # before int: bool is an int
        return bpte.Value(val=bpte.Bool(bool_val=x))
    if isinstance(x, int):
        return bpte.Value(val=bpte.Int(int_val=x))
    if isinstance(x, float):
        return bpte.Value(val=bpte.Double(double_val=x))
    raise ConversionError(
        f"{where}: a {type(x).__name__} cannot be bundled; cases hold tensors, bools, ints and floats"
    )


def _leaves(values: Any, what: str) -> list[bpte.Value]:
    leaves = pytree.tree_leaves(values)
    return [bundled_value(x, where=f"{what}[{i}]") for i, x in enumerate(leaves)]


def user_case(inputs: Sequence[Any], expected_outputs: Any = None) -> bpte.BundledMethodTestCase:
    """A case from given inputs (positional args, nested as the method takes them) and, optionally,
    the outputs they must produce (nested as the method returns them)."""
    return bpte.BundledMethodTestCase(
        inputs=tuple(_leaves(tuple(inputs), "inputs")),
        expected_outputs=tuple(_leaves(expected_outputs, "expected_outputs")) if expected_outputs is not None else (),
    )


def eager_case(run: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any] | None = None) -> bpte.BundledMethodTestCase:
    """A case of `args` (and `kwargs`, flattened after them, as torch.export orders a method's
    inputs) whose expected outputs are what `run(*args, **kwargs)` returns in eager PyTorch.

    A `torch.nn.Module` is deep-copied first, so that the case starts from the module's state as
    given (a method that updates buffers is checked from a fresh load) and `run` is left untouched."""
    fn = copy.deepcopy(run) if isinstance(run, torch.nn.Module) else run
    call_args, call_kwargs = copy.deepcopy((tuple(args), dict(kwargs or {})))
    try:
        with torch.no_grad():
            outputs = fn(*call_args, **call_kwargs)
    except Exception as exc:  # the user's model failing on its own inputs
        raise ConversionError(f"the eager run failed: {type(exc).__name__}: {exc}") from exc
    inputs = (tuple(args), dict(kwargs)) if kwargs else tuple(args)
    return bpte.BundledMethodTestCase(
        inputs=tuple(_leaves(inputs, "inputs")), expected_outputs=tuple(_leaves(outputs, "expected_outputs"))
    )


def eager_cases(run: Callable[..., Any], input_sets: Sequence[Sequence[Any]]) -> tuple[bpte.BundledMethodTestCase, ...]:
    """One `eager_case` per set of positional inputs."""
    cases = []
    for k, inputs in enumerate(input_sets):
        try:
            cases.append(eager_case(run, inputs))
        except ConversionError as exc:
            raise ConversionError(f"case {k}: {exc}") from exc
    return tuple(cases)


def _random_like(x: Any, gen: torch.Generator) -> Any:
    if not isinstance(x, torch.Tensor):
        return x
    if x.dtype == torch.bool:
        return torch.randint(0, 2, x.shape, generator=gen).to(torch.bool)
    if x.dtype.is_floating_point:
        return torch.randn(x.shape, generator=gen, dtype=torch.float32).to(x.dtype)
    if x.numel() == 0:
        return x.clone()
    # Integer inputs are often indices: stay within the example's own range.
    low, high = int(x.min()), int(x.max())
    return torch.randint(low, high + 1, x.shape, generator=gen, dtype=x.dtype)


def random_inputs(example: Sequence[Any], count: int, *, seed: int = 0) -> list[tuple[Any, ...]]:
    """`count` input sets shaped like `example` (same nesting, shapes and dtypes), drawn from a
    generator seeded with `seed`: floats normal, bools uniform, integers uniform within the
    example's [min, max] (indices stay valid); non-tensor values are kept."""
    gen = torch.Generator().manual_seed(seed)
    return [tuple(pytree.tree_map(lambda x: _random_like(x, gen), tuple(example))) for _ in range(count)]
