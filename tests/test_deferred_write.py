"""Weights hashed while they are written (issue #42): a large model held in memory gets deferred
digests as a memory-mapped checkpoint does, so the `.ptd` writer hashes each weight as it copies it
(one pass over the weights, overlapping the disk) instead of `lower` hashing them all first; a
mapped weight is read ahead of the copy. The files are the bytes hashing first gives, equal weights
still share one payload, a failure mid-write leaves no file, and the bytes do not depend on
PYTHONHASHSEED."""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from typing import Any
from pathlib import Path

import pytest
import torch

import texir
import texir.adapters.tensors as tensors
from texir.backends import xnnpack
from texir.emit import EmitOptions, emit
from texir.errors import PteError
from texir.ir import blob
from texir.ir.blob import Blob, deferred_blob
from texir.serialize import pte
from texir.serialize.pte.schema import PtdEntry, PtdFile

ROOT = Path(__file__).resolve().parent.parent
TAG = "weights"


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


@pytest.fixture(scope="module")
def exported() -> torch.export.ExportedProgram:
    """Six 4 KiB weights: layers 0 and 1 equal, layer 2 differing from layer 3 only at a quarter of
    its bytes (outside the first, middle and last 64 bytes a test's sample looks at), 4 and 5 apart."""
    torch.manual_seed(0)
    model = _Mlp().eval()
    with torch.no_grad():
        model.layers[1].weight.copy_(model.layers[0].weight)
        model.layers[3].weight.copy_(model.layers[2].weight)
        model.layers[3].weight.view(-1)[32 * 32 // 4] += 1.0
    return torch.export.export(model, (torch.randn(2, 32),))


def _write(ep: torch.export.ExportedProgram, out: Path) -> tuple[bytes, bytes]:
    lowered = texir.lower(ep, [xnnpack.partitioner()], cache=None).program
    program = emit(lowered, EmitOptions(external_constants=True, external_named_data=TAG))
    out.mkdir()
    for data in program.external:  # the delegates' named data; the undelegated weights apart (tag "model")
        pte.dump_ptd(data, out / f"{data.tag}.ptd")
    pte.dump(program, out / "model.pte")
    return (out / "model.pte").read_bytes(), b"".join((out / f"{d.tag}.ptd").read_bytes() for d in program.external)


def _defer_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tensors, "_DEFER_BYTES", 1024)
    monkeypatch.setattr(tensors, "_DEFER_IN_MEMORY_BYTES", 1)
    monkeypatch.setattr(tensors, "_SAMPLE", 64)
    # stand-ins an earlier test gave out for the same bytes would make this one hash them at import
    monkeypatch.setattr(tensors, "_STAND_INS", {})


