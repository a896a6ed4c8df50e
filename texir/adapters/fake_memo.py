"""Fake-tensor results `texir.adapters.local_decompose` records, remembered by the metadata they
depend on: a second lowering of the same model runs no operator's shape function again."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any, cast

import torch
from torch._ops import OpOverload
from torch._prims_common import make_contiguous_strides_for
from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager
from torch.utils._python_dispatch import _disable_current_modes

from texir.adapters.node_replay import fresh_like
from texir.adapters.op_args import leaves

__all__ = ["detached", "fake_result"]

_LIMIT = 8192
"""Entries kept before the memo starts afresh (each a few tuples of ints)."""

_PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)

_Meta = tuple[tuple[int, ...], tuple[int, ...], torch.dtype, torch.device]

_memo: dict[Hashable, tuple[bool, tuple[_Meta, ...]]] = {}
_lock = threading.Lock()
_detached: dict[int, tuple[weakref.ref[torch.Tensor], torch.Tensor]] = {}


def detached(value: torch.Tensor, fake_mode: Any) -> torch.Tensor:
    """`value.detach()` under `fake_mode` (a weight's fake value without autograd state, as the
    retrace computes with it), the same tensor each time `value` is asked for while it lives: a
    second lowering of a program dispatches none of its weights again."""
    found = _detached.get(id(value))
    if found is not None and found[0]() is value:
        return found[1]
    meta = _meta(value)
    if meta is not None and cast(FakeTensor, value).fake_mode is fake_mode:
        # a new fake tensor of its metadata, made without a dispatch (a tenth of the cost): a
        # weight's value is only read, so what it would alias does not show
        made = fresh_like(value)
    else:
        with fake_mode:
            made = value.detach()
    with _lock:
        if len(_detached) >= _LIMIT:
            _detached.clear()
        _detached[id(value)] = (weakref.ref(value), made)
    return made


def fake_result(func: OpOverload, args: Any, kwargs: Any, fake_mode: Any) -> Any:
    """`func` on `args`, `kwargs` under `fake_mode`, without autograd state (as the retrace's
    values); from the memo when an earlier call on inputs of the same metadata gave fresh, plain
    tensors: new fake tensors of its results' shapes, strides, dtypes and devices. Only for
    functional ops whose results alias no input, on static shapes and inputs without tracked
    constants, so nothing else can differ."""
    key = _key(func, args, kwargs)
    found = _memo.get(key) if key is not None else None
    if found is not None:
        several, metas = found
        # A fake tensor straight from its meta storage: a tenth of the cost of a dispatch, even of
        # empty_strided's, through the fake mode (made with no mode on: a recorder's dispatch runs
        # under the fake mode).
        with _disable_current_modes():
            made = tuple(
                FakeTensor(fake_mode, torch.empty_strided(shape, stride, dtype=dtype, device="meta"), device)
                for shape, stride, dtype, device in metas
            )
        return made if several else made[0]
    val = _by_rule(func, args, kwargs, fake_mode) if key is not None else None
    if val is None:
        val = _by_meta_kernel(func, args, kwargs, fake_mode)
    if val is None:
        with fake_mode, torch.no_grad():
            val = func(*args, **kwargs)
    if key is not None:
        several = isinstance(val, tuple)
        parts = val if several else (val,)
        made_metas = [m for m in map(_meta, parts) if m is not None]
        if len(made_metas) == len(parts):
            with _lock:
                if len(_memo) >= _LIMIT:
                    _memo.clear()
                _memo[key] = (several, tuple(made_metas))
    return val


def _on_meta(value: Any) -> Any:
    """`value` with each fake tensor (static metadata, as `_key` admits) a plain meta tensor of
    its sizes, strides and dtype."""
    if isinstance(value, FakeTensor):
        return torch.empty_strided(tuple(value.shape), tuple(value.stride()), dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_on_meta(v) for v in value)
    return value


def _contiguous_like(value: FakeTensor) -> torch.Tensor | None:
    """A meta tensor of `value`'s sizes, strides and dtype when `value` has the strides of a new
    contiguous tensor (an elementwise result over it is then laid out so), else None: where a
    size-1 dimension has another stride, torch's ops do not agree on the result's."""
    shape = tuple(value.shape)
    if tuple(value.stride()) != tuple(make_contiguous_strides_for(shape)):
        return None
    return torch.empty(shape, dtype=value.dtype, device="meta")


def _batch_norm_no_training(args: Any, kwargs: Any) -> tuple[torch.Tensor, ...] | None:
    """`_native_batch_norm_legit_no_training` on a CPU tensor: an output of the input's sizes and
    dtype laid out as an elementwise result over it (torch's own decomposition, run on plain meta
    tensors, where the input is not contiguous), and the two statistics it returns on CPU, empty
    tensors of the input's dtype (on meta tensors the decomposition returns other statistics, so
    these are the rule's own)."""
    if kwargs or len(args) != 7 or not isinstance(args[0], FakeTensor) or args[0].device.type != "cpu":
        return None
    output = _contiguous_like(args[0])
    if output is None:
        output = torch.ops.aten._native_batch_norm_legit_no_training.default(*_on_meta(tuple(args)))[0]
    empty = torch.empty((0,), dtype=args[0].dtype, device="meta")
    return output, empty, empty.clone()


