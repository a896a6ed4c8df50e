"""Weight digests: `tensor_digests` hashes large tensors in threads, `digest_memo` hashes a tensor
once per block (reused only for the same object at the same version), and `lower` hashes each
weight once although it converts the program twice."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import tests.lowering_helpers as h
import texir.adapters.tensors as tensors
import texir.ir.blob as blob_module
from texir.adapters.tensors import digest_memo, tensor_data_from_tensor, tensor_digests
from texir.ir.blob import Blob, digest_all
from texir.lowering import OpSupportPartitioner
from texir.orchestrate import lower


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The sizes of the buffers texir.adapters.tensors hashes, in order."""
    sizes: list[int] = []
    real = hashlib.sha256

    class _Counting:
        @staticmethod
        def sha256(data: Any = b"") -> Any:
            sizes.append(memoryview(data).nbytes)
            return real(data)

    monkeypatch.setattr(tensors, "hashlib", _Counting)
    monkeypatch.setattr(blob_module, "hashlib", _Counting)
    yield sizes


def test_digest_all_fills_missing_digests_small_and_large() -> None:
    payloads = [b"abc", bytes(range(256)) * 8192, b"\0" * (3 << 20)]
    blobs = [Blob(p) for p in payloads] + [Blob(b"kept", digest="given")]
    digest_all(blobs)
    assert [b.digest() for b in blobs] == [hashlib.sha256(p).hexdigest() for p in payloads] + ["given"]


def test_digests_are_sha256_of_the_bytes_small_large_and_strided() -> None:
    torch.manual_seed(0)
    values = [torch.randn(3, 4), torch.randn(600, 600), torch.randn(700, 500).t(), torch.arange(10, dtype=torch.int64)]
    assert tensor_digests(values, [f"t{i}" for i in range(len(values))]) == [_sha(v) for v in values]
    assert [tensor_data_from_tensor(v).sha256 for v in values] == [_sha(v) for v in values]


def test_a_memo_hashes_a_tensor_once_and_again_after_an_in_place_write(hashed: list[int]) -> None:
    weight = torch.randn(512, 1024)  # 2 MiB: the threaded path
    with digest_memo():
        first = tensor_digests([weight], ["w"])[0]
        assert tensor_data_from_tensor(weight).sha256 == first
        assert tensor_digests([weight], ["w"]) == [first]
        assert len(hashed) == 1
        with torch.no_grad():
            weight.mul_(2.0)  # bumps the version counter
        second = tensor_digests([weight], ["w"])[0]
        assert second != first and second == _sha(weight)
        assert len(hashed) == 2
        other = weight.clone()  # equal bytes, another object: hashed on its own
        assert tensor_digests([other], ["o"]) == [second]
        assert len(hashed) == 3


def test_without_a_memo_every_call_hashes(hashed: list[int]) -> None:
    weight = torch.randn(64, 64)
    tensor_digests([weight], ["w"])
    weight.numpy()[0, 0] += 1.0  # a write torch does not see: no memo, so no stale digest
    assert tensor_digests([weight], ["w"]) == [_sha(weight)]
    assert len(hashed) == 2


class _Wide(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(1024, 512)
        self.b = torch.nn.Linear(512, 512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.b(torch.relu(self.a(x))))


class _KeepsLinear(OpSupportPartitioner):
    """Asks to keep linear undecomposed, so `lower` converts the program twice."""

    def ops_to_not_decompose(self, program: Any) -> list[str]:
        return ["aten::linear.default"]


def test_lower_hashes_each_weight_once(hashed: list[int]) -> None:
    ep = torch.export.export(_Wide().eval(), (torch.randn(2, 1024),), strict=False)
    partitioner = _KeepsLinear(h.TEST_BACKEND, {"aten::linear.default", "aten::relu.default"})
    lowered = lower(ep, [partitioner], cache=None).program
    big = sorted(n for n in hashed if n >= 512 * 512 * 4)
    assert big == [512 * 512 * 4, 1024 * 512 * 4]  # a.weight and b.weight, once each
    state = {e.target: e.value.sha256 for e in lowered.state}  # the partitioner leaves weights in the parent
    assert state["a.weight"] == _sha(ep.state_dict["a.weight"]) and state["b.weight"] == _sha(ep.state_dict["b.weight"])
