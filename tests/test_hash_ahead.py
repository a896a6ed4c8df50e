"""Weights hashed beside the export (issue #42): `weightless` starts hashing a large model's real
weights on a background thread while torch exports the fake ones; conversion takes those digests
(the right ones: a weight changed since is hashed again) and the files are the same bytes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

import texir
import texir.adapters.tensors as tensors
from texir.adapters import attach_weights, weightless
from texir.backends import xnnpack
from texir.emit import EmitOptions, emit
from texir.ir import blob
from texir.serialize import pte


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def _ahead_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tensors, "_DEFER_BYTES", 1024)  # the 16 KiB weights count as large
    monkeypatch.setattr(tensors, "_DEFER_IN_MEMORY_BYTES", 1)
    monkeypatch.setattr(tensors, "_AHEAD", {})


def _files(model: torch.nn.Module, out: Path) -> tuple[bytes, bytes]:
    args = (torch.randn(2, 64),)
    with weightless(model) as weights:
        ep = torch.export.export(model, args)
    ep = attach_weights(ep, weights)
    lowered = texir.lower(ep, [xnnpack.partitioner()], cache=None).program
    program = emit(lowered, EmitOptions(external_constants=True, external_named_data="weights"))
    (data,) = program.external
    out.mkdir()
    pte.dump_ptd(data, out / "model.ptd")
    pte.dump(program, out / "model.pte")
    return (out / "model.pte").read_bytes(), (out / "model.ptd").read_bytes()


def test_large_weights_are_hashed_beside_the_export_and_give_the_same_files(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    model = _Mlp().eval()
    before = _files(model, tmp_path / "plain")  # 16 KiB of weights: hashed when converted
    _ahead_everything(monkeypatch)
    hashed_at_import: list[int] = []
    many = blob.sha256_many

    def counted(payloads: list[memoryview]) -> list[str]:
        hashed_at_import.extend(memoryview(p).nbytes for p in payloads)
        return many(payloads)

    monkeypatch.setattr(tensors, "sha256_many", counted)
    assert _files(model, tmp_path / "ahead") == before
    weights = [layer.weight for layer in model.layers]
    assert all(id(w) in tensors._AHEAD for w in weights)
    assert 64 * 64 * 4 not in hashed_at_import  # no weight hashed again at conversion (biases are small)


def test_a_weight_changed_after_its_hash_is_hashed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    _ahead_everything(monkeypatch)
    weight = torch.arange(1 << 12, dtype=torch.float32)
    tensors.hash_ahead([weight])
    (_, _, _, future) = tensors._AHEAD[id(weight)]
    future.result()
    with torch.no_grad():
        weight.add_(1.0)  # bumps the version: the digest hashed ahead is stale
    monkeypatch.setattr(tensors, "_DEFER_IN_MEMORY_BYTES", 1 << 40)  # hashed at conversion, not deferred
    (digest,) = tensors.tensor_digests([weight], ["w"])
    assert digest == hashlib.sha256(weight.numpy().tobytes()).hexdigest()
    assert id(weight) not in tensors._AHEAD


def test_small_models_and_the_switch_start_no_hashes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tensors, "_AHEAD", {})
    weight = torch.zeros(1 << 20, dtype=torch.int32)  # 4 MiB: below the 1 GiB a model needs
    tensors.hash_ahead([weight])
    assert tensors._AHEAD == {}
    _ahead_everything(monkeypatch)
    monkeypatch.setenv("TEXIR_HASH_AT_IMPORT", "1")
    tensors.hash_ahead([weight])
    assert tensors._AHEAD == {}


def test_an_entry_goes_with_its_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    _ahead_everything(monkeypatch)
    weight = torch.ones(1 << 12)
    tensors.hash_ahead([weight])
    tensors._AHEAD[id(weight)][3].result()
    del weight
    assert tensors._AHEAD == {}
