"""The working graph preprocess rewrites: a sub-program's nodes as records, and ExecuTorch 1.5.1's
XNNPACK passes (float subset) on it.

`XGraph.from_program` reads a frozen `texir.ir.Program`; the passes then rewrite the records in
place. The records never leave `preprocess`, which stays a pure function of its input.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from typing import Any, Final

import msgspec
import numpy as np

from texir.backends.xnnpack.errors import XnnpackUnsupportedError
from texir.backends.xnnpack.ops import (
    ACTIVATION_BOUNDS,
    CAT,
    CLONE,
    CLONE_DIM_ORDER,
    CONV,
    DEQUANTIZE,
    FUSES,
    QUANTIZE,
    SQUEEZE,
    TO_COPY,
    TO_DIM_ORDER_COPY,
    UNSQUEEZE,
)
from texir.ir import (
    BoolArg,
    BufferInput,
    CallFunction,
    ConstantTensorInput,
    DType,
    DTypeArg,
    FloatArg,
    IntArg,
    ListArg,
    MemoryFormatArg,
    NoneArg,
    Output,
    ParameterInput,
    Placeholder,
    Program,
    Ref,
    StrArg,
    TensorMeta,
    TupleArg,
    TupleMeta,
)
from texir.ir.analysis import contiguous_in, same_dim_order
from texir.ir.blob import Blob

__all__ = ["Const", "XGraph", "WorkNode", "conv1d_as_conv2d", "split_concatenations", "fuse_activations", "remove_clones",
           "revert_dim_order_copies"]

CHANNELS_LAST = "channels_last"
CONTIGUOUS = "contiguous_format"
_NUMPY: dict[DType, Any] = {
    DType.float32: np.float32, DType.float16: np.float16, DType.float64: np.float64,
    DType.int32: np.int32, DType.int64: np.int64, DType.int8: np.int8, DType.uint8: np.uint8,
}
IMPLICIT_KEY = "IS_IMPLICIT_Q_DQ_TAG"
"""The partitioner's note on a q/dq node the backend folds into quantized values (ExecuTorch's tag)."""


class Const(msgspec.Struct, eq=False):
    """A constant's payload: the IR's own `Blob` while unchanged, a numpy array once transformed."""

    dtype: DType
    shape: tuple[int, ...]
    blob: Blob | None = None
    sha256: str = ""
    array: np.ndarray[Any, Any] | None = None

    def numpy(self) -> np.ndarray[Any, Any]:
        if self.array is not None:
            return self.array
        assert self.blob is not None
        if self.dtype not in _NUMPY:
            raise XnnpackUnsupportedError(f"constant of dtype {self.dtype} cannot be transformed")
        return np.frombuffer(self.blob.view(), dtype=_NUMPY[self.dtype]).reshape(self.shape)


class WorkNode(msgspec.Struct, eq=False):
    """One node: ``target`` is a canonical op, "placeholder" or "output"; node inputs in `args` and
    `kwargs` are the WorkNode objects themselves."""

    name: str
    target: str
    args: list[Any] = msgspec.field(default_factory=list)
    kwargs: dict[str, Any] = msgspec.field(default_factory=dict)
    meta: TensorMeta | TupleMeta | None = None
    handle: int | None = None
    const: Const | None = None
    user_input: bool = False
    nhwc: bool | None = None
    """ExecuTorch's XNN_NHWC_NODE tag: None when untagged."""
    partner: WorkNode | None = None
    min_max: tuple[float, float] | None = None
    """A fused activation's bounds."""
    implicit: bool = False
    """A q/dq node folded into the quantized values around it (emits no XNNPACK node)."""

    @property
    def is_call(self) -> bool:
        return self.target not in ("placeholder", "output")

    @property
    def tensor(self) -> TensorMeta:
        if not isinstance(self.meta, TensorMeta):
            raise XnnpackUnsupportedError(f"node '{self.name}' ({self.target}) does not define a tensor")
        return self.meta

    @property
    def rank(self) -> int:
        return len(self.meta.shape) if isinstance(self.meta, TensorMeta) else -1

    def inputs(self) -> list[WorkNode]:
        """fx's `all_input_nodes`: node inputs in argument order, each once."""
        seen: list[WorkNode] = []
        _collect(self.args, seen)
        _collect(self.kwargs.values(), seen)
        return seen

    def replace_input(self, old: WorkNode, new: WorkNode) -> None:
        self.args = [_swap(a, old, new) for a in self.args]
        self.kwargs = {k: _swap(v, old, new) for k, v in self.kwargs.items()}


