"""The model zoo: small, deterministic models covering what torch.export produces, shared by all tests.

Each builder seeds torch, builds its module in eval mode and returns it with example positional args.
Shapes are tiny so exporting the whole zoo stays fast. Other test files import
`ZOO`, `ZooModel`, `export_zoo_model` (and `zoo_model`, `cached_export` for speed).
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim
from torch.utils._pytree import tree_flatten

from texir.adapters.decompositions import edge_decomposition_table

__all__ = [
    "ZOO", "ZooModel", "assert_same", "cached_export", "compare_runs", "example_argsets", "export_zoo_model",
    "fresh_module", "run_model", "zoo_model",
]


@dataclass(frozen=True)
class ZooModel:
    name: str
    build: Callable[[], tuple[nn.Module, tuple[Any, ...]]]
    """Module (eval mode) and example positional args (may nest tuples/lists/dicts of tensors)."""
    dynamic_shapes: Any = None
    """As for `torch.export.export`."""
    alt_args: Callable[[], tuple[Any, ...]] | None = None
    """Second example args: another size for dynamic models, the other branch for cond models."""
    stateful: bool = False
    """Mutates buffers in place: call several times to compare."""
    tags: frozenset[str] = frozenset()


def _seeded(fn: Callable[[], nn.Module]) -> nn.Module:
    # Model state uses only uniform draws (nn.Linear/Conv init, torch.rand): torch's vectorized
    # normal_ kernel may differ in the last bit between CPUs, and state hashes are in the goldens.
    torch.manual_seed(0)
    return fn().eval()


def _randn(*shape: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


def _randint(high: int, *shape: int, seed: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, shape, generator=g)


# ------------------------------------------------------------------------------------------------
# Modules


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class DeepMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(6, 12), nn.GELU(), nn.Linear(12, 12), nn.Sigmoid(), nn.Linear(12, 12),
            nn.Tanh(), nn.Linear(12, 3),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, stride=1, padding=1, bias=False)  # bias=False: a None argument
        self.bn1 = nn.BatchNorm2d(6)
        self.conv2 = nn.Conv2d(6, 8, 3, stride=2)
        self.bn2 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


class ConvReLUTan(nn.Module):
    """The demo model: two conv2d+relu blocks, then tan."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        return torch.tan(x)


