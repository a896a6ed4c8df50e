"""Whole-node decompositions remembered and replayed (`texir.adapters.local_decompose`): a language
model's layers repeat the same ops on tensors of the same metadata (the same symbolic sizes), so
the second layer's `scaled_dot_product_attention` needs neither torch's decomposition nor a
fake-tensor dispatch of each op it calls: the ops the first one recorded are made again as nodes
on the new inputs, with fresh fake values of the recorded metadata.

A node is remembered by its op, its non-tensor arguments (a symbolic size by its expression) and
each tensor input's metadata (dtype, device, layout, sizes, strides and storage offset as
expressions) plus which inputs are the same tensor. A recording is kept only when every op it made
took the plain path (no constant, no alias dropped, no view of a buffer, no value from outside the
node's inputs and its own results); anything else is recorded anew every time.

Recordings of nodes whose inputs and arguments hold no symbolic size are remembered by the process
too (`_REMEMBERED`, by the recorder's decomposition table and kept ops besides the key): a second
lowering, of the same model or of another with layers of the same metadata, records none of them
again. Such a recording is kept with its results' metadata only (`Result`: no fake mode, shape
environment or program of the lowering that recorded it stays alive through it)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Literal, Protocol, cast

import msgspec
import torch
from torch._dispatch.python import enable_python_dispatcher
from torch._library.utils import is_impure
from torch._ops import OpOverload
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import _disable_current_modes

from texir.adapters.op_args import leaves, map_leaves
from texir.adapters.symbolic_sizes import unbacked_sizes

__all__ = ["Recording", "Tape", "decomposed", "forget_recordings", "fresh_like", "node_key"]

_PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


class Ref(msgspec.Struct, frozen=True):
    """A tensor argument of a recorded op: the node's `index`th distinct input (`made` False) or
    the `index`th tensor the recording made."""

    made: bool
    index: int


class Result(msgspec.Struct, frozen=True):
    """A recorded result's metadata, static, on the CPU (a recording the process keeps)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


class Made(msgspec.Struct):
    """One op of a recording: its arguments (tensors as `Ref`s, symbolic sizes as they were) and
    its results' template values (one, several with a getitem each, or none)."""

    func: OpOverload
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    results: tuple[torch.Tensor | Result, ...] | torch.Tensor | Result | None
    dispatch: bool  # a result is a view into a larger storage: its value is the fake mode's to make


class Tape(msgspec.Struct):
    """The ops one decomposition made, while it is made (`ok` False once it did anything replay
    would not reproduce), and what it returned."""

    inputs: dict[int, int]  # id(input value) -> its index
    generic: bool = False  # remembered by its inputs' ranks (`_SHAPE_FREE`): a replay computes its values
    made: dict[int, int] = msgspec.field(default_factory=dict)  # id(a result) -> its index among the results
    ops: list[Made] = msgspec.field(default_factory=list)
    ok: bool = True
    count: int = 0
    returned: Any = None
    unread: list[_Unread] | None = None  # per op, what of its results nothing reads (`_unread`), once asked

    def ref(self, value: torch.Tensor) -> Ref | None:
        index = self.inputs.get(id(value))
        if index is not None:
            return Ref(False, index)
        index = self.made.get(id(value))
        return Ref(True, index) if index is not None else None

    def note(self, func: OpOverload, args: Any, kwargs: Any, val: Any, *, dispatch: bool = False) -> None:
        """`func` recorded on `args`, `kwargs`, giving `val`; `dispatch` when a replay must record
        it the recording's way (an alias the recorder drops)."""
        if not self.ok:
            return
        try:
            mapped = _refs(self, (args, kwargs))
        except _Unkeyed:
            self.ok = False
            return
        parts = val if isinstance(val, (tuple, list)) else (val,) if val is not None else ()
        for part in parts:
            if not _replayable(part):
                self.ok = False
                return
            self.made[id(part)] = self.count
            self.count += 1
        results = tuple(parts) if isinstance(val, (tuple, list)) else val
        dispatch = dispatch or any(not _at_start(part) for part in parts)
        self.ops.append(Made(func, mapped[0], mapped[1], results, dispatch))

    def finish(self, val: Any) -> None:
        if not self.ok:
            return
        try:
            self.returned = _refs(self, val)
        except _Unkeyed:
            self.ok = False