def _collect(items: Iterable[Any], seen: list[WorkNode]) -> None:
    """Append to `seen` the nodes in `items` (lists and tuples walked depth first) not in it yet
    (WorkNode compares by identity)."""
    for a in items:
        if isinstance(a, WorkNode):
            if a not in seen:
                seen.append(a)
        elif isinstance(a, (list, tuple)):
            _collect(a, seen)


def _swap(a: Any, old: WorkNode, new: WorkNode) -> Any:
    if a is old:
        return new
    if isinstance(a, (list, tuple)):
        return type(a)(_swap(x, old, new) for x in a)
    return a


def _literal(arg: Any, nodes: dict[str, WorkNode]) -> Any:
    if isinstance(arg, Ref):
        return nodes[arg.name]
    if isinstance(arg, (ListArg, TupleArg)):
        return [_literal(a, nodes) for a in arg.items]
    if isinstance(arg, NoneArg):
        return None
    if isinstance(arg, DTypeArg):
        return arg.value
    if isinstance(arg, FloatArg):
        return float(arg.value)
    if isinstance(arg, (IntArg, BoolArg, StrArg, MemoryFormatArg)):
        return arg.value
    return arg


class XGraph:
    """The nodes of one partition in graph order, ending with the output node."""

    def __init__(self, nodes: list[WorkNode], bounds: dict[str, int], hints: dict[str, int]) -> None:
        self.nodes = nodes
        self.bounds = bounds
        """Upper bound of each bounded symbol."""
        self.hints = hints
        """Each symbol's size in the example inputs (used when a tensor has an unbounded size)."""
        self._users: dict[int, list[WorkNode]] | None = None

    @staticmethod
    def from_program(program: Program) -> XGraph:
        graph = program.graph
        state = {e.target: e.value for e in program.state}
        specs = dict(zip((n.name for n in graph.nodes if isinstance(n, Placeholder)), program.signature.inputs))
        by_name: dict[str, WorkNode] = {}
        nodes: list[WorkNode] = []
        handles = graph.debug_handles()
        implicit = {m.node for m in program.backend_meta if m.key == IMPLICIT_KEY and m.value == "true"}
        for i, node in enumerate(graph.nodes):
            meta = graph.meta(node)
            tmeta = meta if isinstance(meta, (TensorMeta, TupleMeta)) else None
            if isinstance(node, Placeholder):
                spec = specs[node.name]
                x = WorkNode(node.name, "placeholder", meta=tmeta)
                if isinstance(spec, (ParameterInput, BufferInput, ConstantTensorInput)):
                    value = state[spec.target]
                    if value.data is None:
                        raise XnnpackUnsupportedError(
                            f"constant '{spec.target}' has no data: lower from a program with its weights"
                        )
                    x.const = Const(
                        dtype=value.meta.dtype, shape=tuple(int(d) for d in value.meta.shape),
                        blob=value.data, sha256=value.sha256,
                    )
                else:
                    x.user_input = True
            elif isinstance(node, CallFunction):
                x = WorkNode(
                    node.name, node.target, [_literal(a, by_name) for a in node.args],
                    {k: _literal(v, by_name) for k, v in node.kwargs}, tmeta, handles[i],
                    implicit=node.name in implicit,
                )
            elif isinstance(node, Output):
                x = WorkNode(node.name, "output", [[_literal(a, by_name) for a in node.args]])
            else:
                raise XnnpackUnsupportedError(f"node '{node.name}' ({type(node).__name__}) cannot be delegated to XNNPACK")
            by_name[x.name] = x
            nodes.append(x)
        bounds = {rc.symbol: rc.max for rc in program.range_constraints if rc.max is not None and rc.max < 2**62}
        hints = {rc.symbol: rc.hint for rc in program.range_constraints if rc.hint is not None}
        return XGraph(nodes, bounds, hints)

    # -- queries ---------------------------------------------------------------------------------

    def _index(self) -> dict[int, list[WorkNode]]:
        """Users of every node (built on demand, kept up to date by the edits below)."""
        if self._users is None:
            users: dict[int, list[WorkNode]] = {}
            for n in self.nodes:
                for i in n.inputs():
                    users.setdefault(id(i), []).append(n)
            self._users = users
        return self._users

    def users(self, node: WorkNode) -> list[WorkNode]:
        return list(self._index().get(id(node), ()))

    @property
    def output(self) -> WorkNode:
        return self.nodes[-1]

    def outputs(self) -> list[WorkNode]:
        return list(self.output.args[0])

    def shape(self, node: WorkNode) -> list[int]:
        """ExecuTorch's `get_shape`: each symbolic dim at its bound; a 0-d tensor has no dims here."""
        shape = node.tensor.shape
        dims = [d if isinstance(d, int) else _upper_bound(d, self.bounds) for d in shape]
        if any(d is None for d in dims):  # an unbounded size: every dim at the example's size
            dims = [d if isinstance(d, int) else _upper_bound(d, self.hints) for d in shape]
        result = []
        for d, bound in zip(shape, dims, strict=True):
            if bound is None:
                raise XnnpackUnsupportedError(
                    f"node '{node.name}': no upper bound for the symbolic size {d!r} (sums and products of "
                    "bounded symbols are supported); XNNPACK records static upper bounds only",
                    node=node.name, op=node.target,
                )
            result.append(bound)
        return result

    def problem(self) -> str | None:
        """The first way the graph is not well formed (None: it is): node names unique, each node's
        inputs listed before it, the output node last and only there."""
        seen: set[int] = set()
        names: set[str] = set()
        for i, n in enumerate(self.nodes):
            if n.name in names:
                return f"two nodes are named '{n.name}'"
            if (n.target == "output") != (i == len(self.nodes) - 1):
                return f"node '{n.name}' ({n.target}) at {i} of {len(self.nodes)}: the output node must be last"
            missing = [x.name for x in n.inputs() if id(x) not in seen]
            if missing:
                return f"node '{n.name}' reads {missing}, which are not before it in the graph"
            names.add(n.name)
            seen.add(id(n))
        return None

    # -- edits -----------------------------------------------------------------------------------

    def replace_input(self, user: WorkNode, old: WorkNode, new: WorkNode) -> None:
        user.replace_input(old, new)
        index = self._index()
        index[id(old)] = [u for u in index.get(id(old), ()) if u is not user]
        users = index.setdefault(id(new), [])
        if user not in users:
            users.append(user)

    def replace_all_uses(self, old: WorkNode, new: WorkNode) -> None:
        for user in self.users(old):
            if user is not new:
                self.replace_input(user, old, new)

    def set_args(self, node: WorkNode, args: list[Any]) -> None:
        index = self._index()
        for i in node.inputs():
            index[id(i)] = [u for u in index.get(id(i), ()) if u is not node]
        node.args = args
        for i in node.inputs():
            index.setdefault(id(i), []).append(node)

    def insert_after(self, anchor: WorkNode, node: WorkNode) -> None:
        index = self._index()  # built before the insertion, which then adds the node's uses once
        self.nodes.insert(self.nodes.index(anchor) + 1, node)
        for i in node.inputs():
            index.setdefault(id(i), []).append(node)

    def remove(self, node: WorkNode) -> None:
        index = self._index()
        for i in node.inputs():
            index[id(i)] = [u for u in index.get(id(i), ()) if u is not node]
        self.nodes.remove(node)

    def erase_dead(self) -> None:
        """Dead-code elimination of call nodes (placeholders stay): last to first, a call node that
        no node reads goes and its inputs lose a reader (one pass when the nodes are in order;
        again while one left has no reader)."""
        inputs = {id(n): n.inputs() for n in self.nodes}
        readers: dict[int, int] = {}
        for ins in inputs.values():
            for i in ins:
                readers[id(i)] = readers.get(id(i), 0) + 1
        while True:
            dead: set[int] = set()
            for n in reversed(self.nodes):
                if n.is_call and not readers.get(id(n)):
                    dead.add(id(n))
                    for i in inputs[id(n)]:
                        readers[id(i)] -= 1
            if not dead:
                break
            self.nodes = [n for n in self.nodes if id(n) not in dead]
        self._users = None


