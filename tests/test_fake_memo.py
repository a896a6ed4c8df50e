"""texir.adapters.fake_memo: remembered fake results have the metadata a dispatch gives, and only
what cannot differ is remembered."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from texir.adapters import fake_memo


def _meta(t: torch.Tensor) -> tuple[object, ...]:
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.device, t.requires_grad)


def test_a_second_call_makes_fresh_tensors_of_the_dispatched_metadata() -> None:
    mode = FakeTensorMode()
    with mode:
        x = torch.empty(2, 3, 8, 8).to(memory_format=torch.channels_last)
        w = torch.empty(4, 3, 3, 3)
    op = torch.ops.aten.convolution.default
    args = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    fake_memo._memo.clear()
    first = fake_memo.fake_result(op, args, {}, mode)
    assert len(fake_memo._memo) == 1
    dispatches: list[object] = []
    original = FakeTensorMode.dispatch

    def counted(self: FakeTensorMode, *a: object, **k: object) -> object:
        dispatches.append(a[0])
        return original(self, *a, **k)  # type: ignore[arg-type]  # forwarding torch's own arguments

    FakeTensorMode.dispatch = counted  # type: ignore[method-assign]  # counting dispatches in this test
    try:
        second = fake_memo.fake_result(op, args, {}, mode)
    finally:
        FakeTensorMode.dispatch = original  # type: ignore[method-assign]  # restored
    assert dispatches == []
    assert isinstance(second, FakeTensor) and second.fake_mode is mode
    assert second is not first
    assert _meta(second) == _meta(first)
    assert second.is_contiguous(memory_format=torch.channels_last)


def test_multi_result_ops_are_remembered_as_tuples() -> None:
    mode = FakeTensorMode()
    with mode:
        x, w, b, m, v = torch.empty(2, 3, 4, 4), torch.empty(3), torch.empty(3), torch.empty(3), torch.empty(3)
    op = torch.ops.aten._native_batch_norm_legit_no_training.default
    args = (x, w, b, m, v, 0.1, 1e-5)
    first = fake_memo.fake_result(op, args, {}, mode)
    second = fake_memo.fake_result(op, args, {}, mode)
    assert isinstance(second, tuple) and len(second) == len(first) == 3
    assert [_meta(t) for t in second] == [_meta(t) for t in first]


def test_views_and_symbolic_sizes_are_not_remembered() -> None:
    mode = FakeTensorMode()
    with mode:
        x = torch.empty(4, 6)
    fake_memo._memo.clear()
    view = fake_memo.fake_result(torch.ops.aten.view.default, (x, [6, 4]), {}, mode)
    assert view.untyped_storage()._cdata == x.untyped_storage()._cdata  # still x's storage
    assert fake_memo._memo == {}
    assert fake_memo._key(torch.ops.aten.add.Tensor, (x, object()), {}) is None


def test_a_weight_is_detached_once_while_it_lives() -> None:
    mode = FakeTensorMode()
    with mode:
        weight = torch.empty(3, 3, requires_grad=True)
    first = fake_memo.detached(weight, mode)
    assert not first.requires_grad and _meta(first)[:5] == _meta(weight)[:5]
    assert fake_memo.detached(weight, mode) is first