class Attention(nn.Module):
    def __init__(self, dim: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.norm(x)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        q = q.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        att = torch.softmax(q @ k.transpose(-2, -1) * (d // self.heads) ** -0.5, dim=-1)
        out = (att @ v).transpose(1, 2).reshape(b, t, d)
        return x + self.proj(out)


class TransformerBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = Attention(8, 2)
        self.ln = nn.LayerNorm(8)
        self.ff = nn.Sequential(nn.Linear(8, 16), nn.GELU(approximate="tanh"), nn.Linear(16, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attn(x)
        return x + self.ff(self.ln(x))


class DirectParams(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(4, 4) * 2 - 1)
        self.bias = nn.Parameter(torch.rand(4) * 2 - 1)
        self.scale = nn.Parameter(torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x, self.weight) * self.scale


class Buffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.rand(5) * 2 - 1)
        self.register_buffer("inv_std", torch.rand(5) + 0.5, persistent=False)
        self.register_buffer("steps", torch.tensor(3, dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) * self.inv_std + self.steps


class RunningStats(nn.Module):
    """Updates its buffers in place on every call."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("running_mean", torch.zeros(4))
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))
        self.register_buffer("scratch", torch.ones(4), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.running_mean.mul_(0.9).add_(x.mean(0) * 0.1)
        self.count.add_(1)
        self.scratch.copy_(x[0])
        return x - self.running_mean + self.scratch * 0.5


class BatchNormTrainingStats(nn.Module):
    """A counter buffer and a second mutated buffer read back after mutation."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("acc", torch.zeros(2, 3))
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.lin(x)
        self.acc.add_(y)
        return y, self.acc * 2.0


class LiftedConstant(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.tensor([[1.0, -2.0, 3.0], [0.5, 0.25, -0.125]])  # plain attribute: lifted
        self.offsets = torch.arange(3, dtype=torch.int64)
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x * self.table[0] - self.table[1]) + self.offsets


class TupleInputs(nn.Module):
    def forward(self, pair: tuple[torch.Tensor, torch.Tensor], z: torch.Tensor) -> torch.Tensor:
        a, b = pair
        return a * b + z


class DictIO(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        h = self.lin(inputs["x"]) + inputs["bias"]
        return {"out": h, "aux": inputs["x"].sum(dim=-1)}


class NestedIO(nn.Module):
    def forward(
        self, xs: list[tuple[torch.Tensor, torch.Tensor]], extra: dict[str, list[torch.Tensor]]
    ) -> tuple[list[torch.Tensor], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
        sums = [a + b for a, b in xs]
        prods = [a * b for a, b in xs]
        e = extra["t"][0] - extra["t"][1]
        return [sums[0], prods[1]], {"first": (sums[1], e), "second": (prods[0], e.neg())}


class MultiOutput(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s = x + y
        return s, x - y, s * 2, x.exp()


class MaxDim(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        values, indices = torch.max(x, dim=1)
        mn, _ = x.min(dim=0, keepdim=True)
        return values + 1.0, indices, mn


class SplitChunk(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b, c = torch.split(x, [2, 3, 1], dim=1)
        p, q = x.chunk(2, dim=0)
        u = torch.unbind(x[:2, :2], dim=1)
        return torch.cat([c, a, b], dim=1) * p.sum(), q - u[0].unsqueeze(1) + u[1].unsqueeze(1)


class TopK(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        values, indices = torch.topk(x, 3, dim=-1)
        sorted_vals, _ = torch.sort(x, dim=0, descending=True)
        return values * 2, indices, sorted_vals


class Scalars(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2.5 + 1
        y = torch.clamp(y, min=-0.75, max=3.25)
        y = torch.pow(y, 2) + torch.pow(2.0, x) - x**0.5
        y = torch.clamp(y, max=100.0)  # min=None: a None argument
        return 1.0 - y / 3 + torch.full_like(x, 0.125)


class IntLists(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = x.permute(2, 0, 1).contiguous()
        z = y.view(4, -1).reshape(2, 2, 6)
        s = x.sum(dim=[0, 2], keepdim=True)
        m = x.mean(dim=(1,))
        return z.flip([0, 2]), s.expand(2, 3, 4), m.repeat(2, 1)


class CatStack(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        c = torch.cat([x, y, x * y], dim=0)
        s = torch.stack([x, y], dim=1)
        return c.sum(0) + s.flatten(1).sum(1)[:3].sum()


class IndexGather(nn.Module):
    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        g = torch.gather(x, 1, idx)
        sel = torch.index_select(x, 0, idx[:, 0])
        adv = x[idx[:, 1]]
        return g, sel * 2, adv[:, 1:3]


class Embedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 6)
        self.head = nn.Linear(6, 10)
        with torch.no_grad():
            self.emb.weight.uniform_(-1.0, 1.0)  # see _seeded: no normal_ in model state

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.head(self.emb(tokens).mean(1)), dim=-1)


class ResBlock(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(ch, ch, 3, padding=1)
        self.b1 = nn.BatchNorm2d(ch)
        self.c2 = nn.Conv2d(ch, ch, 3, padding=1)
        self.b2 = nn.BatchNorm2d(ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.b2(self.c2(F.relu(self.b1(self.c1(x))))))


class ResNetTiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.blocks = nn.Sequential(ResBlock(4), ResBlock(4))
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(x.mean(dim=(2, 3)))


class ResidualMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(6, 6) for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = x + torch.relu(blk(x)) * 0.5
        return x


class WhereMask(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask = (x > 0) & (x < 1.5)
        y = torch.where(mask, x, torch.zeros_like(x))
        z = x.masked_fill(~mask, -1.0)
        return y + z, mask.logical_not()


class DTypes(nn.Module):
    def forward(self, x: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        am = x.argmax(dim=1)
        xi = (x * 10).to(torch.int32)
        y = (n + am).to(torch.float64) / 3
        return xi // 3, y, (xi % 4).to(torch.bool)


class Factories(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = torch.arange(4, dtype=torch.float32)
        o = torch.ones(3, 4, dtype=torch.float32)
        f = torch.full((3, 4), 0.25)
        e = torch.eye(4)[:3]
        return x * r + o - f + e


class PadSlice(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = F.pad(x, (1, 2, 0, 1), value=0.5)
        s = x[:, 1:4:2, ::2]
        sel = x.select(0, 1).unsqueeze(0).expand(3, -1, -1)
        return p, s + sel[:, 1:4:2, ::2]


class MatmulVariants(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.rand(5, 3) * 2 - 1)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        bm = torch.bmm(a, b)
        mm = a[0] @ self.w
        return bm.softmax(-1), torch.baddbmm(bm, a, b, beta=0.5, alpha=2.0) + mm.sum()


class Norms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gn = nn.GroupNorm(2, 4)
        self.ln = nn.LayerNorm([4, 3], elementwise_affine=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        v, m = torch.var_mean(x, dim=1, keepdim=True, correction=0)
        return self.gn(x.unsqueeze(-1)).squeeze(-1), self.ln(x) * (v + m)


class DynamicMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.silu(self.fc1(x)))


class DynamicConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3))


class DynamicSeq(nn.Module):
    """Uses the symbolic sequence length in a view, so the graph holds sym_size and SymInt math."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, d = x.shape
        h = self.lin(x.reshape(b * t, d))
        att = torch.softmax(torch.bmm(x, y.transpose(1, 2)), dim=-1)
        return h.view(b, t, d) + torch.bmm(att, y), h.sum(0)


class BuiltinNamed(nn.Module):
    """Inputs named like Python builtins (torchvision's LR-ASPP has `forward(self, input)`), one of
    them also returned as it is. torch.export keeps the names; FX renames such a placeholder when it
    rebuilds the graph (`copy.deepcopy(ep)`: `input` -> `input_1`, the signature still `input`).
    torch.export refuses the other names FX cannot keep (`self`, keywords: tests/test_builtin_names.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, input: torch.Tensor, list: torch.Tensor, type: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: A002
        return self.fc(torch.relu(input) * type) + list, input


class CondSimple(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def true_fn(t: torch.Tensor) -> torch.Tensor:
            return t.sin() * 2.0

        def false_fn(t: torch.Tensor) -> torch.Tensor:
            return t.cos() - 1.0

        return torch.cond(x.sum() > 0, true_fn, false_fn, (x,))


class CondClosureNested(nn.Module):
    """Branches close over parameters and a buffer; the true branch holds a nested cond."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("shift", torch.full((4,), 0.5))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def inner_true(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return self.lin(a) + b

        def inner_false(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a * b - self.shift

        def true_fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.cond(b.mean() > 0, inner_true, inner_false, (a, b)).relu()

        def false_fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return self.lin(a - b)

        out = torch.cond(x.sum() > 0, true_fn, false_fn, (x, y))
        return out, out + x


class CondMultiOutput(nn.Module):
    """A cond with two results and a predicate that is a tensor input."""

    def forward(self, pred: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        def true_fn(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return t + 1.0, t.max(dim=0).values

        def false_fn(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return t - 1.0, t.min(dim=0).values

        a, b = torch.cond(pred, true_fn, false_fn, (x,))
        return a * b


class Recurrent(nn.Module):
    """A torch.nn recurrent module called with its sequence and, when given, initial state. (The
    modules' own input is named `input`, a name torch renames on the way back to FX: the zoo keeps
    plain names; tests/test_recurrent.py exports the modules themselves.)"""

    def __init__(self, rnn: nn.Module) -> None:
        super().__init__()
        self.rnn = rnn

    def forward(self, x: torch.Tensor, state: Any = None) -> Any:
        return self.rnn(x, state)


# ------------------------------------------------------------------------------------------------
# The zoo


def _m(name: str, mod: Callable[[], nn.Module], args: Callable[[], tuple[Any, ...]], **kw: Any) -> ZooModel:
    def build() -> tuple[nn.Module, tuple[Any, ...]]:
        module = _seeded(mod)
        return module, args()

    kw["tags"] = frozenset(kw.get("tags", ()))
    return ZooModel(name=name, build=build, **kw)


_batch = Dim("batch", min=2, max=64)
_seq = Dim("seq", min=2, max=32)

ZOO: tuple[ZooModel, ...] = (
    _m("mlp", MLP, lambda: (_randn(2, 8),)),
    _m("deep_mlp", DeepMLP, lambda: (_randn(3, 6),)),
    _m("conv_bn", ConvBN, lambda: (_randn(1, 3, 8, 8),), tags={"batchnorm"}),
    _m("convnet", ConvNet, lambda: (_randn(2, 3, 12, 12),), tags={"batchnorm", "none_arg"}),
    _m("conv_relu_tan", ConvReLUTan, lambda: (_randn(1, 3, 16, 16),), tags={"demo"}),
    _m("attention", lambda: Attention(8, 2), lambda: (_randn(2, 5, 8),), tags={"attention"}),
    _m("transformer_block", TransformerBlock, lambda: (_randn(1, 4, 8),), tags={"attention"}),
    _m("direct_params", DirectParams, lambda: (_randn(3, 4),), tags={"params"}),
    _m("buffers", Buffers, lambda: (_randn(2, 5),), tags={"buffers"}),
    _m("running_stats", RunningStats, lambda: (_randn(3, 4),), stateful=True, tags={"buffers", "mutation"}),
    _m("accumulate", BatchNormTrainingStats, lambda: (_randn(2, 3),), stateful=True,
       tags={"buffers", "mutation", "multi_output"}),
    _m("lifted_constant", LiftedConstant, lambda: (_randn(2, 3),), tags={"constants"}),
    _m("tuple_inputs", TupleInputs, lambda: ((_randn(2, 3), _randn(2, 3, seed=5)), _randn(3, seed=6)),
       tags={"nested_io"}),
    _m("dict_io", DictIO, lambda: ({"x": _randn(2, 4), "bias": _randn(4, seed=3)},),
       tags={"nested_io", "multi_output"}),
    _m("nested_io", NestedIO,
       lambda: ([(_randn(2, 2), _randn(2, 2, seed=3)), (_randn(2, 2, seed=4), _randn(2, 2, seed=5))],
                {"t": [_randn(2, 2, seed=6), _randn(2, 2, seed=7)]}),
       tags={"nested_io", "multi_output"}),
    _m("multi_output", MultiOutput, lambda: (_randn(3, 2), _randn(3, 2, seed=4)), tags={"multi_output"}),
    _m("max_dim", MaxDim, lambda: (_randn(4, 5),), tags={"multi_output_op"}),
    _m("split_chunk", SplitChunk, lambda: (_randn(4, 6),), tags={"multi_output_op"}),
    _m("topk", TopK, lambda: (_randn(4, 6),), tags={"multi_output_op"}),
    _m("scalars", Scalars, lambda: (_randn(3, 4).abs(),), tags={"scalars", "none_arg"}),
    _m("int_lists", IntLists, lambda: (_randn(2, 3, 4),), tags={"int_lists"}),
    _m("cat_stack", CatStack, lambda: (_randn(3, 4), _randn(3, 4, seed=9))),
    _m("index_gather", IndexGather, lambda: (_randn(4, 5), _randint(4, 4, 2)), tags={"index"}),
    _m("embedding", Embedding, lambda: (_randint(10, 2, 5),), tags={"index"}),
    _m("resnet_tiny", ResNetTiny, lambda: (_randn(1, 3, 8, 8),), tags={"residual", "batchnorm"}),
    _m("residual_mlp", ResidualMLP, lambda: (_randn(2, 6),), tags={"residual"}),
    _m("where_mask", WhereMask, lambda: (_randn(3, 4),)),
    _m("builtin_named", BuiltinNamed, lambda: (_randn(2, 4), _randn(2, 4, seed=3), _randn(2, 4, seed=4)),
       tags={"params", "builtin_names", "multi_output"}),
    _m("dtypes", DTypes, lambda: (_randn(3, 4), _randint(5, 3)), tags={"dtypes"}),
    _m("factories", Factories, lambda: (_randn(3, 4),), tags={"dtypes"}),
    _m("pad_slice", PadSlice, lambda: (_randn(3, 5, 6),), tags={"int_lists"}),
    _m("matmul_variants", MatmulVariants, lambda: (_randn(2, 3, 5), _randn(2, 5, 4, seed=3)),
       tags={"params"}),
    _m("norms", Norms, lambda: (_randn(2, 4, 3),), tags={"multi_output_op"}),
    _m("dynamic_mlp", DynamicMLP, lambda: (_randn(3, 6),), dynamic_shapes=({0: _batch},),
       alt_args=lambda: (_randn(7, 6, seed=11),), tags={"dynamic"}),
    _m("dynamic_conv", DynamicConv, lambda: (_randn(2, 2, 6, 6),), dynamic_shapes=({0: _batch},),
       alt_args=lambda: (_randn(5, 2, 6, 6, seed=11),), tags={"dynamic", "batchnorm"}),
    _m("dynamic_seq", DynamicSeq, lambda: (_randn(2, 3, 4), _randn(2, 5, 4, seed=3)),
       dynamic_shapes=({0: _batch, 1: _seq}, {0: _batch}),
       alt_args=lambda: (_randn(3, 7, 4, seed=11), _randn(3, 5, 4, seed=12)), tags={"dynamic"}),
    _m("cond_simple", CondSimple, lambda: (_randn(3, 4),), alt_args=lambda: (-_randn(3, 4).abs(),),
       tags={"cond"}),
    _m("cond_closure_nested", CondClosureNested, lambda: (_randn(2, 4).abs(), _randn(2, 4, seed=3)),
       alt_args=lambda: (-_randn(2, 4).abs(), _randn(2, 4, seed=3)), tags={"cond", "params", "buffers"}),
    _m("cond_multi_output", CondMultiOutput, lambda: (torch.tensor(True), _randn(3, 4)),
       alt_args=lambda: (torch.tensor(False), _randn(3, 4)), tags={"cond", "cond_multi_output"}),
    # torch.nn's recurrent modules as users export them (more variants: tests/recurrent_models.py)
    _m("lstm", lambda: Recurrent(nn.LSTM(3, 4, num_layers=2, bidirectional=True, batch_first=True)),
       lambda: (_randn(2, 3, 3), (_randn(4, 2, 4, seed=3), _randn(4, 2, 4, seed=4))),
       tags={"recurrent", "nested_io", "multi_output_op"}),
    _m("gru", lambda: Recurrent(nn.GRU(3, 4)), lambda: (_randn(3, 2, 3),), tags={"recurrent", "multi_output_op"}),
    _m("rnn_relu", lambda: Recurrent(nn.RNN(3, 4, num_layers=2, nonlinearity="relu")),
       lambda: (_randn(3, 2, 3), _randn(2, 2, 4, seed=3)), tags={"recurrent"}),
)


def zoo_model(name: str) -> ZooModel:
    for model in ZOO:
        if model.name == name:
            return model
    raise KeyError(f"no zoo model named {name!r}; known: {', '.join(m.name for m in ZOO)}")


def export_zoo_model(m: ZooModel, *, decompose: bool = True) -> torch.export.ExportedProgram:
    """Export `m` (strict=False); with `decompose`, decompose as ExecuTorch's to_edge does."""
    module, args = m.build()
    ep = torch.export.export(module, args, dynamic_shapes=m.dynamic_shapes, strict=False)
    return ep.run_decompositions(edge_decomposition_table()) if decompose else ep


@functools.lru_cache(maxsize=None)
def _cached_export(name: str, decompose: bool) -> torch.export.ExportedProgram:
    if decompose:
        return _cached_export(name, False).run_decompositions(edge_decomposition_table())
    return export_zoo_model(zoo_model(name), decompose=False)


DYNAMIC_SHAPES = ("dynamic_mlp", "dynamic_conv", "dynamic_seq")
"""The zoo models exported with dynamic shapes."""
NESTED_GRAPHS = ("cond_simple", "cond_closure_nested", "cond_multi_output")
"""The zoo models with nested graphs (torch.cond branches)."""


def cached_export(name: str, decompose: bool = True) -> torch.export.ExportedProgram:
    """`export_zoo_model`, cached per process. Callers must not mutate the result; call
    `fresh_module(ep)` for a runnable copy that owns its state. Stateful models get a private copy
    each call, since `ep.module()` shares buffers with the program and running it would change them."""
    ep = _cached_export(name, decompose)
    return copy.deepcopy(ep) if zoo_model(name).stateful else ep


def fresh_module(ep: torch.export.ExportedProgram) -> nn.Module:
    """A runnable module that owns its state. `ep.module()` shares buffers with `ep.state_dict`
    (and `run_decompositions` shares them with the undecomposed program), so running a stateful
    model through it would change the (cached) program."""
    return copy.deepcopy(ep).module()


# ------------------------------------------------------------------------------------------------
# Running and comparing

STATEFUL_CALLS = 3


def example_argsets(m: ZooModel) -> list[tuple[Any, ...]]:
    _, args = m.build()
    return [args] + ([m.alt_args()] if m.alt_args is not None else [])


def run_model(m: ZooModel, make: Callable[[], torch.nn.Module]) -> list[tuple[Any, dict[str, torch.Tensor]]]:
    """Outputs (and buffers, after each call) of a fresh module on each example input; stateful
    models are called several times in a row."""
    results = []
    for args in example_argsets(m):
        module = make()
        for _ in range(STATEFUL_CALLS if m.stateful else 1):
            out = module(*copy.deepcopy(args))
            buffers = {k: v.clone() for k, v in module.named_buffers()}
            results.append((out, buffers))
    return results


def assert_same(actual: Any, expected: Any, *, exact: bool, what: str) -> None:
    a_leaves, a_spec = tree_flatten(actual)
    e_leaves, e_spec = tree_flatten(expected)
    assert a_spec == e_spec, f"{what}: output structure {a_spec} != {e_spec}"
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        assert isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor), f"{what}: leaf {i}"
        assert a.dtype == e.dtype and a.shape == e.shape, f"{what}: leaf {i} {a.dtype}{list(a.shape)} != {e.dtype}{list(e.shape)}"
        if exact:
            assert torch.equal(a, e), f"{what}: leaf {i} differs (max {float((a.double() - e.double()).abs().max())})"
        else:
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6, msg=f"{what}: leaf {i}")


def compare_runs(actual: list[Any], expected: list[Any], *, exact: bool, what: str) -> None:
    assert len(actual) == len(expected)
    for call, ((out_a, buf_a), (out_e, buf_e)) in enumerate(zip(actual, expected)):
        assert_same(out_a, out_e, exact=exact, what=f"{what} call {call}")
        assert sorted(buf_a) == sorted(buf_e), f"{what} call {call}: buffers {sorted(buf_a)} != {sorted(buf_e)}"
        assert_same(buf_a, buf_e, exact=exact, what=f"{what} call {call} buffers")
