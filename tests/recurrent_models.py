"""Recurrent modules (torch.nn's LSTM, GRU and RNN with tanh or relu) as users export them, in a
pairwise-covering set of variants: every pair of values of two of (kind, layers 1-2, bidirectional,
batch_first, initial state given) occurs in some variant, in 8 variants rather than 64. Shared by
tests/test_recurrent.py and the XNNPACK oracle (tests/xnnpack_conformance.py)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["RECURRENT", "RecurrentVariant", "recurrent_args", "recurrent_export", "recurrent_module"]

INPUT, HIDDEN, SEQ, BATCH = 3, 4, 2, 2
KINDS = ("lstm", "gru", "rnn_tanh", "rnn_relu")


@dataclass(frozen=True)
class RecurrentVariant:
    kind: str
    layers: int
    bidirectional: bool
    batch_first: bool
    initial_state: bool

    @property
    def name(self) -> str:
        flags = ("_bi" if self.bidirectional else "") + ("_bf" if self.batch_first else "")
        return f"{self.kind}_l{self.layers}{flags}{'_h0' if self.initial_state else ''}"


def _pairwise() -> tuple[RecurrentVariant, ...]:
    # An orthogonal array: kind a (two bits) and a row bit r give the four two-valued factors as r,
    # r^a0, r^a1 and r^a0^a1, so each kind meets both values of each factor and any two factors
    # meet in all four combinations.
    variants = []
    for a, kind in enumerate(KINDS):
        a0, a1 = a & 1, a >> 1
        for r in (0, 1):
            variants.append(RecurrentVariant(kind, 1 + r, bool(r ^ a0), bool(r ^ a1), bool(r ^ a0 ^ a1)))
    return tuple(variants)


RECURRENT: dict[str, RecurrentVariant] = {v.name: v for v in _pairwise()}


def recurrent_module(v: RecurrentVariant) -> nn.Module:
    """The variant's torch.nn module in eval mode, seeded (its weights are uniform draws)."""
    torch.manual_seed(0)
    cls = {"lstm": nn.LSTM, "gru": nn.GRU}.get(v.kind, nn.RNN)
    extra = {"nonlinearity": v.kind.removeprefix("rnn_")} if cls is nn.RNN else {}
    return cls(INPUT, HIDDEN, num_layers=v.layers, bidirectional=v.bidirectional, batch_first=v.batch_first,
               **extra).eval()


def recurrent_args(name: str) -> tuple[Any, ...]:
    """The variant's example args: the sequence, then (with `initial_state`) h0, or (h0, c0) for an LSTM."""
    v = RECURRENT[name]
    g = torch.Generator().manual_seed(1)
    shape = (BATCH, SEQ, INPUT) if v.batch_first else (SEQ, BATCH, INPUT)
    x = torch.randn(*shape, generator=g)
    if not v.initial_state:
        return (x,)
    state = (v.layers * (2 if v.bidirectional else 1), BATCH, HIDDEN)
    h0 = torch.randn(*state, generator=g)
    return (x, (h0, torch.randn(*state, generator=g))) if v.kind == "lstm" else (x, h0)


@functools.lru_cache(maxsize=None)
def recurrent_export(name: str) -> torch.export.ExportedProgram:
    """The variant exported as a user exports it (not decomposed). Callers must not mutate it."""
    return torch.export.export(recurrent_module(RECURRENT[name]), recurrent_args(name), strict=False)
