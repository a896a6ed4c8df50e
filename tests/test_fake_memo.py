"""texir.adapters.fake_memo: remembered fake results have the metadata a dispatch gives, and only
what cannot differ is remembered."""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch
from torch._dispatch.python import enable_python_dispatcher
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


def _layouts(mode: FakeTensorMode, shape: tuple[int, ...], dtype: torch.dtype) -> list[torch.Tensor]:
    """Fake tensors of `shape`: contiguous, transposed, reversed, and views starting inside a
    larger storage (sizes 1 among them: their strides are where torch's shape functions part)."""
    with mode:
        made = [torch.empty(shape, dtype=dtype)]
        if len(shape) >= 2:
            made.append(torch.empty((shape[1], shape[0], *shape[2:]), dtype=dtype).transpose(0, 1))
            made.append(torch.empty(tuple(reversed(shape)), dtype=dtype).permute(*reversed(range(len(shape)))))
        made.append(torch.empty((2, *shape), dtype=dtype)[1])
        made.append(torch.empty((*shape, 2), dtype=dtype)[..., 0])
    return made


_Case = tuple[torch._ops.OpOverload, tuple[object, ...]] | tuple[torch._ops.OpOverload, tuple[object, ...], dict[str, object]]


def _meta_kernel_cases(x: torch.Tensor, mode: FakeTensorMode) -> list[_Case]:
    aten = torch.ops.aten
    shape, rank, numel = tuple(x.shape), x.dim(), x.numel()
    cases: list[_Case] = []
    sizes = {(numel,), (1, numel), (numel, 1), (-1,), shape, (*shape, 1), (1, *shape), tuple(d for d in shape if d != 1)}
    sizes |= {tuple(d for d in p if d != 1) or (1,) for p in itertools.permutations(shape)}
    for size in sorted(sizes):
        cases += [(aten.view.default, (x, list(size))), (aten._unsafe_view.default, (x, list(size)))]
    cases += [(aten.permute.default, (x, list(p))) for p in itertools.islice(itertools.permutations(range(rank)), 6)]
    for size in [shape, tuple(-1 for _ in shape), (2, *shape), (1, *shape), tuple(3 if d == 1 else d for d in shape)]:
        cases.append((aten.expand.default, (x, list(size))))
    cases += [(aten.clone.default, (x,)), (aten.alias.default, (x,))]
    cases.append((aten.clone.default, (x,), {"memory_format": torch.contiguous_format}))
    for d in range(rank):
        cases.append((aten.split_with_sizes.default, (x, [1, shape[d] - 1] if shape[d] > 1 else [1], d)))
        cases += [(aten.slice.Tensor, (x, d, 0, 1)), (aten.slice.Tensor, (x, d, 1, 2**63 - 1))]
        cases += [(aten.unsqueeze.default, (x, d)), (aten.select.int, (x, d, 0)), (aten.squeeze.dims, (x, [d]))]
    if rank >= 1:
        with mode:
            w, b = torch.empty(shape[-1:], dtype=x.dtype), torch.empty(shape[-1:], dtype=x.dtype)
        cases.append((aten.native_layer_norm.default, (x, list(shape[-1:]), w, b, 1e-5)))
    if rank == 3:
        with mode:
            y = torch.empty((shape[0], shape[2], 2), dtype=x.dtype)
        cases.append((aten.bmm.default, (x, y)))
    return cases


