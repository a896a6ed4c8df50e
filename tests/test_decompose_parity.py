"""texir decomposes as ExecuTorch's `to_edge` does (issue 32, item 1): the defects found by the
OpInfo differential test, one tiny module each. The fast path (`decompose_locally`) must give
torch's retrace's program or step aside; the edge passes must prune what ExecuTorch prunes; what
`to_edge` refuses, texir refuses unless asked not to."""

from __future__ import annotations

import collections

import pytest
import torch
import torch.nn.functional as F

from texir.adapters import from_exported_program
from texir.adapters.core_aten import NonCoreOperatorError, is_edge_allowed
from texir.adapters.decompositions import edge_decomposition_table
from texir.adapters.local_decompose import decompose_locally
from texir.emit import emit
from texir.ir import CallFunction, Program
from texir.orchestrate import lower
from texir.serialize import pte


class _Fn(torch.nn.Module):
    def __init__(self, fn: object) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return self.fn(*xs)  # type: ignore[operator, no-any-return]  # a test lambda


def _export(fn: object, *args: torch.Tensor) -> torch.export.ExportedProgram:
    return torch.export.export(_Fn(fn), args, strict=False)


def _ops(program: Program) -> collections.Counter[str]:
    return collections.Counter(n.target for n in program.graph.nodes if isinstance(n, CallFunction))


def _fx_ops(ep: torch.export.ExportedProgram) -> collections.Counter[str]:
    return collections.Counter(str(n.target) for n in ep.graph.nodes if n.op == "call_function")


SAME_AS_RETRACE = {
    # torch's export keeps these composite ops whole (core ATen, not in the table): the fast path
    # ran their composite kernel (arange/_to_copy/index: 4 extra kernels, 2x slower U-Nets)
    "interpolate_nearest": (lambda x: F.interpolate(x, scale_factor=2.0, mode="nearest"), (1, 2, 4, 4)),
    "interpolate_bilinear": (lambda x: F.interpolate(x, scale_factor=2.0, mode="bilinear"), (1, 2, 4, 4)),
    # an alias of an earlier value stays an `alias` node (the fast path dropped it)
    "t_of_1d": (lambda x: x.t(), (3,)),
    "t_of_computed_1d": (lambda x: (x + 1).t() * 2, (3,)),
    "alias_copy": (lambda x: torch.alias_copy(x + 1), (3,)),
    "detach": (lambda x: (x + 1).detach(), (3,)),
    # ...while an alias of a value the same decomposition made still leaves none
    "block_diag": (lambda a, b: torch.block_diag(a, b), (1, 5), (2, 5)),
    "new_ones": (lambda x: x.new_ones(3) + x, (3,)),
    "detach_in_place": (lambda x: x.clone().detach_() * 2, (3,)),  # (transformers' GPT-2 and BERT)
}


@pytest.mark.parametrize("name", sorted(SAME_AS_RETRACE))
def test_fast_path_gives_the_retraces_program(name: str) -> None:
    fn, *shapes = SAME_AS_RETRACE[name]
    ep = _export(fn, *(torch.randn(*s) for s in shapes))
    local = decompose_locally(ep)
    assert local is not None, name
    expected = from_exported_program(ep.run_decompositions(edge_decomposition_table()))
    assert from_exported_program(local) == expected


def test_interpolate_stays_one_kernel() -> None:
    ep = _export(lambda x: F.interpolate(x, scale_factor=2.0, mode="nearest"), torch.randn(1, 2, 4, 4))
    assert _ops(from_exported_program(ep, decompose=True)) == {"aten::upsample_nearest2d.vec": 1}


def test_resize_is_left_to_the_retrace() -> None:
    """Functionalization turns `resize_` into `as_strided`, not into `resize` (no runtime kernel)."""
    ep = _export(lambda x: x.clone().resize_(2, 3), torch.randn(4, 4))
    why: list[str] = []
    assert decompose_locally(ep, why=why) is None
    assert "resize_" in why[0] and "functionalized specially" in why[0]
    ops = _ops(lower(ep, [], cache=None).program)
    assert ops["aten::as_strided_copy.default"] == 1 and not any("resize" in t for t in ops)