def _upper_bound(expr: str, bounds: Mapping[str, int]) -> int | None:
    """The upper bound of a size expression built from positive symbols, integers, + and *
    (monotone, so it is the value at each symbol's bound); None for anything else."""
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return None

    def value(e: ast.expr) -> int | None:
        if isinstance(e, ast.Constant) and isinstance(e.value, int) and e.value >= 0:
            return e.value
        if isinstance(e, ast.Name):
            return bounds.get(e.id)
        if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Mult)):
            a, b = value(e.left), value(e.right)
            if a is None or b is None:
                return None
            return a + b if isinstance(e.op, ast.Add) else a * b
        return None

    return value(tree)


# -- passes ----------------------------------------------------------------------------------------


def remove_clones(g: XGraph) -> None:
    """XNNPACKRemoveCloneOpsTransform: an identity clone goes, except one copying an input to an
    output; a dq -> q pair the removal leaves (same params) is then bypassed."""
    outputs = g.outputs()
    dequants: list[WorkNode] = []
    for n in list(g.nodes):
        if n.target not in (CLONE, CLONE_DIM_ORDER):
            continue
        src = n.args[0]
        if n.target == CLONE:
            fmt = n.kwargs.get("memory_format")
            if fmt not in (None, "preserve_format") and not (
                isinstance(src.meta, TensorMeta) and contiguous_in(src.meta, str(fmt))
            ):
                continue  # a memory-format clone goes only where its input is laid out so already
        elif not (isinstance(n.meta, TensorMeta) and isinstance(src.meta, TensorMeta)
                  and same_dim_order(n.meta, src.meta)):
            continue
        if src.target == "placeholder" and n in outputs:
            continue
        g.replace_all_uses(n, src)
        if src.target in DEQUANTIZE:
            dequants.append(src)
    for dq in dequants:
        for user in g.users(dq):
            if user.target in QUANTIZE and user.args[1:] == dq.args[1:]:
                g.replace_all_uses(user, dq.args[0])
    g.erase_dead()