def _write_deferred(
    ep: torch.export.ExportedProgram, out: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[tuple[bytes, bytes], list[int]]:
    """`_write` with every weight that can be deferred deferred, and the sizes of the payloads the
    writer hashed while it copied them."""
    _defer_everything(monkeypatch)
    copied: list[int] = []
    chunks = blob.HashingCopy.chunks

    def counted(self: blob.HashingCopy, payload: Blob) -> Iterator[memoryview]:
        if payload.deferred:
            copied.append(payload.nbytes)
        return chunks(self, payload)

    monkeypatch.setattr(blob.HashingCopy, "chunks", counted)
    return _write(ep, out), copied


def test_weights_in_memory_hashed_while_written_give_the_same_files(
    exported: torch.export.ExportedProgram, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (Runs in the worker, after whatever tests it ran before: twice an earlier test's leftover
    # registry state made these weights hash at import; tests/conftest.py now guards the registry.)
    before = _write(exported, tmp_path / "hashed_first")  # 16 KiB of weights: hashed when converted
    deferred, copied = _write_deferred(exported, tmp_path / "hashed_while_written", monkeypatch)
    assert deferred == before
    # layers 4 and 5 were hashed by the writer; 0 and 1 (equal), 2 and 3 (equal samples) at import
    assert copied == [4096, 4096], copied
    ptd = pte.loads_ptd(before[1])
    payloads = [bytes(e.data.view()) for e in ptd.entries]
    weights = [p.detach().numpy().tobytes() for n, p in exported.named_parameters() if n.endswith("weight")]
    assert payloads.count(weights[0]) == 1 and weights[2] in payloads and weights[3] in payloads


@pytest.mark.parametrize("side", ["bridge", "native"])
def test_a_tied_weight_is_written_as_hashing_first_writes_it(side: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A tied embedding and head with deferred digests, in one `.ptd` with the delegate's named
    data. Through ExecuTorch's XNNPACK backend the head's use becomes the backend's own copy of the
    bytes (digest known) while the embedding keeps the program's (deferred): one segment, as
    hashing first writes it (the 1B fp32 Llama through the bridge failed to write: "equal payloads
    that a deferred digest kept apart"). Natively both uses are Blobs carrying one stand-in: the
    named data's key is the real digest even once the Blob registered last is gone (the 1B's
    `.ptd` and `.pte` named the head's weight by its stand-in)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from texir.executorch import executorch_partitioner

    torch.manual_seed(0)
    ep = torch.export.export(_Tied().eval(), (torch.tensor([[1, 5, 9]]),))
    partitioner = executorch_partitioner(XnnpackPartitioner()) if side == "bridge" else xnnpack.partitioner()

    def write(out: Path) -> list[bytes]:
        lowered = texir.lower(ep, [partitioner], cache=None).program
        # (one file for the program's weights and the delegate's, as ExecuTorch's LLM export writes)
        shared = "_default_external_constant"
        program = emit(lowered, EmitOptions(external_constants=True, external_named_data=shared))
        out.mkdir()
        (data,) = program.external
        pte.dump_ptd(data, out / f"{data.tag}.ptd")
        pte.dump(program, out / "model.pte")
        return [(out / name).read_bytes() for name in sorted(p.name for p in out.iterdir())]

    hashed_first = write(tmp_path / "hashed_first")
    _defer_everything(monkeypatch)
    assert write(tmp_path / "deferred") == hashed_first
    weight = ep.state_dict["embed.weight"].detach().numpy().tobytes()
    (ptd,) = (tmp_path / "deferred").glob("*.ptd")
    entries = pte.loads_ptd(ptd.read_bytes()).entries
    assert len(entries) == 2 and all(bytes(e.data.view()) == weight for e in entries)  # one segment, two keys
    assert hashlib.sha256(weight).hexdigest() in [e.key for e in entries]  # the named data's key


def test_small_programs_in_memory_keep_digests_that_name_their_bytes() -> None:
    big = torch.arange(1 << 19, dtype=torch.int32)  # 2 MiB, in memory
    (digest,) = tensors.tensor_digests([big], ["big"])
    assert digest == hashlib.sha256(big.numpy().tobytes()).hexdigest()


def test_hash_at_import_switch_turns_deferral_off(monkeypatch: pytest.MonkeyPatch) -> None:
    _defer_everything(monkeypatch)
    weight = torch.arange(1 << 12, dtype=torch.int32)
    (stand_in,) = tensors.tensor_digests([weight], ["w"])
    assert stand_in != hashlib.sha256(weight.numpy().tobytes()).hexdigest()
    monkeypatch.setenv("TEXIR_HASH_AT_IMPORT", "1")
    other = weight + 1
    (digest,) = tensors.tensor_digests([other], ["other"])
    assert digest == hashlib.sha256(other.numpy().tobytes()).hexdigest()


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads Linux's /proc/self/maps")
def test_mapped_weights_are_read_ahead_and_in_memory_ones_are_not(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(3 << 20))
    with open(path, "rb") as fh:
        mapping = mmap.mmap(fh.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    mapped = torch.frombuffer(mapping, dtype=torch.uint8)
    in_memory = (mapped[: 2 << 20].to(torch.int16) + 1).to(torch.uint8)
    monkeypatch.setattr(tensors, "_DEFER_IN_MEMORY_BYTES", 1)
    digests = tensors.tensor_digests([mapped, in_memory], ["mapped", "in memory"])
    datas = [tensors.tensor_data_from_tensor(t, digest=d).data for t, d in zip([mapped, in_memory], digests)]
    assert all(d is not None and d.deferred for d in datas)
    assert datas[0] is not None and datas[0]._read_ahead is not None
    assert datas[1] is not None and datas[1]._read_ahead is None
    monkeypatch.setattr(blob.HashingCopy, "_SLICE", 1 << 20)
    ptd = PtdFile(tag=TAG, entries=tuple(PtdEntry(key=d.digest(), data=d, alignment=16) for d in datas if d))
    pte.dump_ptd(ptd, tmp_path / "out.ptd")
    known = PtdFile(tag=TAG, entries=tuple(
        PtdEntry(key=hashlib.sha256(t.numpy().tobytes()).hexdigest(), data=Blob(t.numpy().tobytes()), alignment=16)
        for t in (mapped, in_memory)))
    assert (tmp_path / "out.ptd").read_bytes() == pte.dumps_ptd(known)


def _asking(size: int, seed: int, asked: list[tuple[int, int, int]], fail: bool = False) -> Blob:
    data = bytes((seed * 31 + i * 7) % 251 for i in range(size))

    def read_ahead(start: int, nbytes: int) -> None:
        asked.append((seed, start, nbytes))
        if fail:
            raise OSError("no read-ahead here")

    return deferred_blob(data, hashlib.sha256(b"stand-in %d" % seed).hexdigest(), read_ahead=read_ahead)


@pytest.mark.parametrize("fail", [False, True], ids=["hints", "failing_hints"])
def test_read_ahead_asks_for_every_slice_in_copy_order_and_changes_no_byte(
    fail: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(blob.HashingCopy, "_SLICE", 1000)
    monkeypatch.setattr(blob.HashingCopy, "_AHEAD", 2)
    asked: list[tuple[int, int, int]] = []
    a, b = _asking(2500, 1, asked, fail), _asking(1200, 2, asked, fail)
    ptd = PtdFile(tag=TAG, entries=(PtdEntry(key=a.digest(), data=a, alignment=16),
                                    PtdEntry(key="small", data=Blob(b"x" * 100), alignment=16),
                                    PtdEntry(key=b.digest(), data=b, alignment=16)))
    pte.dump_ptd(ptd, tmp_path / "out.ptd")
    assert sorted(asked) == [(1, 0, 1000), (1, 1000, 1000), (1, 2000, 500), (2, 0, 1000), (2, 1000, 200)]
    known = PtdFile(tag=TAG, entries=tuple(
        PtdEntry(key=blob.real_digest(e.key), data=Blob(e.data.tobytes()), alignment=16) for e in ptd.entries))
    assert (tmp_path / "out.ptd").read_bytes() == pte.dumps_ptd(known)


def test_a_failure_in_the_middle_of_the_copy_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blob.HashingCopy, "_SLICE", 1000)
    asked: list[tuple[int, int, int]] = []
    payload = _asking(5000, 3, asked)
    chunks = blob.HashingCopy.chunks

    def broken(self: blob.HashingCopy, p: Blob) -> Iterator[memoryview]:
        for k, piece in enumerate(chunks(self, p)):
            if k == 2:
                raise OSError(28, "No space left on device")
            yield piece

    monkeypatch.setattr(blob.HashingCopy, "chunks", broken)
    out = tmp_path / "out.ptd"
    with pytest.raises(PteError, match="No space left on device"):
        pte.dump_ptd(PtdFile(tag=TAG, entries=(PtdEntry(key=payload.digest(), data=payload),)), out)
    assert list(tmp_path.iterdir()) == []


_SEEDED = """
import hashlib, sys, torch
import texir.adapters.tensors as tensors
from texir.serialize import pte
from texir.serialize.pte.schema import PtdEntry, PtdFile
tensors._DEFER_BYTES, tensors._DEFER_IN_MEMORY_BYTES, tensors._SAMPLE = 1024, 1, 64
g = torch.Generator().manual_seed(0)
ts = [torch.randn(1024, generator=g) for _ in range(5)] + [torch.zeros(512), torch.zeros(512)]
ts[1] = ts[0].clone()
names = [f"w{i}" for i in range(len(ts))]
entries = []
for t, d, n in zip(ts, tensors.tensor_digests(ts, names), names):
    data = tensors.tensor_data_from_tensor(t, digest=d).data
    entries.append(PtdEntry(key=n, data=data, alignment=64))
print("deferred", sum(e.data.deferred for e in entries))
pte.dump_ptd(PtdFile(tag="w", entries=tuple(entries)), sys.argv[1])
print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())
"""


def test_deferred_write_bytes_do_not_depend_on_hash_seed(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    outputs: set[str] = set()
    for seed in ("0", "1", "4242"):
        done = subprocess.run([sys.executable, "-c", _SEEDED, str(tmp_path / f"{seed}.ptd")], cwd=ROOT,
                              env={**env, "PYTHONHASHSEED": seed}, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        deferred, digest = done.stdout.strip().splitlines()[-2:]
        assert deferred == "deferred 3"  # w2, w3, w4 hashed by the writer; w0 == w1 and the zeros at once
        outputs.add(digest)
    assert len(outputs) == 1
    data = (tmp_path / "0.ptd").read_bytes()
    assert len({e.data.tobytes() for e in pte.loads_ptd(data).entries}) == 5
    data_size = struct.unpack_from("<Q", data, 8 + 32)[0]
    assert data_size == 4 * 4096 + 2048  # equal payloads (w0 and w1, the two zeros) share one segment each


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="O_DIRECT is Linux's")
@pytest.mark.parametrize("refuse", [False, True], ids=["direct", "refused_by_the_file_system"])
def test_large_files_are_written_past_the_page_cache_with_the_same_bytes(
    refuse: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import fcntl

    from texir import _io

    monkeypatch.setattr(_io, "_DIRECT_BYTES", 1)
    monkeypatch.setattr(_io, "_DIRECT_BLOCK", 1 << 16)  # 64 KiB blocks: whole ones, then a tail
    modes: list[tuple[bool, bool]] = []
    set_direct = _io._set_direct

    def recorded(fd: int, on: bool) -> bool:
        modes.append((on, set_direct(fd, on)))
        return modes[-1][1]

    monkeypatch.setattr(_io, "_set_direct", recorded)
    write = os.write
    refused: list[int] = []

    def maybe_refusing(fd: int, data: Any) -> int:
        if refuse and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return write(fd, data)

    monkeypatch.setattr(_io.os, "write", maybe_refusing)
    asked: list[tuple[int, int, int]] = []
    deferred = _asking(150_001, 5, asked)
    ptd = PtdFile(tag=TAG, entries=(PtdEntry(key=deferred.digest(), data=deferred, alignment=16),
                                    PtdEntry(key="plain", data=Blob(os.urandom(70_003)), alignment=64)))
    pte.dump_ptd(ptd, tmp_path / "out.ptd")
    known = PtdFile(tag=TAG, entries=tuple(
        PtdEntry(key=blob.real_digest(e.key), data=Blob(e.data.tobytes()), alignment=e.alignment)
        for e in ptd.entries))
    assert (tmp_path / "out.ptd").read_bytes() == pte.dumps_ptd(known)
    if modes[0] == (True, True):  # the file system takes O_DIRECT (tmpfs before Linux 6.6 does not)
        assert modes[-1] == (False, True) and bool(refused) == refuse
    assert [p.name for p in tmp_path.iterdir()] == ["out.ptd"]


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="O_DIRECT is Linux's")
def test_a_full_disk_during_a_direct_write_is_a_pte_error_and_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from texir import _io

    monkeypatch.setattr(_io, "_DIRECT_BYTES", 1)
    monkeypatch.setattr(_io, "_DIRECT_BLOCK", 1 << 16)
    write = os.write
    calls: list[int] = []

    def filling(fd: int, data: Any) -> int:
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return write(fd, data)

    monkeypatch.setattr(_io.os, "write", filling)
    ptd = PtdFile(tag=TAG, entries=(PtdEntry(key="plain", data=Blob(os.urandom(300_000)), alignment=64),))
    with pytest.raises(PteError, match="No space left on device"):
        pte.dump_ptd(ptd, tmp_path / "out.ptd")
    assert list(tmp_path.iterdir()) == [] and len(calls) == 2


class _Tied(torch.nn.Module):
    """An embedding tied to the output projection, as small Llamas are: one tensor, two names."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, 32)
        self.head = torch.nn.Linear(32, 64, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.embed(ids)))


def test_a_tensor_under_two_names_shares_one_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    _defer_everything(monkeypatch)
    weight = torch.arange(1 << 12, dtype=torch.float32)
    first, second = tensors.tensor_digests([weight, weight], ["embed", "head"])
    assert first == second and first in tensors._STAND_INS  # one payload, deferred
    copy = weight.clone()  # the same bytes in another storage: hashed now, one digest
    a, b = tensors.tensor_digests([weight, copy], ["a", "b"])
    assert a == b == hashlib.sha256(weight.numpy().tobytes()).hexdigest()


def test_tied_weights_deferred_give_the_same_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    torch.manual_seed(0)
    ep = torch.export.export(_Tied().eval(), (torch.tensor([[1, 5, 7]]),))
    before = _write(ep, tmp_path / "hashed_first")
    deferred, copied = _write_deferred(ep, tmp_path / "deferred", monkeypatch)
    assert deferred == before
    # the tied weight is in both files (the embedding's constant, the projection's named data),
    # hashed while each is written, not at import (two names for one tensor used to force that)
    assert copied == [64 * 32 * 4] * 2
