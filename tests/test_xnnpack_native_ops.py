"""texir's native XNNPACK against ExecuTorch 1.5.1's own `.pte` on tiny models for what the zoo and
the real models do not reach: scaled dot-product attention (decomposed; ExecuTorch's
ConvertToSDPAPass never matches), ops of ExecuTorch's float configs no other model uses, and
`per_op_mode`. Each model is one ExecuTorch reference (`tests/xnnpack_oracle.py`): the same
partitions, delegates, blobs, named data and kernels, outputs bitwise equal; where ExecuTorch fails,
native fails the same way."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.xnnpack_oracle import Lowered, executorch_xnnpack, native_xnnpack, pte_view, run_pte


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def assert_native_is_executorchs(module: nn.Module, args: tuple[Any, ...], **options: Any) -> tuple[Lowered, Lowered]:
    """ExecuTorch's to_edge_transform_and_lower + to_executorch and texir's native lowering of one
    export (`options` to both partitioners): everything the .pte holds for XNNPACK is equal, and so
    are the runtime outputs, bit for bit."""
    torch.manual_seed(0)
    ep = torch.export.export(module.eval(), args, strict=False)
    et, native = executorch_xnnpack(copy.deepcopy(ep), **options), native_xnnpack(ep, **options)
    assert et.error is None, f"ExecuTorch failed: {et.error!r}"
    assert native.error is None, f"native failed: {native.error!r}"
    assert et.pte is not None and native.pte is not None
    assert native.partitions == et.partitions and et.partitions
    a, b = pte_view(et.pte), pte_view(native.pte)
    assert [d[0] for d in b.delegates] == [d[0] for d in a.delegates]
    for i, ((_, theirs), (_, mine)) in enumerate(zip(a.delegates, b.delegates, strict=True)):
        assert mine == theirs, f"delegate {i}: blob differs ({len(mine)} vs {len(theirs)} bytes)"
    assert b.named == a.named
    assert b.kernels == a.kernels
    ours, theirs_out = run_pte(native.pte, args)[0], run_pte(et.pte, args)[0]
    assert ours and len(ours) == len(theirs_out)
    for p, q in zip(ours, theirs_out, strict=True):
        assert p.dtype == q.dtype and torch.equal(p, q)
    return et, native


# -- scaled dot-product attention -----------------------------------------------------------------


@pytest.fixture
def sdpa_matches() -> Iterator[list[Any]]:
    """The subgraphs ExecuTorch's ConvertToSDPAPass replaces while the test runs."""
    from executorch.backends.xnnpack._passes.convert_to_sdpa import ConvertToSDPAPass

    found: list[Any] = []
    original = ConvertToSDPAPass.create_sdpa

    def spy(self: Any, graph_module: Any, match: Any) -> None:
        found.append(match)
        original(self, graph_module, match)

    ConvertToSDPAPass.create_sdpa = spy  # a spy for this test only
    try:
        yield found
    finally:
        ConvertToSDPAPass.create_sdpa = original


