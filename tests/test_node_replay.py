"""A repeated layer's decompositions are recorded once and replayed (`texir.adapters.node_replay`,
issue 42): the replayed program equals the one decomposed node by node (and torch's retrace), the
`.pte`/`.ptd` bytes of a language model do not change, and a node whose inputs differ in anything
the decomposition can see (a dtype, a symbolic size) is decomposed anew."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

import texir.adapters.fx_import as fx_import
from tests.real_models import export_static_cache_llama, static_cache_llama
from texir.adapters import from_exported_program, local_decompose
from texir.adapters.decompositions import edge_decomposition_table
from texir.adapters.local_decompose import decompose_locally
from texir.backends import xnnpack
from texir.emit import DEFAULT_EXTERNAL_TAG, EmitOptions, emit
from texir.ir import Program
from texir.orchestrate import lower
from texir.serialize import pte

LAYERS = 3
KEEP = ("aten::linear.default",)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.proj = torch.nn.Linear(16, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.proj(self.norm(x)).view(x.shape[0], x.shape[1], 3, 2, 8).permute(2, 0, 3, 1, 4)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + torch.nn.functional.gelu(out.transpose(1, 2).reshape(x.shape))


class _Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block() for _ in range(LAYERS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class _TwoDtypes(torch.nn.Module):
    """The same block on fp32 and on fp16: the second's decompositions differ by dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = _Block(), _Block().half()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.a(x), self.b(x.half())


class _TwoLengths(torch.nn.Module):
    """The same block on two inputs of different symbolic lengths."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = _Block(), _Block()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.a(x), self.b(y)


@functools.cache
def _stack_export() -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    return torch.export.export(_Stack().eval(), (torch.randn(2, 6, 16),), strict=False)


def _converted(ep: torch.export.ExportedProgram) -> Program:
    return from_exported_program(ep, decompose=False)


def _decomposed(ep: torch.export.ExportedProgram, *, replay: bool, dynamic: bool = False) -> tuple[Program, list[str]]:
    """`ep` decomposed locally; with `dynamic` shapes keeping `linear` (whose decomposition
    computes a size, left to the retrace) and names allowed to differ from the retrace's."""
    replayed: list[str] = []
    keep = KEEP if dynamic else ()
    local = decompose_locally(ep, keep, exact_names=not dynamic, replayed=replayed, replay=replay)
    assert local is not None
    return _converted(local), replayed


def test_a_repeated_layer_is_decomposed_once_and_replayed() -> None:
    ep = _stack_export()
    replayed_program, replayed = _decomposed(ep, replay=True)
    fresh_program, none = _decomposed(ep, replay=False)
    assert none == []
    # layer_norm and scaled_dot_product_attention (and gelu) of every block after the first
    sdpa = [n for n in replayed if "scaled_dot_product_attention" in n]
    norms = [n for n in replayed if "layer_norm" in n]
    assert len(sdpa) == LAYERS - 1 and len(norms) == LAYERS - 1, replayed
    assert replayed_program == fresh_program
    assert replayed_program == _converted(ep.run_decompositions(edge_decomposition_table(())))


def test_a_different_dtype_is_not_replayed() -> None:
    torch.manual_seed(0)
    ep = torch.export.export(_TwoDtypes().eval(), (torch.randn(2, 6, 16),), strict=False)
    program, replayed = _decomposed(ep, replay=True)
    assert replayed == []
    assert program == _decomposed(ep, replay=False)[0]


def test_a_different_symbol_is_not_replayed_the_same_one_is() -> None:
    torch.manual_seed(0)
    seq_x, seq_y = torch.export.Dim("seq_x", max=32), torch.export.Dim("seq_y", max=32)
    args = (torch.randn(2, 6, 16), torch.randn(2, 5, 16))
    other = torch.export.export(_TwoLengths().eval(), args, dynamic_shapes=({1: seq_x}, {1: seq_y}), strict=False)
    program, replayed = _decomposed(other, replay=True, dynamic=True)
    assert replayed == []
    assert program == _decomposed(other, replay=False, dynamic=True)[0]
    same = torch.export.export(_TwoLengths().eval(), (args[0], args[0].clone()), dynamic_shapes=({1: seq_x}, {1: seq_x}), strict=False)
    program, replayed = _decomposed(same, replay=True, dynamic=True)
    assert len([n for n in replayed if "scaled_dot_product_attention" in n]) == 1, replayed
    fresh = _decomposed(same, replay=False, dynamic=True)[0]
    assert program == fresh


