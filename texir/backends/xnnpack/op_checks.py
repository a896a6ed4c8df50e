"""The checks of the native XNNPACK partitioner, each with the conditions ExecuTorch 1.5.1's
partitioner configs put on an op: a check returns None when XNNPACK takes the node, or the reason
it does not. `common_check` is every config's first check. Which op has which check is data in
`ops.OPS`; this module names no op."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from texir.ir import CallFunction, DType, IntArg, ListArg, NoneArg, Ref, TensorMeta, ValueMeta
from texir.ir.analysis import same_dim_order

__all__ = ["Check", "NodeView", "PatternCheck", "common_check", "refs", "same_qparams"]

_FLOATS: Final = frozenset({DType.float32, DType.float16})
_QDQ_DTYPES: Final = _FLOATS | {DType.int8}


class NodeView:
    """What a check sees: the call, the graph's value metadata and the program's constants."""

    def __init__(self, node: CallFunction, metas: Mapping[str, ValueMeta], constants: frozenset[str]) -> None:
        self.node, self.metas, self.constants = node, metas, constants

    def arg(self, i: int) -> object:
        return self.node.args[i] if len(self.node.args) > i else None

    def tensor(self, i: int) -> TensorMeta | None:
        a = self.arg(i)
        meta = self.metas.get(a.name) if isinstance(a, Ref) else None
        return meta if isinstance(meta, TensorMeta) else None

    def ints(self, i: int) -> list[int] | None:
        a = self.arg(i)
        if isinstance(a, ListArg) and all(isinstance(x, IntArg) for x in a.items):
            return [x.value for x in a.items if isinstance(x, IntArg)]
        return None

    def is_constant(self, i: int) -> bool:
        a = self.arg(i)
        return isinstance(a, Ref) and a.name in self.constants


Check = Callable[[NodeView], str | None]


PatternCheck = Callable[[CallFunction, CallFunction], str | None]
"""A condition on an op's static-int8 pattern: the dequantize before the op and the quantize after it."""


def common_check(n: NodeView, *, int8: bool = False) -> str | None:
    """Every config's first check: float tensors (int8 too when `int8`, for the q/dq nodes), one
    input dtype, no empty or symbolic-only tensors."""
    dtypes = set()
    allowed = _QDQ_DTYPES if int8 else _FLOATS
    for ref in refs(n.node):
        meta = n.metas.get(ref)
        if isinstance(meta, TensorMeta):
            if meta.dtype not in allowed:
                return f"input '{ref}' has dtype {meta.dtype} (XNNPACK float configs take float32/float16)"
            if any(d == 0 for d in meta.shape):
                return f"input '{ref}' is empty"
            dtypes.add(meta.dtype)
    if len(dtypes) > 1:
        return "inputs of mixed dtypes"
    out = n.metas.get(n.node.name)
    if isinstance(out, TensorMeta) and out.dtype not in allowed:
        return f"output has dtype {out.dtype}"
    return None


def refs(node: CallFunction) -> list[str]:
    names: list[str] = []

    def walk(a: object) -> None:
        if isinstance(a, Ref):
            names.append(a.name)
        elif isinstance(a, ListArg):
            for x in a.items:
                walk(x)

    for a in node.args:
        walk(a)
    return names


def ok(n: NodeView) -> str | None:
    return None


def linear(n: NodeView) -> str | None:
    if not n.is_constant(1):
        return "weight is not a parameter, buffer or constant (XNNPACK needs static weights)"
    if n.arg(2) is not None and not isinstance(n.arg(2), NoneArg) and not n.is_constant(2):
        return "bias is not static"
    return None


def addmm(n: NodeView) -> str | None:
    if not n.is_constant(2):
        return "weight is not static"
    if not n.is_constant(0):
        return "bias is not static"
    kwargs = dict(n.node.kwargs)
    if any(getattr(kwargs.get(k), "value", 1) != 1 for k in ("beta", "alpha")):
        return "beta or alpha != 1"
    return None


def mm(n: NodeView) -> str | None:
    return None if n.is_constant(1) else "weight is not static"


def conv(n: NodeView) -> str | None:
    if not n.is_constant(1):
        return "weight is not static"
    if not isinstance(n.arg(2), NoneArg) and not n.is_constant(2):
        return "bias is not static"
    w = n.tensor(1)
    dims = len(w.shape) - 2 if w is not None else 0
    if dims not in (1, 2) or len(n.ints(3) or []) != dims:
        return f"{dims}-D convolution (XNNPACK takes 1-D and 2-D)"
    return None


def prelu(n: NodeView) -> str | None:
    return None if n.is_constant(1) else "prelu weight is not a parameter"


def static_output(n: NodeView) -> str | None:
    out = n.metas.get(n.node.name)
    static = isinstance(out, TensorMeta) and all(isinstance(d, int) for d in out.shape)
    return None if static else "dynamic output sizes"


def alpha_one(n: NodeView) -> str | None:
    alpha = dict(n.node.kwargs).get("alpha")
    if alpha is not None and getattr(alpha, "value", 1) != 1:
        return "alpha != 1"
    if not isinstance(n.arg(1), Ref):
        return "scalar operand"
    return None