_DIM_ORDERS: Final = {(0, 2, 3, 1): CHANNELS_LAST}


def revert_dim_order_copies(g: XGraph) -> None:
    """DimOrderOpsRevertPass: a `_to_dim_order_copy` becomes a `_to_copy` to the memory format of its
    dim order (contiguous, channels-last, or preserve when it gives none)."""
    for n in g.nodes:
        if n.target != TO_DIM_ORDER_COPY:
            continue
        order = n.kwargs.get("dim_order")
        if order is None:
            fmt = "preserve_format"
        elif list(order) == list(range(len(order))):
            fmt = CONTIGUOUS
        elif tuple(order) in _DIM_ORDERS:
            fmt = _DIM_ORDERS[tuple(order)]
        else:
            raise XnnpackUnsupportedError(f"'{n.name}': dim order {list(order)} is no memory format",
                                          node=n.name, op=n.target)
        n.target = TO_COPY
        n.kwargs = {**{k: v for k, v in n.kwargs.items() if k != "dim_order"}, "memory_format": fmt}


def _with_unit_dim(meta: Any) -> TensorMeta:
    """The meta of a tensor unsqueezed at its end (a trailing size-1 dim of stride 1)."""
    assert isinstance(meta, TensorMeta)
    return msgspec.structs.replace(meta, shape=(*meta.shape, 1), strides=(*meta.strides, 1))