class _Unkeyed(Exception):
    """Something a key or a recording cannot stand for exactly."""


def _refs(tape: Tape, value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        found = tape.ref(value)
        if found is None:
            raise _Unkeyed
        return found
    if isinstance(value, (_PLAIN, torch.SymInt)):
        return value
    if type(value) is tuple:
        return tuple([_refs(tape, v) for v in value])
    if type(value) is list:
        return [_refs(tape, v) for v in value]
    if type(value) is dict:
        return {k: _refs(tape, v) for k, v in value.items()}
    raise _Unkeyed


def _replayable(value: Any) -> bool:
    """A fake tensor whose metadata is all there is to it: no constant, no autograd state, sizes
    known before it runs."""
    return (
        isinstance(value, FakeTensor) and value.constant is None and not value.requires_grad
        and not unbacked_sizes(value)
    )


def _at_start(value: torch.Tensor) -> bool:
    """No storage offset: `fresh_like` can make it (a view further into a storage it cannot)."""
    offset = value.storage_offset()
    return type(offset) is int and offset == 0


def _expr(size: Any) -> Hashable:
    return ("s", size.node.expr) if isinstance(size, torch.SymInt) else size


def _tensor_key(value: torch.Tensor) -> Hashable:
    if not _replayable(value):
        raise _Unkeyed
    return (
        value.dtype, value.device, value.layout,
        tuple([_expr(s) for s in value.shape]), tuple([_expr(s) for s in value.stride()]),
        _expr(value.storage_offset()),
    )


_ATEN = torch.ops.aten
_SHAPE_FREE: frozenset[OpOverload] = frozenset({
    _ATEN.conv1d.default, _ATEN.conv2d.default, _ATEN.conv3d.default, _ATEN.batch_norm.default,
})
"""Ops whose decomposition makes the same ops with the same non-tensor arguments whatever the sizes
of inputs of one rank (torch's convolutions branch on the rank alone, batch norm on training, its
flags and an empty input): remembered by each input's rank and which of its sizes are 0, 1 or
more (`_class_key`), not by its sizes, and replayed with values computed anew. A recording whose
ops take an integer the node's own arguments do not hold (a size it computed) is not kept so."""


def _class_key(value: torch.Tensor) -> Hashable:
    if not _replayable(value) or not all(type(d) is int for d in value.shape):
        raise _Unkeyed
    strides = value.stride()
    order = tuple(sorted(range(len(strides)), key=lambda d: (-strides[d], d)))  # (the memory format)
    return (value.dtype, value.device, value.layout, tuple([min(d, 2) for d in value.shape]), order)


def _ints(value: Any) -> set[int]:
    """The integers in `value` (its lists, tuples and dicts walked), booleans aside."""
    found: set[int] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if type(v) is int:
            found.add(v)
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
    return found


def _sizes_free(tape: Tape, args: Any, kwargs: Any) -> bool:
    """No op of `tape` takes an integer other than 0, 1 and those of the node's own arguments."""
    own = _ints((args, kwargs)) | {0, 1}
    return all(_ints((op.args, op.kwargs)) <= own for op in tape.ops)


def node_key(
    func: OpOverload, args: Any, kwargs: Any, extra: Hashable, role: Callable[[torch.Tensor], Hashable] = lambda _: None,
    *, generic: bool = False,
) -> tuple[Hashable, dict[int, int]] | None:
    """The memo key of decomposing `func` on `args`, `kwargs` (with the caller's `extra`, and each
    tensor input's `role` beside its metadata), and each distinct tensor input's index by id;
    None when some argument cannot be keyed exactly."""
    inputs: dict[int, int] = {}
    metas: list[Hashable] = []

    def walk(value: Any) -> Hashable:
        if isinstance(value, torch.Tensor):
            index = inputs.get(id(value))
            if index is None:
                index = inputs[id(value)] = len(inputs)
                metas.append(((_class_key if generic else _tensor_key)(value), role(value)))
            return ("t", index)
        if isinstance(value, torch.SymInt):
            if value.node.maybe_as_int() is not None:
                return ("i", int(value))
            return ("s", value.node.expr)
        if isinstance(value, (torch.SymFloat, torch.SymBool)):
            raise _Unkeyed
        if isinstance(value, _PLAIN):
            return (type(value), repr(value))  # (repr: -0.0 and nan as themselves)
        if isinstance(value, (tuple, list)):  # (torch.Size and FX's immutable_list too: by type)
            return (type(value), tuple([walk(v) for v in value]))
        raise _Unkeyed  # a dict, anything else: not remembered

    try:
        shape = (walk(tuple(args)), tuple((k, walk(v)) for k, v in kwargs.items()))
    except _Unkeyed:
        return None
    return (func, extra, generic, shape, tuple(metas)), inputs


def fresh_like(template: torch.Tensor) -> torch.Tensor:
    """A new fake tensor of `template`'s metadata (its sizes' expressions too; no storage offset)
    in its fake mode, sharing nothing with it, made without a dispatch through the fake mode."""
    fake = cast(FakeTensor, template)  # (a Tape keeps only fake tensors: _replayable)
    return _fake(fake.fake_mode, fake.shape, fake.stride(), fake.dtype, fake.device)


def _fake(fake_mode: Any, shape: Any, stride: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    with _disable_current_modes():
        return FakeTensor(fake_mode, torch.empty_strided(shape, stride, dtype=dtype, device="meta"), device)


class Recording(Protocol):
    """What `decomposed` uses of `texir.adapters.local_decompose`'s recorder (a dispatch mode)."""

    table: Mapping[Any, Callable[..., Any]]
    fake_mode: Any
    nodes: dict[int, torch.fx.Node]
    written: set[int]
    lazy: dict[int, Any]
    buffers: Any
    source: torch.fx.Node | None
    tape: Tape | None
    memo: dict[Any, Tape] | None
    context: tuple[bool, frozenset[str]]  # the decomposition table's choices (functional only? kept ops), for _REMEMBERED
    replayed: list[str]
    elide_dead: bool  # a replay may leave out what nothing reads, naming it only (its graph's dead code is removed)
    graph: torch.fx.Graph

    def in_place_source(self) -> bool: ...

    def record(
        self, func: OpOverload, args: Any, kwargs: Any, *, whole: bool = False, known: object = None,
        given: bool = False, live: tuple[bool, ...] | None = None,
    ) -> Any: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any, /) -> Any: ...


def decomposed(
    rec: Recording, target: OpOverload, args: Any, kwargs: Any, in_place: bool, own: Any = None
) -> Any:
    """`target`'s decomposition on `args`, `kwargs` recorded; replayed when an earlier node of the
    same key recorded one. `own`: the node's own value, when its inputs hold the program's own
    values (a replay by rank whose one op gives the node's result takes it, without a dispatch)."""
    memo = rec.memo if rec.memo is not None else {}
    keyed = None
    generic = target in _SHAPE_FREE
    if rec.memo is not None and _plain_inputs(rec, args, kwargs):
        extra, role = (in_place, rec.in_place_source()), functools.partial(_buffer_role, rec)
        keyed = node_key(target, args, kwargs, extra, role, generic=generic) if generic else None
        if keyed is None:
            generic = False
            keyed = node_key(target, args, kwargs, extra, role)
    portable = False
    if keyed is not None:
        found = memo.get(keyed[0])
        if found is not None:
            if rec.source is not None:
                rec.replayed.append(rec.source.name)
            return _replay(rec, found, keyed[1], args, kwargs, own)
        portable = _static(args, kwargs)
        found = _REMEMBERED.get((rec.context, torch.get_default_dtype(), keyed[0])) if portable else None
        if found is not None:  # an earlier lowering's: this program's later nodes replay it as their own
            memo[keyed[0]] = found
            return _replay(rec, found, keyed[1], args, kwargs, own)
        rec.tape = Tape(keyed[1], generic=generic)
    decomposition = rec.table.get(target)
    try:
        with rec.fake_mode, rec, torch.no_grad(), enable_python_dispatcher():
            val = decomposition(*args, **kwargs) if decomposition is not None else target(*args, **kwargs)
        tape = rec.tape
    finally:
        rec.tape = None
    if keyed is not None and tape is not None:
        tape.finish(val)
        if tape.ok and (not tape.generic or _sizes_free(tape, args, kwargs)):
            memo[keyed[0]] = tape
            kept = _portable(tape) if portable else None
            if kept is not None:
                with _LOCK:
                    if len(_REMEMBERED) >= _LIMIT:
                        _REMEMBERED.clear()
                    _REMEMBERED[(rec.context, torch.get_default_dtype(), keyed[0])] = kept
    return val


_REMEMBERED: dict[Hashable, Tape] = {}
"""(recorder context, default dtype, node key) -> a recording of static sizes, kept for the
process's later lowerings (`_portable`)."""
_LIMIT = 4096
"""Recordings kept before `_REMEMBERED` starts afresh."""
_LOCK = threading.Lock()


def forget_recordings() -> None:
    """Drop the recordings the process remembers (each lowering records again what it decomposes)."""
    with _LOCK:
        _REMEMBERED.clear()


def _static(args: Any, kwargs: Any) -> bool:
    """No symbolic size among the arguments, the tensors' sizes, strides and offsets included:
    what a node key holds is then the same in any program (a symbol is its program's own)."""
    for leaf in leaves(args, kwargs):
        if isinstance(leaf, torch.Tensor):
            if not all(type(n) is int for n in (*leaf.shape, *leaf.stride(), leaf.storage_offset())):
                return False
        elif isinstance(leaf, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return False
    return True


def _portable(tape: Tape) -> Tape | None:
    """`tape` with each result its metadata (`Result`: its sizes static, on the CPU),
    for another lowering to replay; None when something in it belongs to this one (a symbolic
    size, a result elsewhere than on the CPU)."""
    ops = []
    for op in tape.ops:
        if any(isinstance(leaf, (torch.SymInt, torch.SymFloat, torch.SymBool)) for leaf in leaves(op.args, op.kwargs)):
            return None
        parts = op.results if isinstance(op.results, tuple) else () if op.results is None else (op.results,)
        metas = []
        for part in parts:
            if not isinstance(part, torch.Tensor):  # (only recordings made here are kept)
                return None
            shape, stride = tuple(part.shape), tuple(part.stride())
            if part.device.type != "cpu" or not all(type(n) is int for n in (*shape, *stride)):
                return None
            metas.append(Result(shape, stride, part.dtype))
        results = tuple(metas) if isinstance(op.results, tuple) else metas[0] if metas else None
        ops.append(Made(op.func, op.args, op.kwargs, results, op.dispatch))
    return Tape({}, generic=tape.generic, ops=ops, returned=tape.returned)


def _plain_inputs(rec: Recording, args: Any, kwargs: Any) -> bool:
    """Every tensor input holds a node's value that no in-place op wrote and that is not waiting to
    be made where it is read: what the recorder does with them depends on their metadata and
    their `_buffer_role` only."""
    for leaf in leaves(args, kwargs):
        if isinstance(leaf, torch.Tensor):
            if id(leaf) not in rec.nodes or id(leaf) in rec.written or id(leaf) in rec.lazy:
                return False
    return True


def _buffer_role(rec: Recording, value: torch.Tensor) -> Hashable:
    """Whether `value` is a buffer's value or a view of one: a view the recorder makes of such a
    value is noted as the buffer's, and a recording that made one is not kept, so which buffer
    does not matter."""
    node = rec.nodes[id(value)]
    return (node in rec.buffers.holder, node in rec.buffers.views)


def _replay(rec: Recording, tape: Tape, inputs: Mapping[int, int], args: Any, kwargs: Any, own: Any = None) -> Any:
    """The ops `tape` recorded made again on this node's inputs: the same nodes, names and
    metadata the recording would give, with fresh fake values (by rank: computed, or `own` for a
    single op whose one result the node returns: the export computed the node's value with the
    same kernels on the same metadata)."""
    single = (
        tape.generic and isinstance(own, torch.Tensor) and len(tape.ops) == 1
        and tape.returned == Ref(True, 0) and isinstance(tape.ops[0].results, (torch.Tensor, Result))
        and not tape.ops[0].dispatch
    )
    held: list[Any] = [None] * len(inputs)  # this node's inputs, by their index in the recording
    for leaf in leaves(args, kwargs):
        if isinstance(leaf, torch.Tensor):
            held[inputs[id(leaf)]] = leaf
    made: list[Any] = []

    def value(ref: Ref) -> Any:
        return made[ref.index] if ref.made else held[ref.index]

    unread = _unread(tape) if rec.elide_dead else None
    for i, op in enumerate(tape.ops):
        results = op.results
        live = None
        if unread is not None and unread[i] is not None:
            plan = unread[i]
            if plan == "dead":  # dead code once the graph is done: only named, as its node and getitems would be
                names = rec.graph._graph_namespace
                names.create_name(rec.graph._target_to_str(op.func.overloadpacket.__name__), None)
                count = len(results) if isinstance(results, tuple) else 1
                for _ in range(count if isinstance(results, tuple) else 0):
                    names.create_name("getitem", None)
                made.extend([None] * count)
                continue
            live = plan
        op_args, op_kwargs = map_leaves(Ref, value, (op.args, op.kwargs))
        # By rank, an op's value is computed anew, but for the node's own result and for an op
        # taking no tensor (a factory: its recorded arguments hold no size of the inputs)
        by_rank = tape.generic and any(isinstance(leaf, Ref) for leaf in leaves(op.args, op.kwargs))
        if single:
            val = rec.record(op.func, op_args, op_kwargs, known=own, given=True)
        elif op.dispatch or by_rank:  # (a view into a larger storage, or other sizes: values computed)
            val = rec.record(op.func, op_args, op_kwargs, live=live)
        elif isinstance(results, tuple):
            fresh = tuple(_fresh(r, rec.fake_mode) for r in results)
            val = rec.record(op.func, op_args, op_kwargs, known=fresh, given=True, live=live)
        else:
            known = _fresh(results, rec.fake_mode) if results is not None else None
            val = rec.record(op.func, op_args, op_kwargs, known=known, given=True)
        if isinstance(val, (tuple, list)):
            made.extend(val)
        elif val is not None:
            made.append(val)
    return map_leaves(Ref, value, tape.returned)


def _fresh(template: torch.Tensor | Result, fake_mode: Any) -> torch.Tensor:
    """A new fake tensor of `fake_mode` with `template`'s metadata: a recorded result (a fake
    tensor of this lowering's, or the metadata of a recording the process kept, on the CPU)."""
    if isinstance(template, torch.Tensor):
        return fresh_like(template)
    return _fake(fake_mode, template.shape, template.stride, template.dtype, torch.device("cpu"))


_Unread = tuple[bool, ...] | Literal["dead"] | None


def _unread(tape: Tape) -> list[_Unread]:
    """For each op of `tape`: "dead" when no later op nor the node reads any of its results and
    it is pure and not dispatched (the empty `reserve` tensor batch norm's decomposition makes: an
    alias the recorder drops makes no node, so a dispatched op is never left out); for a
    multi-result op some of whose results are read, which are; else None."""
    if tape.unread is None:
        flat = [*leaves((tape.returned,), {}), *(leaf for op in tape.ops for leaf in leaves(op.args, op.kwargs))]
        read = {leaf.index for leaf in flat if isinstance(leaf, Ref) and leaf.made}
        plan: list[_Unread] = []
        start = 0
        for op in tape.ops:
            results = op.results
            count = 0 if results is None else len(results) if isinstance(results, tuple) else 1
            flags = tuple(start + k in read for k in range(count))
            start += count
            if count and not any(flags) and not op.dispatch and not is_impure(op.func):
                plan.append("dead")
            elif isinstance(results, tuple) and not all(flags):
                plan.append(flags)
            else:
                plan.append(None)
        tape.unread = plan
    return tape.unread
