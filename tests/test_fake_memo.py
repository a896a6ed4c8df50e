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


def _batch_norm_inputs(mode: FakeTensorMode, case: tuple[object, ...]) -> tuple[object, ...]:
    shape, dtype, stats_dtype, layout, affine = case
    assert isinstance(shape, tuple) and isinstance(dtype, torch.dtype) and isinstance(stats_dtype, torch.dtype)
    channels = shape[1]
    with mode:
        x = torch.empty(shape, dtype=dtype)
        if layout == "channels_last":
            x = x.to(memory_format=torch.channels_last if len(shape) == 4 else torch.channels_last_3d)
        elif layout == "transposed":
            x = torch.empty(tuple(reversed(shape)), dtype=dtype).permute(*reversed(range(len(shape))))
        elif layout == "odd_strides":  # contiguous, but a size-1 dimension's stride is not the usual one
            x = torch.empty_strided(shape, [7 if n == 1 else s for n, s in zip(shape, torch.empty(shape).stride())],
                                    dtype=dtype)
        weight = torch.empty(channels, dtype=stats_dtype) if affine else None
        bias = torch.empty(channels, dtype=stats_dtype) if affine else None
        mean, var = torch.empty(channels, dtype=stats_dtype), torch.empty(channels, dtype=stats_dtype)
    return (x, weight, bias, mean, var, 0.1, 1e-5)


def test_batch_norm_rule_gives_the_metadata_of_the_fake_dispatch() -> None:
    """The rules for `_native_batch_norm_legit_no_training` and `hardtanh` against the fake mode's
    own dispatch, over ranks, dtypes, memory formats, size-1 dimensions (and their strides) and
    optional affine parameters."""
    op = torch.ops.aten._native_batch_norm_legit_no_training.default
    cases = [
        (shape, dtype, stats, layout, affine)
        for shape in [(1, 16, 7, 7), (2, 3, 4, 4), (4, 8), (2, 5, 9), (1, 1280, 1, 1), (2, 3, 2, 4, 4), (3, 1, 1, 5)]
        for dtype, stats in [(torch.float32, torch.float32), (torch.float16, torch.float32),
                             (torch.float16, torch.float16), (torch.bfloat16, torch.float32)]
        for layout in ["contiguous", "channels_last", "transposed", "odd_strides"]
        for affine in [True, False]
        if layout != "channels_last" or len(shape) in (4, 5)
    ]
    for case in cases:
        mode = FakeTensorMode()
        args = _batch_norm_inputs(mode, case)
        _assert_rule_matches(op, args, mode, case)
        relu6 = (args[0], 0.0, 6.0)
        if case[1] != torch.bfloat16 or case[2] == torch.float32:  # (one dtype case per input dtype)
            _assert_rule_matches(torch.ops.aten.hardtanh.default, relu6, mode, case)


def _assert_rule_matches(op: torch._ops.OpOverload, args: tuple[object, ...], mode: FakeTensorMode,
                         case: object) -> None:
    ruled = fake_memo._by_rule(op, args, {}, mode)
    with mode, torch.no_grad():
        dispatched = op(*args)
    if ruled is None:  # declined: only where the rule says it does (strides not those of a new tensor)
        assert op == torch.ops.aten.hardtanh.default, case
        assert isinstance(args[0], torch.Tensor) and args[0].stride() != torch.empty(args[0].shape).stride(), case
        return
    ruled_all = ruled if isinstance(ruled, tuple) else (ruled,)
    dispatched_all = dispatched if isinstance(dispatched, tuple) else (dispatched,)
    assert [_meta(t) for t in ruled_all] == [_meta(t) for t in dispatched_all], case
    assert all(isinstance(t, FakeTensor) and t.fake_mode is mode for t in ruled_all)


def test_batch_norm_rule_declines_what_it_does_not_cover() -> None:
    op = torch.ops.aten._native_batch_norm_legit_no_training.default
    mode = FakeTensorMode()
    args = _batch_norm_inputs(mode, ((2, 3, 4, 4), torch.float32, torch.float32, "contiguous", True))
    assert fake_memo._by_rule(op, args, {"eps": 1e-3}, mode) is None  # keyword arguments: dispatched
    assert fake_memo._by_rule(torch.ops.aten.add.Tensor, args[:2], {}, mode) is None  # no rule
    with mode:
        integers = torch.empty(2, 3, dtype=torch.int32)
    assert fake_memo._by_rule(torch.ops.aten.hardtanh.default, (integers, 0, 6), {}, mode) is None