@pytest.mark.parametrize("python_dispatcher", [False, True], ids=["plain", "python-dispatcher"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_meta_kernel_results_are_the_fake_dispatchs(dtype: torch.dtype, python_dispatcher: bool) -> None:
    """Every op of `_META_KERNEL`, on ranks 0-4 of sizes 1-3 (1 and 3 at rank 4) in five layouts: a result from the
    meta kernel has the metadata of the fake mode's own (shape, strides, offset, dtype, device,
    storage size), and aliases what the fake mode's aliases; where the two would part (a view's
    size-1 dimensions), or the kernel refuses, the path declines."""
    mode = FakeTensorMode()
    taken = declined = 0
    with enable_python_dispatcher() if python_dispatcher else contextlib.nullcontext():
        for rank in range(5):
            for shape in itertools.product([1, 2, 3] if rank < 4 else [1, 3], repeat=rank):
                for x in _layouts(mode, shape, dtype):
                    for case in _meta_kernel_cases(x, mode):
                        op, args = case[0], case[1]
                        kwargs: dict[str, object] = case[2] if len(case) == 3 else {}
                        assert op in fake_memo._META_KERNEL
                        got = fake_memo._by_meta_kernel(op, args, kwargs, mode)
                        try:
                            with mode, torch.no_grad():
                                want = op(*args, **kwargs)
                        except Exception:  # noqa: BLE001 - then the path must not answer either
                            assert got is None, (op, shape, x.stride())
                            continue
                        if got is None:
                            declined += 1
                            continue
                        taken += 1
                        assert type(got) is type(want)  # (a list for Tensor[], as the fake mode's)
                        got_all = got if isinstance(got, (tuple, list)) else (got,)
                        want_all = want if isinstance(want, (tuple, list)) else (want,)
                        assert [_storage_meta(t) for t in got_all] == [_storage_meta(t) for t in want_all], (op, shape, x.stride())
                        assert all(isinstance(t, FakeTensor) and t.fake_mode is mode for t in got_all)
                        shares = [t.untyped_storage()._cdata == x.untyped_storage()._cdata for t in got_all]
                        assert shares == [t.untyped_storage()._cdata == x.untyped_storage()._cdata for t in want_all]
    assert taken > 5 * declined  # (the path covers the cases; it declines what it cannot vouch for)


def _storage_meta(t: torch.Tensor) -> tuple[object, ...]:
    return (*_meta(t), t.untyped_storage().nbytes())


def test_meta_kernel_path_declines_what_it_does_not_cover() -> None:
    aten = torch.ops.aten
    mode, other = FakeTensorMode(), FakeTensorMode()
    with mode:
        x = torch.empty(2, 3)
    # a tracked constant: the fake mode may compute with its values
    constant = mode.fake_tensor_converter.from_real_tensor(mode, torch.tensor([1.0, 2.0]), make_constant=True)
    with other:
        stranger = torch.empty(2, 3)
    assert fake_memo._by_meta_kernel(aten.add.Tensor, (x, x), {}, mode) is None  # not in the set
    assert fake_memo._by_meta_kernel(aten.permute.default, (stranger, [1, 0]), {}, mode) is None
    assert constant.constant is not None
    assert fake_memo._by_meta_kernel(aten.clone.default, (constant,), {}, mode) is None
    assert fake_memo._by_meta_kernel(aten.view.default, (x, [7]), {}, mode) is None  # refused: torch's error
    with pytest.raises(RuntimeError):
        fake_memo.fake_result(aten.view.default, (x, [7]), {}, mode)


def _conv_case(mode: FakeTensorMode, case: tuple[object, ...]) -> tuple[object, ...]:
    spatial, batch, cin, cout, groups, transposed, stride, dtype, layout, bias = case
    assert isinstance(spatial, tuple) and isinstance(dtype, torch.dtype)
    rank = len(spatial)
    kernel = (3,) * rank if min(spatial) >= 3 else (1,) * rank
    with mode:
        x = torch.empty((batch, cin, *spatial), dtype=dtype)
        w_shape = (cin, cout // groups, *kernel) if transposed else (cout, cin // groups, *kernel)
        w = torch.empty(w_shape, dtype=dtype)
        if layout == "channels_last" and rank == 2:
            x = x.to(memory_format=torch.channels_last)
        elif layout == "weight_channels_last" and rank == 2:
            w = w.to(memory_format=torch.channels_last)
        elif layout == "odd_strides":  # a size-1 dimension's stride is not the usual one
            x = torch.empty_strided(x.shape, [7 if n == 1 else s for n, s in zip(x.shape, x.stride())], dtype=dtype)
        b = torch.empty(cout, dtype=dtype) if bias else None
    return (x, w, b, [stride] * rank, [1] * rank, [1] * rank, transposed, [0] * rank, groups)


def test_convolution_rule_gives_the_metadata_of_the_fake_dispatch() -> None:
    """The rule for `convolution` against the fake mode's own dispatch (its conv rule: the meta
    kernel's output in the CPU backend's memory format) over 1-, 2- and 3-D convolutions, batches
    and channels of 1, depthwise groups, transposed ones, strides, dtypes, input and weight memory
    formats and size-1 dimensions' strides; where the rule declines (inputs not laid out as new
    contiguous tensors) the fake mode answers."""
    op = torch.ops.aten.convolution.default
    cases = [
        (spatial, batch, cin, cout, groups, transposed, stride, dtype, layout, bias)
        for spatial in [(7,), (5, 6), (1, 1), (4, 1), (3, 4, 4)]
        for batch, cin, cout, groups in [(1, 3, 8, 1), (2, 1, 4, 1), (2, 4, 4, 4), (1, 6, 2, 2)]
        for transposed in (False, True)
        for stride in (1, 2)
        for dtype in (torch.float32, torch.float16, torch.bfloat16)
        for layout in ("contiguous", "channels_last", "weight_channels_last", "odd_strides")
        for bias in (True, False)
        if (dtype == torch.float32 or (layout == "contiguous" and stride == 1))
    ]
    declined = 0
    for case in cases:
        mode = FakeTensorMode()
        args = _conv_case(mode, case)
        ruled = fake_memo._by_rule(op, args, {}, mode)
        try:
            with mode, torch.no_grad():
                dispatched = op(*args)
        except RuntimeError:  # (sizes no convolution takes: torch's error, from the fake mode)
            assert ruled is None, case
            continue
        if ruled is None:
            x, w = args[0], args[1]
            assert isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor)
            assert not (fake_memo._new_contiguous(x) and fake_memo._new_contiguous(w)), case
            declined += 1
            continue
        assert _meta(ruled) == _meta(dispatched), case
        assert isinstance(ruled, FakeTensor) and ruled.fake_mode is mode
    assert 0 < declined < len(cases)