def conv1d_as_conv2d(g: XGraph) -> None:
    """Conv1dUnsqueezePass (float): a 1-D convolution becomes a 2-D one over a trailing unit dim,
    its input unsqueezed and its output squeezed at the end, its weight given that dim too (same
    bytes). The new nodes have no debug handle."""
    reshaped: set[int] = set()  # weights given their unit dim already (one weight may serve several convs)
    for n in list(g.nodes):
        if n.target != CONV or n.args[0].rank != 3:
            continue
        w = n.args[1]
        if w.const is None:
            raise XnnpackUnsupportedError(f"'{n.name}': a 1-D convolution needs a constant weight", node=n.name)
        if id(w) not in reshaped:
            reshaped.add(id(w))
            w.const.shape = (*w.const.shape, 1)
            if w.const.array is not None:
                w.const.array = w.const.array.reshape(w.const.shape)
            w.meta = _with_unit_dim(w.meta)
        x = n.args[0]
        before = WorkNode(f"{n.name}_unsqueeze", UNSQUEEZE, [x, -1], {}, _with_unit_dim(x.meta))
        after = WorkNode(f"{n.name}_squeeze", SQUEEZE, [n, -1], {}, n.meta)
        for user in g.users(n):
            user.replace_input(n, after)
        n.args = [before, *n.args[1:3], *([*n.args[i], extra] for i, extra in ((3, 1), (4, 0), (5, 1))), n.args[6],
                  [*n.args[7], 0], *n.args[8:]]
        n.meta = _with_unit_dim(n.meta)
        at = g.nodes.index(n)
        g.nodes[at:at + 1] = [before, n, after]
        g._users = None


MAX_CAT: Final = 5
"""XNNPACK's widest concatenation."""


def split_concatenations(g: XGraph) -> None:
    """DecomposeConcatenate (float): a cat of more than 5 tensors becomes a chain, the first cat of
    5 and each next one of the previous result and up to 4 more tensors. The first keeps the
    node (and its debug handle); the new ones have none. Sizes must be static."""
    at = 0
    while at < len(g.nodes):
        n = g.nodes[at]
        at += 1
        if n.target != CAT or len(n.args[0]) <= MAX_CAT:
            continue
        tensors = list(n.args[0])
        axis = n.args[1] if len(n.args) > 1 else 0
        axis += n.rank if axis < 0 else 0
        rest = WorkNode(f"{n.name}_rest", CAT, [[n, *tensors[MAX_CAT:]], *n.args[1:]], dict(n.kwargs), n.meta)
        for user in g.users(n):
            user.replace_input(n, rest)
        n.args = [tensors[:MAX_CAT], *n.args[1:]]
        shape = [int(d) for d in n.tensor.shape]
        shape[axis] = sum(int(t.tensor.shape[axis]) for t in tensors[:MAX_CAT])
        n.meta = msgspec.structs.replace(n.tensor, shape=tuple(shape), strides=_contiguous(shape))
        g.nodes.insert(at, rest)
        g._users = None


def _contiguous(shape: list[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def fuse_activations(g: XGraph) -> None:
    """FuseActivationPass: relu/hardtanh after a single-user conv, linear, add, sub or mul is removed
    and its bounds go to the producer's `output_min_max`."""
    for act in [n for n in g.nodes if n.target in ACTIVATION_BOUNDS]:
        src = act.args[0]
        if not isinstance(src, WorkNode) or act.target not in FUSES.get(src.target, ()) or src.min_max is not None:
            continue
        if len(g.users(src)) != 1:
            continue
        src.min_max = ACTIVATION_BOUNDS[act.target](act.args)
        g.replace_all_uses(act, src)
    g.erase_dead()