def _hardtanh(args: Any, kwargs: Any) -> tuple[torch.Tensor, ...] | None:
    """`hardtanh` (ReLU6) of a contiguous floating-point tensor: a contiguous tensor of its sizes
    and dtype."""
    if kwargs or not args or not isinstance(args[0], FakeTensor) or not args[0].dtype.is_floating_point:
        return None
    if not all(isinstance(a, (int, float)) for a in args[1:]):
        return None
    output = _contiguous_like(args[0])
    return None if output is None else (output,)


def _convolution(args: Any, kwargs: Any) -> tuple[torch.Tensor, ...] | None:
    """`convolution` of a CPU input and weight (and bias) laid out as new contiguous tensors: the
    meta kernel's output sizes, contiguous (the fake mode's rule lays the meta kernel's output out
    in the memory format of the CPU backend it picks, contiguous for such inputs)."""
    if kwargs or len(args) != 9:
        return None
    tensors = [a for a in args[:3] if a is not None]
    if not all(isinstance(t, FakeTensor) and t.device.type == "cpu" and _new_contiguous(t) for t in tensors):
        return None
    if len(tensors) < 2 or args[0].dim() not in (3, 4, 5):
        return None
    try:
        out = torch.ops.aten.convolution.default(*_on_meta(tuple(args)))
    except Exception:  # noqa: BLE001 - the fake mode's dispatch gives torch's own error for it
        return None
    return (torch.empty(tuple(out.shape), dtype=out.dtype, device="meta"),)


_RULES: dict[OpOverload, Callable[[Any, Any], tuple[torch.Tensor, ...] | None]] = {
    torch.ops.aten._native_batch_norm_legit_no_training.default: _batch_norm_no_training,
    torch.ops.aten.hardtanh.default: _hardtanh,
    torch.ops.aten.convolution.default: _convolution,
}
"""Ops whose only shape function is Python (a decomposition, a reference, the fake mode's own
rule), run through the fake mode op by op (batch norm: about 8 ms a call; a convolution about
0.7 ms): their results' metadata made here instead. A rule
returns plain meta tensors, or None to leave the op to the fake mode; tests/test_fake_memo.py
compares each with the fake mode's dispatch."""


def _by_rule(func: OpOverload, args: Any, kwargs: Any, fake_mode: Any) -> Any:
    """`func`'s fake results from its entry in `_RULES` (None when it has none or declines)."""
    rule = _RULES.get(func)
    if rule is None:
        return None
    with _disable_current_modes(), torch.no_grad():
        metas = rule(args, kwargs)
        if metas is None:
            return None
        device = args[0].device
        made = tuple(FakeTensor(fake_mode, m, device) for m in metas)
    return made if len(made) > 1 else made[0]


_ATEN = torch.ops.aten
_META_KERNEL: frozenset[OpOverload] = frozenset({
    _ATEN.permute.default, _ATEN.expand.default, _ATEN.alias.default, _ATEN.split_with_sizes.default,
    _ATEN.slice.Tensor, _ATEN.select.int, _ATEN.unsqueeze.default, _ATEN.squeeze.dims, _ATEN.clone.default,
    _ATEN.bmm.default, _ATEN.native_layer_norm.default, _ATEN.view.default, _ATEN._unsafe_view.default,
})
"""Ops whose fake result is their meta kernel's on the fake inputs themselves (static sizes, on
the CPU, no constant): what the fake mode computes for them there, without its dispatch (the cache
key, device and constant checks, and for a view its Python shape function: about 2 ms for each
new shape). Where the two part, the fake mode answers: a view to a size-1 dimension from an input
whose strides are not a new contiguous tensor's (`_view_agrees`), an expand's new size-1
dimensions, a clone of such an input under the Python dispatcher (without `contiguous_format`),
a half-precision layer norm's statistics. tests/test_fake_memo.py compares each op with the fake
mode's dispatch over ranks 0-4, sizes 1-3 and five layouts, with and without the Python
dispatcher."""

_VIEWS = frozenset({_ATEN.view.default, _ATEN._unsafe_view.default})