class Attention(nn.Module):
    """F.scaled_dot_product_attention on q, k, v with a 2-D float mask; with `variants`, also
    without a mask, is_causal, an explicit scale, and grouped-query attention on half the heads."""

    def __init__(self, variants: bool) -> None:
        super().__init__()
        self.variants = variants

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        sdpa = F.scaled_dot_product_attention
        if not self.variants:
            return (sdpa(q, k, v, mask),)
        return (sdpa(q, k, v, mask), sdpa(q, k, v), sdpa(q, k, v, is_causal=True), sdpa(q, k, v, mask, scale=0.5),
                sdpa(q, k[:, :1], v[:, :1], enable_gqa=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_sdpa_decomposes_and_lowers_as_executorch_does(dtype: torch.dtype, sdpa_matches: list[Any]) -> None:
    """torch 2.13 decomposes SDPA with a "safe softmax" (eq -inf, logical_not, any, full_like,
    where) that no XNNPACK config takes, so each attention splits over delegates (q's transpose;
    bmm, mask add, softmax; bmm and the output transpose) around portable kernels; native gives the
    same delegates. ExecuTorch's ConvertToSDPAPass never fires inside a partition."""
    g = _g(7)
    q, k, v = (torch.randn(1, 2, 8, 16, generator=g).to(dtype) for _ in range(3))
    mask = torch.randn(8, 8, generator=g).to(dtype)
    et, _ = assert_native_is_executorchs(Attention(variants=dtype == torch.float32), (q, k, v, mask))
    assert not sdpa_matches
    delegated = {op.split("[")[0] for part in et.partitions for op in part}
    assert "aten::bmm.default" in delegated and "aten::_softmax.default" in delegated
    assert not delegated & {"aten::eq.Scalar", "aten::any.dim", "aten::where.self", "aten::logical_not.default"}


def test_executorchs_sdpa_patterns_hold_ops_no_xnnpack_config_takes(sdpa_matches: list[Any]) -> None:
    """Why ConvertToSDPAPass cannot fire with torch 2.13: each of its patterns (made by the same
    torch) holds safe-softmax ops that neither ExecuTorch's configs nor native's checks take, and
    the pass only sees the nodes of one XNNPACK partition. So native needs no SDPA rule and writes
    no XNNScaledDotProductAttention node (ExecuTorch 1.5.1 has no visitor for one either)."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    from executorch.backends.xnnpack.partition.graphs import sdpa
    from executorch.exir.backend.canonical_partitioners.config_partitioner import format_target_name

    from texir.adapters.targets import canonical_target
    from texir.backends.xnnpack.ops import CHECKS

    configs = {c.target_name for c in ALL_PARTITIONER_CONFIGS}
    patterns = sdpa.get_graphs()
    assert len(patterns) == 2  # fp32 and fp16, each with a 2-D mask
    for pattern in patterns:
        calls = [n.target for n in pattern.graph.nodes if n.op == "call_function"]
        untaken = {format_target_name(t.__name__) for t in calls} - configs
        assert {"eq.Scalar", "logical_not.default", "any.dim", "where.self", "full_like.default"} <= untaken
        native = {canonical_target(getattr(t, "_op", t)) for t in calls}
        assert "aten::eq.Scalar" in native and not {"aten::eq.Scalar", "aten::any.dim", "aten::where.self"} & set(CHECKS)


# -- float ops of ExecuTorch's configs no zoo or real model reaches ----------------------------------


class UnaryAndPools(nn.Module):
    """abs, ceil, floor, log, sqrt, maximum, minimum; avg pools (with and without padding) and max
    pools (ceil_mode, dilation) after a convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor, image: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = torch.abs(x) + 0.5
        z = self.conv(image)
        return (torch.ceil(x), torch.floor(x), torch.log(a), torch.sqrt(a), torch.maximum(x, y), torch.minimum(x, y),
                F.avg_pool2d(z, 2), F.avg_pool2d(z, 3, 1, 1, count_include_pad=False),
                F.max_pool2d(z, 3, 2, ceil_mode=True), F.max_pool2d(z, 2, 1, 0, 2))


class BatchNorms(nn.Module):
    """Batch norms: after a linear (folded into it), on NCL and NCHW tensors after a mul (each a
    depthwise convolution), and one without affine parameters."""

    def __init__(self) -> None:
        super().__init__()
        g = _g(11)
        self.fc = nn.Linear(4, 4)
        self.bn_fc, self.bn_ncl, self.bn_2d = nn.BatchNorm1d(4), nn.BatchNorm1d(4), nn.BatchNorm2d(4)
        self.bn_plain = nn.BatchNorm2d(4, affine=False)
        for bn in (self.bn_fc, self.bn_ncl, self.bn_2d, self.bn_plain):
            bn.running_mean.copy_(torch.randn(4, generator=g))
            bn.running_var.copy_(torch.rand(4, generator=g) + 0.5)
            if bn.affine:
                nn.init.uniform_(bn.weight, 0.5, 1.5, generator=g)
                nn.init.uniform_(bn.bias, -0.5, 0.5, generator=g)

    def forward(self, x: torch.Tensor, seq: torch.Tensor, image: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.bn_fc(self.fc(x)), self.bn_ncl(seq * 2), self.bn_2d(image * 2), self.bn_plain(image - 1)


class CopiesAndMax(nn.Module):
    """A memory-format copy (`_to_dim_order_copy` to channels-last) and max over H and over W with
    keepdim (max.dim, its values only)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = x * 2
        return (y.to(memory_format=torch.channels_last) + 1, torch.max(y, dim=2, keepdim=True)[0],
                torch.max(y, dim=3, keepdim=True)[0])


def test_unary_ops_and_pools() -> None:
    g = _g(8)
    assert_native_is_executorchs(UnaryAndPools(), (torch.randn(2, 5, generator=g), torch.randn(2, 5, generator=g),
                                                   torch.randn(1, 3, 9, 9, generator=g)))


def test_batch_norms_fold_into_linear_or_become_depthwise_convolutions() -> None:
    g = _g(9)
    et, _ = assert_native_is_executorchs(BatchNorms(), (torch.randn(3, 4, generator=g), torch.randn(2, 4, 5, generator=g),
                                                        torch.randn(2, 4, 3, 3, generator=g)))
    assert sum(n for part in et.partitions for op, n in part.items() if op.startswith("aten::_native_batch_norm")) == 4


def test_memory_format_copy_and_max_over_a_dim() -> None:
    assert_native_is_executorchs(CopiesAndMax(), (torch.randn(1, 3, 4, 5, generator=_g(10)),))


def test_max_over_channels_fails_in_preprocess_as_executorchs_does() -> None:
    """MaxDimConfig takes a max.dim over any dim of a 4-D tensor, but XNNPACK pools over H or W only:
    ExecuTorch's preprocess raises, and so does native's, naming the node."""
    from texir.lowering.errors import BackendPreprocessError

    class MaxOverChannels(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.max(x * 2, dim=1, keepdim=True)[0]

    ep = torch.export.export(MaxOverChannels(), (torch.randn(1, 2, 3, 4),), strict=False)
    et, native = executorch_xnnpack(copy.deepcopy(ep)), native_xnnpack(ep)
    assert isinstance(et.error, RuntimeError) and "only supports dim == 2 or dim == 3" in str(et.error)
    assert isinstance(native.error, BackendPreprocessError)
    assert "'aten_max_dim': max over dim 1" in str(native.error)


# -- per_op_mode ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mlp", "conv_bn", "q_mlp"])
def test_per_op_mode_partitions_as_executorchs(name: str) -> None:
    """XnnpackPartitioner(per_op_mode=True): one delegate per config match (a linear with its fused
    relu; a convolution, then its batch norm alone, which the preprocess makes a depthwise
    convolution; a static-int8 linear with its q/dq nodes, and each q/dq its config takes alone),
    the same delegates, blobs, named data and outputs as ExecuTorch's own .pte."""
    from tests.real_models import real_export
    from tests.zoo import cached_export, zoo_model

    if name.startswith("q_"):
        ep, args = real_export(name)
    else:
        ep, args = cached_export(name, decompose=False), zoo_model(name).build()[1]
    et, native = executorch_xnnpack(copy.deepcopy(ep), per_op_mode=True), native_xnnpack(ep, per_op_mode=True)
    assert et.error is None and native.error is None, (et.error, native.error)
    assert et.pte is not None and native.pte is not None
    assert native.partitions == et.partitions and len(et.partitions) > 1
    a, b = pte_view(et.pte), pte_view(native.pte)
    assert b.delegates == a.delegates and b.named == a.named and b.kernels == a.kernels
    for p, q in zip(run_pte(native.pte, args)[0], run_pte(et.pte, args)[0], strict=True):
        assert torch.equal(p, q)


def test_turned_down_batch_norm_and_max_dim_say_why() -> None:
    """A max.dim of a 3-D tensor and a batch norm of a 5-D one are turned down with their configs'
    reason, not as ops without a config."""
    from texir.adapters import from_exported_program
    from texir.backends.xnnpack.partitioner import partitioner

    class Both(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bn = nn.BatchNorm3d(2)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.max(x, dim=-1)[0], self.bn(y)

    ep = torch.export.export(Both().eval(), (torch.randn(2, 3, 4), torch.randn(1, 2, 2, 2, 2)), strict=False)
    reasons = partitioner().reasons(from_exported_program(ep, decompose=True))
    whys = sorted(why for name, why in reasons.items() if "max" in name or "batch_norm" in name)
    assert any("neither fold" in why for why in whys) and any("4-D float tensor" in why for why in whys), reasons
