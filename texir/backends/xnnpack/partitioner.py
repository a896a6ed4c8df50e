"""`partitioner(**options)`: ExecuTorch 1.5.1's XnnpackPartitioner (float and static-int8 configs)
computed on the IR.

Each supported op has a check (`CHECKS`) that returns None when XNNPACK takes the node, or the
reason it does not; static-int8 patterns (`quant_partition`) add the q/dq nodes and quantized
weights around their op and tag the q/dq implicit. Partitions are then the maximal ones torch's
CapabilityBasedPartitioner proposes (`OpSupportPartitioner`), with the constants they read, as
ExecuTorch tags them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

import pydantic

from texir.backends.xnnpack.backend import BACKEND_ID
from texir.backends.xnnpack.partition_order import torch_partition_order
from texir.backends.xnnpack.quant_partition import (
    DQ_PER_TENSOR,
    IMPLICIT_KEY,
    Q_PER_TENSOR,
    QuantPlan,
    static_quant,
)
from texir.ir import (
    BackendNodeMeta,
    BufferInput,
    CallFunction,
    ConstantTensorInput,
    DType,
    IntArg,
    ListArg,
    NoneArg,
    ParameterInput,
    Placeholder,
    Program,
    Ref,
    TensorMeta,
    ValueMeta,
)
from texir.ir.analysis import value_metas
from texir.lowering.errors import PartitionerError
from texir.lowering.partitioners import OpSupportPartitioner
from texir.lowering.plan import PartitionPlan

__all__ = ["CHECKS", "KEPT_OPS", "XnnpackNativePartitioner", "partitioner"]

_FLOATS: Final = frozenset({DType.float32, DType.float16})
_QDQ_DTYPES: Final = _FLOATS | {DType.int8}


class _Node:
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


Check = Callable[[_Node], str | None]


def _common(n: _Node) -> str | None:
    """Every config's first check: float tensors (int8 on q/dq nodes too), one input dtype, no
    empty or symbolic-only tensors."""
    dtypes = set()
    allowed = _QDQ_DTYPES if n.node.target in (Q_PER_TENSOR, DQ_PER_TENSOR) else _FLOATS
    for ref in _refs(n.node):
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


def _refs(node: CallFunction) -> list[str]:
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


def _ok(n: _Node) -> str | None:
    return None


def _linear(n: _Node) -> str | None:
    if not n.is_constant(1):
        return "weight is not a parameter, buffer or constant (XNNPACK needs static weights)"
    if n.arg(2) is not None and not isinstance(n.arg(2), NoneArg) and not n.is_constant(2):
        return "bias is not static"
    return None


def _addmm(n: _Node) -> str | None:
    if not n.is_constant(2):
        return "weight is not static"
    if not n.is_constant(0):
        return "bias is not static"
    kwargs = dict(n.node.kwargs)
    if any(getattr(kwargs.get(k), "value", 1) != 1 for k in ("beta", "alpha")):
        return "beta or alpha != 1"
    return None


def _mm(n: _Node) -> str | None:
    return None if n.is_constant(1) else "weight is not static"


def _conv(n: _Node) -> str | None:
    if not n.is_constant(1):
        return "weight is not static"
    if not isinstance(n.arg(2), NoneArg) and not n.is_constant(2):
        return "bias is not static"
    w = n.tensor(1)
    dims = len(w.shape) - 2 if w is not None else 0
    if dims not in (1, 2) or len(n.ints(3) or []) != dims:
        return f"{dims}-D convolution (XNNPACK takes 1-D and 2-D)"
    return None


def _prelu(n: _Node) -> str | None:
    return None if n.is_constant(1) else "prelu weight is not a parameter"


def _static_output(n: _Node) -> str | None:
    out = n.metas.get(n.node.name)
    static = isinstance(out, TensorMeta) and all(isinstance(d, int) for d in out.shape)
    return None if static else "dynamic output sizes"


def _alpha_one(n: _Node) -> str | None:
    alpha = dict(n.node.kwargs).get("alpha")
    if alpha is not None and getattr(alpha, "value", 1) != 1:
        return "alpha != 1"
    if not isinstance(n.arg(1), Ref):
        return "scalar operand"
    return None


def _two_tensors(n: _Node) -> str | None:
    return None if isinstance(n.arg(1), Ref) else "scalar operand"


def _cat(n: _Node) -> str | None:
    a = n.arg(0)
    count = len(a.items) if isinstance(a, ListArg) else 0
    if len(set(_refs(n.node))) < 2:
        return "fewer than 2 distinct inputs"
    out = n.metas.get(n.node.name)
    if count > 5 and not (isinstance(out, TensorMeta) and all(isinstance(d, int) for d in out.shape)):
        return f"{count} inputs with symbolic sizes (the native backend splits static concatenations only)"
    return None


def _max_pool(n: _Node) -> str | None:
    kernel = n.ints(1) or []
    stride = n.ints(2) or kernel
    if len(kernel) == 1:
        kernel = kernel * 2
    if len(stride) == 1:
        stride = stride * 2
    if any(s > k for s, k in zip(stride, kernel)):
        return "stride larger than the kernel"
    return None


def _avg_pool(n: _Node) -> str | None:
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


def _view(n: _Node) -> str | None:
    shape = n.ints(1)
    if shape is None:
        return "symbolic shape"
    if shape.count(-1) > 1:
        return "more than one -1"
    return None


def _mean(n: _Node) -> str | None:
    x = n.tensor(0)
    dims = n.ints(1) or []
    keep = len(n.node.args) > 2 and getattr(n.node.args[2], "value", False)
    if x is None or len(x.shape) != 4 or sorted(d % 4 for d in dims) != [2, 3] or not keep:
        return "mean over other than dims (2, 3) of a 4-D tensor with keepdim"
    if dict(n.node.kwargs).get("dtype") not in (None, NoneArg()):
        return "dtype given"
    return None


def _softmax(n: _Node) -> str | None:
    x = n.tensor(0)
    dim = n.arg(1)
    rank = len(x.shape) if x is not None else 0
    return None if isinstance(dim, IntArg) and dim.value in (-1, rank - 1) else "softmax over a dim that is not the last"


def _gelu(n: _Node) -> str | None:
    x = n.tensor(0)
    return "float16 gelu" if x is not None and x.dtype == DType.float16 else None


def _pad(n: _Node) -> str | None:
    pads = n.ints(1)
    return None if pads is not None and all(p >= 0 for p in pads) else "negative or symbolic padding"


def _slice(n: _Node) -> str | None:
    step = n.arg(4)
    if step is not None and getattr(step, "value", 1) != 1:
        return "step != 1"
    x, out = n.tensor(0), n.metas.get(n.node.name)
    shapes = [*(x.shape if x else ()), *(out.shape if isinstance(out, TensorMeta) else ())]
    if not all(isinstance(d, int) and d != 0 for d in shapes):
        return "symbolic or zero sizes"
    return None


def _unsqueeze(n: _Node) -> str | None:
    x, dim = n.tensor(0), n.arg(1)
    rank = len(x.shape) if x is not None else -2
    return None if isinstance(dim, IntArg) and dim.value in (-1, rank) else "unsqueeze of a dim that is not the last"


def _square(n: _Node) -> str | None:
    exponent = n.arg(1)
    return None if getattr(exponent, "value", None) == 2 else "exponent is not 2"


def _clone(n: _Node) -> str | None:
    fmt = dict(n.node.kwargs).get("memory_format")
    if n.node.target == "aten::clone.default":
        return None if fmt is None or getattr(fmt, "value", None) == "preserve_format" else "memory format changes"
    x, out = n.tensor(0), n.metas.get(n.node.name)
    if x is None or not isinstance(out, TensorMeta) or _dim_order(x) != _dim_order(out):
        return "dim order changes"
    return None


def _dim_order(meta: TensorMeta) -> tuple[int, ...]:
    return tuple(sorted(range(len(meta.strides)), key=lambda d: -int(meta.strides[d]) if isinstance(meta.strides[d], int) else 0))


CHECKS: Final[dict[str, Check]] = {
    Q_PER_TENSOR: _ok,
    DQ_PER_TENSOR: _ok,
    "aten::clamp.default": _ok,
    "aten::pow.Tensor_Scalar": _square,
    "aten::constant_pad_nd.default": _pad,
    "aten::slice_copy.Tensor": _slice,
    "aten::unsqueeze_copy.default": _unsqueeze,
    "aten::clone.default": _clone,
    "dim_order_ops::_clone_dim_order.default": _clone,
    "aten::linear.default": _linear,
    "aten::convolution.default": _conv,
    "aten::addmm.default": _addmm,
    "aten::mm.default": _mm,
    "aten::add.Tensor": _alpha_one,
    "aten::sub.Tensor": _alpha_one,
    "aten::mul.Tensor": _two_tensors,
    "aten::div.Tensor": _two_tensors,
    "aten::minimum.default": _ok,
    "aten::maximum.default": _ok,
    "aten::bmm.default": _ok,
    "aten::relu.default": _ok,
    "aten::hardtanh.default": _ok,
    "aten::sigmoid.default": _ok,
    "aten::tanh.default": _ok,
    "aten::gelu.default": _gelu,
    "aten::abs.default": _ok,
    "aten::neg.default": _ok,
    "aten::floor.default": _ok,
    "aten::ceil.default": _ok,
    "aten::sqrt.default": _ok,
    "aten::rsqrt.default": _ok,
    "aten::exp.default": _ok,
    "aten::log.default": _ok,
    "aten::sin.default": _ok,
    "aten::cos.default": _ok,
    "aten::hardswish.default": _ok,
    "aten::leaky_relu.default": _ok,
    "aten::prelu.default": _prelu,
    "aten::upsample_bilinear2d.vec": _static_output,
    "aten::_softmax.default": _softmax,
    "aten::max_pool2d.default": _max_pool,
    "aten::avg_pool2d.default": _avg_pool,
    "aten::mean.dim": _mean,
    "aten::view_copy.default": _view,
    "aten::permute_copy.default": _ok,
    "aten::cat.default": _cat,
}
"""The float ops the native partitioner takes, with the conditions ExecuTorch's configs put on them."""