def _files(ep: torch.export.ExportedProgram, *, replay: bool) -> tuple[bytes, bytes]:
    def decompose(*args: Any, **kwargs: Any) -> Any:
        return decompose_locally(*args, **kwargs, replay=replay)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fx_import, "decompose_locally", decompose)
        patch.setattr(local_decompose, "decompose_locally", decompose)
        lowered = lower(ep, [xnnpack.partitioner()], cache=None)
    emitted = emit(lowered.program, EmitOptions(external_constants=True, external_named_data=DEFAULT_EXTERNAL_TAG))
    (data,) = emitted.external
    return pte.dumps(emitted), pte.dumps_ptd(data)


def test_llm_bytes_do_not_change_with_replay() -> None:
    exportable = static_cache_llama(
        dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64),
        16,
    )
    ep = export_static_cache_llama(exportable, [3, 7, 11, 5], 16)
    replayed: list[str] = []
    assert decompose_locally(local_decompose.functional_program(ep), KEEP, exact_names=False, replayed=replayed) is not None
    assert replayed, "no decomposition of the repeated layers was replayed"
    assert _files(ep, replay=True) == _files(ep, replay=False)


class _Convs(torch.nn.Module):
    """Convolutions and batch norms of many sizes (channels, kernels, strides, a depthwise one, a
    size-1 spatial dimension, an unbatched 1-D convolution): remembered by rank, replayed."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
            torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.BatchNorm2d(16),  # replayed: other channels
            torch.nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=16), torch.nn.BatchNorm2d(16),
            torch.nn.Conv2d(16, 24, 3, padding=1), torch.nn.BatchNorm2d(24),  # replayed: other sizes
            torch.nn.Conv2d(24, 24, (3, 1), padding=(1, 0)), torch.nn.BatchNorm2d(24),
            torch.nn.Conv2d(24, 32, 1), torch.nn.BatchNorm2d(32),
            torch.nn.Conv2d(32, 8, 1), torch.nn.BatchNorm2d(8),  # replayed
        ])
        self.line = torch.nn.Conv1d(4, 6, 3)
        self.line_norm = torch.nn.BatchNorm1d(6)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for layer in self.layers:
            x = layer(x)
        x = torch.nn.functional.adaptive_avg_pool2d(x, (1, 1))
        return x, self.line_norm(self.line(y)).sum() + self.line(y[0]).sum()


def test_convolutions_and_batch_norms_of_other_sizes_are_replayed_by_rank() -> None:
    torch.manual_seed(0)
    ep = torch.export.export(_Convs().eval(), (torch.randn(2, 3, 10, 9), torch.randn(2, 4, 7)), strict=False)
    for functional_only in (True, False):
        replayed: list[str] = []
        local = decompose_locally(ep, functional_only=functional_only, exact_names=False, replayed=replayed)
        fresh = decompose_locally(ep, functional_only=functional_only, exact_names=False, replay=False)
        assert local is not None and fresh is not None
        assert _converted(local) == _converted(fresh)
        kinds = {n.rstrip("_0123456789") for n in replayed}
        assert kinds == ({"batch_norm"} if functional_only else {"conv2d", "batch_norm"}), replayed
        convs = [n for n in replayed if n.startswith("conv2d")]
        assert convs == ([] if functional_only else ["conv2d_1", "conv2d_3", "conv2d_6"]), replayed
    retraced = ep.run_decompositions(edge_decomposition_table(()))
    assert _converted(decompose_locally(ep) or ep) == _converted(retraced)


def test_a_recording_that_takes_a_computed_size_is_not_kept_by_rank() -> None:
    from texir.adapters.node_replay import Made, Ref, Tape, _sizes_free

    op = torch.ops.aten.view.default
    tape = Tape({}, ops=[Made(op, (Ref(False, 0), [2, 12]), {}, None, False)], generic=True)
    assert not _sizes_free(tape, (None, 1), {})  # 2 and 12: sizes the decomposition computed
    assert _sizes_free(tape, (None, [2, 12]), {})  # the node's own arguments


def _recordings_kept(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Each recording `node_replay` keeps for the process from here on."""
    from texir.adapters import node_replay

    kept: list[object] = []
    portable = node_replay._portable

    def spy(tape: Any) -> Any:
        made = portable(tape)
        if made is not None:
            kept.append(made)
        return made

    monkeypatch.setattr(node_replay, "_portable", spy)
    return kept