def two_tensors(n: NodeView) -> str | None:
    return None if isinstance(n.arg(1), Ref) else "scalar operand"


def cat(n: NodeView) -> str | None:
    a = n.arg(0)
    count = len(a.items) if isinstance(a, ListArg) else 0
    if len(set(refs(n.node))) < 2:
        return "fewer than 2 distinct inputs"
    out = n.metas.get(n.node.name)
    if count > 5 and not (isinstance(out, TensorMeta) and all(isinstance(d, int) for d in out.shape)):
        return f"{count} inputs with symbolic sizes (the native backend splits static concatenations only)"
    return None


def max_pool(n: NodeView) -> str | None:
    kernel = n.ints(1) or []
    stride = n.ints(2) or kernel
    if len(kernel) == 1:
        kernel = kernel * 2
    if len(stride) == 1:
        stride = stride * 2
    if any(s > k for s, k in zip(stride, kernel)):
        return "stride larger than the kernel"
    return None


def avg_pool(n: NodeView) -> str | None:
    args = n.node.args
    ceil = len(args) > 4 and getattr(args[4], "value", False)
    include_pad = len(args) <= 5 or getattr(args[5], "value", True)
    divisor = len(args) > 6 and not isinstance(args[6], NoneArg)
    padding = n.ints(3) or [0]
    if ceil:
        return "ceil_mode"
    if divisor:
        return "divisor_override"
    if include_pad and any(padding):
        return "count_include_pad with non-zero padding"
    return None


def view(n: NodeView) -> str | None:
    shape = n.ints(1)
    if shape is None:
        return "symbolic shape"
    if shape.count(-1) > 1:
        return "more than one -1"
    return None


def mean(n: NodeView) -> str | None:
    x = n.tensor(0)
    dims = n.ints(1) or []
    keep = len(n.node.args) > 2 and getattr(n.node.args[2], "value", False)
    if x is None or len(x.shape) != 4 or sorted(d % 4 for d in dims) != [2, 3] or not keep:
        return "mean over other than dims (2, 3) of a 4-D tensor with keepdim"
    if dict(n.node.kwargs).get("dtype") not in (None, NoneArg()):
        return "dtype given"
    return None


def softmax(n: NodeView) -> str | None:
    x = n.tensor(0)
    dim = n.arg(1)
    rank = len(x.shape) if x is not None else 0
    return None if isinstance(dim, IntArg) and dim.value in (-1, rank - 1) else "softmax over a dim that is not the last"


def gelu(n: NodeView) -> str | None:
    x = n.tensor(0)
    return "float16 gelu" if x is not None and x.dtype == DType.float16 else None


def pad(n: NodeView) -> str | None:
    pads = n.ints(1)
    return None if pads is not None and all(p >= 0 for p in pads) else "negative or symbolic padding"


def slice_copy(n: NodeView) -> str | None:
    step = n.arg(4)
    if step is not None and getattr(step, "value", 1) != 1:
        return "step != 1"
    x, out = n.tensor(0), n.metas.get(n.node.name)
    shapes = [*(x.shape if x else ()), *(out.shape if isinstance(out, TensorMeta) else ())]
    if not all(isinstance(d, int) and d != 0 for d in shapes):
        return "symbolic or zero sizes"
    return None


def unsqueeze(n: NodeView) -> str | None:
    x, dim = n.tensor(0), n.arg(1)
    rank = len(x.shape) if x is not None else -2
    return None if isinstance(dim, IntArg) and dim.value in (-1, rank) else "unsqueeze of a dim that is not the last"


def square(n: NodeView) -> str | None:
    exponent = n.arg(1)
    return None if getattr(exponent, "value", None) == 2 else "exponent is not 2"


def clone(n: NodeView) -> str | None:
    """aten's clone, as ExecuTorch's CloneConfig checks it: XNNPACK copies a tensor as it is, so the
    clone must keep its input's dim order (a memory format that keeps it is fine: an ATen clone with
    one is met with EdgeCompileConfig(_skip_dim_order=True))."""
    return clone_dim_order(n)


def clone_dim_order(n: NodeView) -> str | None:
    """The dim-order clone: XNNPACK copies a tensor as it is (the same dim order out as in)."""
    x, out = n.tensor(0), n.metas.get(n.node.name)
    if x is None or not isinstance(out, TensorMeta) or not same_dim_order(x, out):
        return "dim order changes"
    return None


def same_dtype(n: NodeView) -> str | None:
    x, out = n.tensor(0), n.metas.get(n.node.name)
    if x is None or not isinstance(out, TensorMeta) or x.dtype != out.dtype:
        return "dtype conversion (XNNPACK takes memory-format copies only)"
    return None


def same_qparams(dq: CallFunction, q: CallFunction) -> str | None:
    """XNNPACK's static slice keeps the quantization of its input: the quantize after it must have the
    dequantize's parameters (scale, zero point, bounds, dtype; a tensor parameter the same constant)."""
    if dq.target.replace("dequantize", "quantize") == q.target and dq.args[1:] == q.args[1:]:
        return None
    return ("XNNPACK's static-int8 slice needs the quantize after it to have its input's quantization "
            "parameters (the quantizer shares them when it annotates the slice)")
