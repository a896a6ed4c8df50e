"""Python values -> `ConstantMethod` (the methods ExecuTorch writes for `constant_methods`)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.utils._pytree as pytree

from texir.adapters.tensors import DTYPE_FROM_TORCH, tensor_data_from_tensor
from texir.errors import UnsupportedError
from texir.ir.types import ConstantMethod, DType, TensorData
from texir.serialize.pte.dtypes import DTYPE_TO_SCALAR_TYPE

# ExecuTorch's layout codes (exir.tensor.layout_enum).
_LAYOUT_CODE: dict[torch.layout, int] = {torch.strided: 0, torch.sparse_coo: 1}


def constant_method(name: str, value: object) -> ConstantMethod:
    """The method `name` returning `value`: a bool, int, float, str, torch.dtype, torch.layout or
    CPU tensor, or a list/tuple/dict of them. Anything else is an `UnsupportedError` naming the
    method and the leaf, as is a tensor whose dtype has no ExecuTorch scalar type."""
    leaves, spec = pytree.tree_flatten(value)
    values: list[bool | int | float | str | TensorData] = []
    for i, leaf in enumerate(leaves):
        where = f"constant method {name!r}, value {i}"
        if isinstance(leaf, bool | int | float | str):
            values.append(leaf)
        elif isinstance(leaf, torch.dtype):
            values.append(int(DTYPE_TO_SCALAR_TYPE[_scalar_dtype(leaf, where)]))
        elif isinstance(leaf, torch.layout):
            if leaf not in _LAYOUT_CODE:
                raise UnsupportedError(f"{where}: layout {leaf} has no ExecuTorch code; return torch.strided")
            values.append(_LAYOUT_CODE[leaf])
        elif isinstance(leaf, torch.Tensor):
            _scalar_dtype(leaf.dtype, where)
            values.append(tensor_data_from_tensor(leaf, where=where))
        else:
            raise UnsupportedError(
                f"{where}: a {type(leaf).__name__} is not a constant ExecuTorch can return; use a bool, "
                "int, float, str, torch.dtype, torch.layout or tensor (or a list/tuple/dict of them)"
            )
    return ConstantMethod(values=tuple(values), out_spec=pytree.treespec_dumps(spec))


def constant_methods(methods: Mapping[str, object]) -> dict[str, ConstantMethod]:
    """`constant_method` for each name -> value, in the mapping's order (the order they are written)."""
    return {name: constant_method(name, value) for name, value in methods.items()}


def _scalar_dtype(dtype: torch.dtype, where: str) -> DType:
    ir_dtype = DTYPE_FROM_TORCH.get(dtype)
    if ir_dtype is None or ir_dtype not in DTYPE_TO_SCALAR_TYPE:
        known = ", ".join(sorted(d.value for d in DTYPE_TO_SCALAR_TYPE))
        raise UnsupportedError(
            f"{where}: dtype {dtype} has no ExecuTorch scalar type in program.fbs; convert the tensor to one "
            f"of {known} (complex tensors: torch.view_as_real)"
        )
    return ir_dtype