def _by_meta_kernel(func: OpOverload, args: Any, kwargs: Any, fake_mode: Any) -> Any:
    """`func`'s fake results from its meta kernel (None when it is not in `_META_KERNEL`, when an
    input is not a plain static fake tensor of `fake_mode` on the CPU, or when the kernel refuses
    the arguments: the fake mode then gives its own result or error)."""
    if func not in _META_KERNEL:
        return None
    flat = leaves(args, kwargs)
    inputs: list[torch.Tensor] = []
    for leaf in flat:
        if isinstance(leaf, torch.Tensor):
            if not _plain_fake(leaf, fake_mode):
                return None
            inputs.append(leaf)
        elif isinstance(leaf, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return None
    if not inputs:
        return None
    first, size = inputs[0], args[1] if len(args) > 1 else kwargs.get("size")
    if func is _ATEN.clone.default and kwargs.get("memory_format") is not torch.contiguous_format:
        if not _new_contiguous(first):
            return None  # (under the Python dispatcher a size-1 dimension keeps its stride there)
    if (func in _VIEWS and not _view_agrees(first, size)) or (func is _ATEN.expand.default and not _expand_agrees(first, size)):
        return None
    if func is _ATEN.native_layer_norm.default and first.dtype != torch.float32:
        return None  # (the fake mode's statistics keep a half input's dtype; the meta kernel's are float)
    try:
        with _disable_current_modes(), in_kernel_invocation_manager(fake_mode), torch.no_grad():
            out = func(*args, **kwargs)
    except Exception:  # noqa: BLE001 - the fake mode's dispatch gives torch's own error for it
        return None
    parts = out if isinstance(out, (tuple, list)) else (out,)
    if not all(isinstance(p, torch.Tensor) and p.device.type == "meta" for p in parts):
        return None
    if any(p is i for p in parts for i in inputs):
        return None  # (an input handed back: the fake mode's to wrap)
    made = [FakeTensor(fake_mode, p, first.device) for p in parts]
    if isinstance(out, list):  # (a Tensor[] result is a list, as the fake mode gives it)
        return made
    return tuple(made) if isinstance(out, tuple) else made[0]


def _new_contiguous(value: torch.Tensor) -> bool:
    """The strides of a new contiguous tensor of `value`'s sizes."""
    return tuple(value.stride()) == tuple(make_contiguous_strides_for(value.shape))


def _view_agrees(value: torch.Tensor, size: Any) -> bool:
    """`value`'s strides are a new contiguous tensor's, or `size` (its -1 resolved) has no
    dimension of size 0 or 1: torch's Python reshape helper and the meta kernel agree there."""
    if _new_contiguous(value):
        return True
    if not isinstance(size, (list, tuple)) or not all(type(d) is int for d in size):
        return False
    known = 1
    for d in size:
        known *= d if d != -1 else 1
    if known <= 0:
        return False
    resolved = [value.numel() // known if d == -1 else d for d in size]
    return all(d > 1 for d in resolved)


def _expand_agrees(value: torch.Tensor, size: Any) -> bool:
    """No new leading dimension of size 1 (the fake mode gives it stride 0, the meta kernel not)."""
    if not isinstance(size, (list, tuple)):
        return False
    return all(d != 1 for d in size[: len(size) - value.dim()])


def _plain_fake(value: torch.Tensor, fake_mode: Any) -> bool:
    if not isinstance(value, FakeTensor) or value.fake_mode is not fake_mode or value.constant is not None:
        return False
    if value.device.type != "cpu" or value.requires_grad:
        return False
    return all(type(n) is int for n in (*value.shape, *value.stride(), value.storage_offset()))


def _key(func: OpOverload, args: Any, kwargs: Any) -> Hashable | None:
    schema = func._schema
    if schema.is_mutable or any(r.alias_info is not None for r in schema.returns) or not schema.returns:
        return None
    try:
        return (func, _shape_of(args), tuple((name, _shape_of(v)) for name, v in kwargs.items()))
    except _NotRemembered:
        return None


class _NotRemembered(Exception):
    """An argument the memo does not key on."""


def _shape_of(value: Any) -> Hashable:
    """`value` as a key: a tensor by its metadata, a plain value by its type and repr, lists and
    tuples (their type too: torch.Size) by their items (a walk of its own: pytree's costs several
    times more)."""
    if isinstance(value, torch.Tensor):
        meta = _meta(value)
        if meta is None or value.requires_grad:
            raise _NotRemembered
        return meta
    if isinstance(value, _PLAIN):
        return (type(value), repr(value))  # (repr: -0.0 and nan as themselves)
    if isinstance(value, (list, tuple)):
        return (type(value), tuple([_shape_of(v) for v in value]))
    raise _NotRemembered  # a symbolic size, a dict, anything else: not remembered


def _meta(value: Any) -> _Meta | None:
    """A fake tensor's metadata, when that is all there is to it: static sizes, no storage offset,
    no constant tracked."""
    if not isinstance(value, FakeTensor) or value.constant is not None or value.storage_offset() != 0:
        return None
    shape, stride = tuple(value.shape), tuple(value.stride())
    if not all(type(n) is int for n in (*shape, *stride)):
        return None
    return shape, stride, value.dtype, value.device