class _GlobalResponseNorm(torch.nn.Module):
    """ConvNeXt-V2's GRN (timm), channels last: `x.norm(p=2, dim=(1, 2))` is linalg_vector_norm."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(dim))
        self.bias = torch.nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = x.norm(p=2, dim=(1, 2), keepdim=True)
        n = g / (g.mean(dim=-1, keepdim=True) + 1e-6)
        return x + torch.addcmul(self.bias.view(1, 1, 1, -1), self.weight.view(1, 1, 1, -1), x * n)


class _WritesThroughAView(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x)
        y[0].relu_()  # only functionalization gets this right: the retrace
        return y + 1


@pytest.mark.parametrize("retrace", [False, True])
def test_linalg_vector_norm_is_decomposed_and_emits(retrace: bool) -> None:
    module = _GlobalResponseNorm(4).eval()
    ep = torch.export.export(module, (torch.randn(1, 3, 3, 4),), strict=False)
    assert "aten.linalg_vector_norm.default" in _fx_ops(ep)
    if retrace:  # a program the fast path cannot take, as timm's ConvNeXt-V2 (adaptive pooling)
        ep = torch.export.export(_WritesThroughAView(module), (torch.randn(1, 3, 3, 4),), strict=False)
        assert decompose_locally(ep) is None
    program = lower(ep, [], cache=None).program
    assert not any("norm" in t for t in _ops(program))
    assert pte.dumps(emit(program))


def test_block_diag_leaves_no_empty_full() -> None:
    """ExecuTorch's PruneEmptyTensorsPass drops zero-width `cat` inputs: `prune_empty_tensors`."""
    ep = _export(lambda a, b, c: torch.block_diag(a, b, c), torch.randn(1, 5), torch.randn(2, 5), torch.randn(3, 5))
    program = lower(ep, [], cache=None).program
    ops = _ops(program)
    assert ops["aten::full.default"] == 4 and ops["aten::cat.default"] == 4
    for node in program.graph.nodes:  # no empty tensor is left
        meta = program.graph.meta(node)
        assert 0 not in getattr(meta, "shape", (1,)), node.name


def test_non_core_ops_are_refused_unless_allowed() -> None:
    """ExecuTorch's to_edge refuses `unfold` (not core ATen): so does texir, naming op and node;
    `unfold` of a 0-d tensor gave a .pte that aborted the runtime."""
    ep = _export(lambda x: x.unfold(0, 1, 1), torch.randn(()))
    with pytest.raises(NonCoreOperatorError, match=r"node 'unfold': aten::unfold.default is not a core ATen"):
        lower(ep, [], cache=None)
    with pytest.raises(NonCoreOperatorError, match="allow_non_core=True"):
        from_exported_program(ep, decompose=True)
    program = lower(ep, [], cache=None, allow_non_core=True).program
    assert _ops(program) == {"aten::unfold_copy.default": 1}
    assert from_exported_program(ep) is not None  # without decomposition nothing is checked


def test_edge_allow_list_follows_executorch() -> None:
    ops = torch.ops.aten
    assert is_edge_allowed(ops.add.Tensor) and is_edge_allowed(ops.view_copy.default)
    assert is_edge_allowed(ops.full_like.default) and is_edge_allowed(ops.sym_size.int)
    assert not is_edge_allowed(ops.unfold.default) and not is_edge_allowed(ops.resize.default)
    from torch.ao.quantization.fx import _decomposed  # noqa: F401 - registers quantized_decomposed

    assert is_edge_allowed(torch.ops.quantized_decomposed.quantize_per_tensor.default)  # other namespaces pass


def test_complex_intermediates_emit_and_run() -> None:
    """`fft.irfft2` goes through complex64 values: ExecuTorch's scalar type 9."""
    pytest.importorskip("executorch")
    from texir.executorch.runtime import run_pte

    x = torch.randn(5, 6, 7)
    ep = _export(torch.fft.irfft2, x)
    out = run_pte(pte.dumps(emit(lower(ep, [], cache=None).program)), [x])
    torch.testing.assert_close(out[0], torch.fft.irfft2(x))