KEPT_OPS: Final = (
    "aten::hardswish.default", "aten::linear.default", "aten::max_pool2d.default", "aten::prelu.default",
    "aten::upsample_bilinear2d.vec",
)
"""Ops kept undecomposed when the partitioner takes them (ExecuTorch's `get_original_aten`, those
this backend supports)."""


class _Options(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")

    per_op_mode: bool = False
    """One partition per supported node (ExecuTorch's `per_op_mode`)."""
    config_precisions: tuple[str, ...] = ("fp32", "static_int8")
    """ExecuTorch's precisions the partitioner takes: 'fp32' (always) and 'static_int8' (pt2e
    static int8, XNNPACKQuantizer's per-tensor or per-channel scheme)."""


class XnnpackNativePartitioner:
    """ExecuTorch's XnnpackPartitioner for float and static-int8 programs, as a texir partitioner;
    `reasons(program)` says why each call node is turned down."""

    def __init__(self, options: _Options) -> None:
        self.options = options

    def __repr__(self) -> str:
        return f"texir.backends.xnnpack.partitioner(per_op_mode={self.options.per_op_mode})"

    def _quant(self, program: Program, constants: frozenset[str]) -> QuantPlan:
        if "static_int8" not in self.options.config_precisions:
            return QuantPlan(enabled=False)
        metas = value_metas(program.graph)

        def accepts(node: CallFunction) -> bool:
            return _verdict(node, metas, constants, QuantPlan()) is None

        return static_quant(program, constants, accepts)

    def reasons(self, program: Program) -> dict[str, str]:
        """Every top-level call node the partitioner turns down, with the reason."""
        metas = value_metas(program.graph)
        constants = _constants(program)
        quant = self._quant(program, constants)
        found = {}
        for node in program.graph.nodes:
            if isinstance(node, CallFunction):
                why = _verdict(node, metas, constants, quant)
                if why is not None:
                    found[node.name] = why
        return found

    def ops_to_not_decompose(self, program: Program) -> tuple[str, ...]:
        metas = value_metas(program.graph)
        constants = _constants(program)
        quant = self._quant(program, constants)
        kept = {
            node.target for node in program.graph.nodes
            if isinstance(node, CallFunction) and node.target in KEPT_OPS
            and _verdict(node, metas, constants, quant) is None
        }
        return tuple(sorted(kept))

    def nodes_to_decompose(self, program: Program) -> tuple[str, ...]:
        metas = value_metas(program.graph)
        constants = _constants(program)
        quant = self._quant(program, constants)
        return tuple(
            node.name for node in program.graph.nodes
            if isinstance(node, CallFunction) and node.target in KEPT_OPS
            and _verdict(node, metas, constants, quant) is not None
        )

    def __call__(self, program: Program) -> PartitionPlan:
        if self.options.per_op_mode:
            raise PartitionerError("per_op_mode is not implemented by the native XNNPACK partitioner yet")
        constants = _constants(program)
        quant = self._quant(program, constants)
        fused_bn = _fusable_batch_norms(program, constants)

        def supported(node: CallFunction, metas: Mapping[str, ValueMeta]) -> bool:
            if node.name in fused_bn:
                return True
            return _verdict(node, metas, constants, quant) is None

        plan = OpSupportPartitioner(BACKEND_ID, supported)(program)
        # Like ExecuTorch's partitioner, only the top-level graph (never inside a cond or map branch).
        tags = {key: tag for key, tag in plan.tags if "/" not in key}
        support = dict.fromkeys(tags, True)
        # Only the GEMM, batch-norm and prelu configs claim constants (their weights); any other constant
        # a partition reads becomes a delegate input, as with ExecuTorch's partitioner.
        for node in program.graph.nodes:
            tag = tags.get(node.name)
            if tag is None or not isinstance(node, CallFunction) or node.target not in _CLAIMS:
                continue
            for i in _CLAIMS[node.target]:
                a = node.args[i] if len(node.args) > i else None
                if isinstance(a, Ref) and a.name in constants:
                    tags.setdefault(a.name, tag)
        # The constants of static-int8 patterns (quantized weights, their scales and zero points).
        for dep, anchor in quant.deps.items():
            if dep in constants and anchor in tags:
                tags.setdefault(dep, tags[anchor])
        # Tags named and ordered as torch's CapabilityBasedPartitioner numbers its partitions.
        graph = program.graph
        ids = torch_partition_order(graph, support)
        first: dict[str, int] = {}
        for node, pid in zip(graph.nodes, ids):
            tag = tags.get(node.name)
            if tag is not None and pid >= 0:
                first[tag] = min(first.get(tag, pid), pid)
        rename = {tag: f"tag{pid}" for tag, pid in first.items()}
        renamed = {key: rename.get(tag, tag) for key, tag in tags.items()}
        spec = {tag: s for tag, s in plan.specs if tag in first}
        ordered = sorted(spec, key=lambda tag: first[tag])
        notes = [
            BackendNodeMeta(node=name, key=IMPLICIT_KEY, value="true")
            for name in sorted(quant.implicit) if name in renamed
        ]
        return PartitionPlan.build(
            renamed, [(rename.get(tag, tag), spec[tag]) for tag in ordered],
            shared_constants=plan.shared_constants, backend_meta=notes,
        )


_CLAIMS: Final[dict[str, tuple[int, ...]]] = {
    "aten::linear.default": (1, 2),
    "aten::convolution.default": (1, 2),
    "aten::addmm.default": (2, 0),
    "aten::mm.default": (1,),
    "aten::prelu.default": (1,),
    "aten::_native_batch_norm_legit_no_training.default": (1, 2, 3, 4),
}


def _verdict(node: CallFunction, metas: Mapping[str, ValueMeta], constants: frozenset[str],
             quant: QuantPlan) -> str | None:
    refused = quant.refused.get(node.name)
    if refused is not None:
        return refused
    if node.name in quant.gemms:
        return _common(_Node(node, metas, constants))
    if node.name in quant.deps:
        return None  # part of a static-int8 pattern its anchor op takes
    if not quant.enabled and node.target in (Q_PER_TENSOR, DQ_PER_TENSOR):
        return "static_int8 is not in config_precisions"
    check = CHECKS.get(node.target)
    if check is None:
        return f"op {node.target} has no XNNPACK config in the native backend"
    n = _Node(node, metas, constants)
    return _common(n) or check(n)


def _constants(program: Program) -> frozenset[str]:
    names = [n.name for n in program.graph.nodes if isinstance(n, Placeholder)]
    return frozenset(
        name for name, spec in zip(names, program.signature.inputs)
        if isinstance(spec, (ParameterInput, BufferInput, ConstantTensorInput))
    )


def _fusable_batch_norms(program: Program, constants: frozenset[str]) -> set[str]:
    """Batch norms (and their getitem) that FuseBatchNormPass folds into the convolution before them."""
    nodes = {n.name: n for n in program.graph.nodes if isinstance(n, CallFunction)}
    users: dict[str, list[CallFunction]] = {}
    for n in nodes.values():
        for ref in _refs(n):
            users.setdefault(ref, []).append(n)
    found: set[str] = set()
    for n in nodes.values():
        if n.target != "aten::_native_batch_norm_legit_no_training.default":
            continue
        src = n.args[0]
        conv = nodes.get(src.name) if isinstance(src, Ref) else None
        if conv is None or conv.target != "aten::convolution.default" or len(users.get(conv.name, [])) != 1:
            continue
        if not all(isinstance(a, Ref) and a.name in constants for a in n.args[1:5]):
            continue
        getitems = users.get(n.name, [])
        if all(u.target == "_operator::getitem" and getattr(u.args[1], "value", None) == 0 for u in getitems):
            found.add(n.name)
            found.update(u.name for u in getitems)
    return found


def partitioner(**options: object) -> XnnpackNativePartitioner:
    """The native XNNPACK partitioner; options as XnnpackPartitioner's (`per_op_mode`,
    `config_precisions`), validated."""
    try:
        opts = _Options(**options)  # type: ignore[arg-type]  # pydantic validates each option
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        raise PartitionerError(
            f"invalid XNNPACK partitioner option '{'.'.join(str(p) for p in first['loc'])}': {first['msg']}"
        ) from None
    if set(opts.config_precisions) - {"fp32", "static_int8"} or "fp32" not in opts.config_precisions:
        raise PartitionerError(
            f"config_precisions {list(opts.config_precisions)}: the native XNNPACK partitioner takes 'fp32' with "
            "optionally 'static_int8' (dynamic int8 and 4-bit weights: --partitioner executorch:xnnpack)"
        )
    return XnnpackNativePartitioner(opts)