def test_a_second_lowering_replays_the_first_ones_recordings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Recordings of static sizes outlive their lowering: decomposing the program again (or another
    of the same layers) records nothing anew and gives the same program; the process's recordings
    hold no fake tensor of the lowering that made them; `forget_recordings` drops them."""
    from texir.adapters import node_replay

    ep = _stack_export()
    node_replay.forget_recordings()
    kept = _recordings_kept(monkeypatch)
    first, _ = _decomposed(ep, replay=True)
    assert kept and node_replay._REMEMBERED
    for tape in node_replay._REMEMBERED.values():
        for op in tape.ops:
            parts = op.results if isinstance(op.results, tuple) else (op.results,) if op.results is not None else ()
            assert all(isinstance(p, node_replay.Result) for p in parts)
    kept.clear()
    second, replayed = _decomposed(ep, replay=True)
    assert kept == [] and second == first == _decomposed(ep, replay=False)[0]
    # `replayed` still names the nodes that repeat an earlier node of the same program
    assert len([n for n in replayed if "scaled_dot_product_attention" in n]) == LAYERS - 1, replayed
    torch.manual_seed(1)
    other = torch.export.export(_Stack().eval(), (torch.randn(2, 6, 16),), strict=False)  # other weights
    assert _decomposed(other, replay=True)[0] == _decomposed(other, replay=False)[0] and kept == []
    node_replay.forget_recordings()
    assert not node_replay._REMEMBERED
    assert _decomposed(ep, replay=True)[0] == first and kept


def test_recordings_are_kept_apart_by_what_the_decomposition_keeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """A recording made keeping `linear` whole is not replayed where `linear` is decomposed (nor
    the functional step's where the edge decomposition runs): each program equals its decomposition
    without any recording."""
    from texir.adapters import node_replay

    ep = _stack_export()
    node_replay.forget_recordings()
    for keep, functional_only in (((), False), (KEEP, False), ((), True), (KEEP, False), ((), False)):
        local = decompose_locally(ep, keep, functional_only=functional_only, exact_names=False)
        fresh = decompose_locally(ep, keep, functional_only=functional_only, exact_names=False, replay=False)
        assert local is not None and fresh is not None
        assert _converted(local) == _converted(fresh), (keep, functional_only)
    contexts = {key[0] for key in node_replay._REMEMBERED}
    assert contexts == {(False, frozenset()), (False, frozenset(KEEP)), (True, frozenset())}


def test_recordings_of_symbolic_sizes_stay_with_their_program(monkeypatch: pytest.MonkeyPatch) -> None:
    """A symbol is its program's own: nodes whose inputs have symbolic sizes are replayed within
    their program only."""
    from texir.adapters import node_replay

    node_replay.forget_recordings()
    kept = _recordings_kept(monkeypatch)
    seq = torch.export.Dim("seq", max=32)
    args = (torch.randn(2, 6, 16), torch.randn(2, 6, 16))
    torch.manual_seed(0)
    ep = torch.export.export(_TwoLengths().eval(), args, dynamic_shapes=({1: seq}, {1: seq}), strict=False)
    program, replayed = _decomposed(ep, replay=True, dynamic=True)
    assert replayed and program == _decomposed(ep, replay=False, dynamic=True)[0]
    assert kept == [] and not node_replay._REMEMBERED


def test_a_replay_only_names_what_nothing_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch norm's decomposition makes an empty `reserve` tensor nothing reads and three getitems
    of which one is read: a replay makes neither the dead op nor the unread getitems (dead code the
    graph loses anyway), only takes their names, so the program and its names are the same."""
    from texir.adapters import node_replay

    torch.manual_seed(0)
    ep = torch.export.export(_Convs().eval(), (torch.randn(2, 3, 10, 9), torch.randn(2, 4, 7)), strict=False)
    created: list[str] = []
    create_node = torch.fx.Graph.create_node

    def counted(self: torch.fx.Graph, op: str, target: Any, *args: Any, **kwargs: Any) -> torch.fx.Node:
        node = create_node(self, op, target, *args, **kwargs)
        created.append(str(target))
        return node

    monkeypatch.setattr(torch.fx.Graph, "create_node", counted)
    programs = []
    for elide in (True, False):
        replay = node_replay._replay

        def replayed(rec: Any, *args: Any, _replay: Any = replay, _elide: bool = elide, **kwargs: Any) -> Any:
            rec.elide_dead = rec.elide_dead and _elide
            return _replay(rec, *args, **kwargs)

        monkeypatch.setattr(node_replay, "_replay", replayed)
        created.clear()
        local = decompose_locally(ep, functional_only=True, exact_names=False)
        assert local is not None
        programs.append((_converted(local), created.count("aten.empty.memory_format"), created.count("<built-in function getitem>")))
    (elided, empties, getitems), (full, all_empties, all_getitems) = programs
    assert elided == full
    assert empties < all_empties and getitems < all_getitems
