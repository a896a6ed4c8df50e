"""Deferred digests (issue #42): a payload memory-mapped from a checkpoint carries a stand-in
digest until the `.ptd` writer hashes it as it copies it; the files written equal those written
with every digest known first, equal payloads behind different digests included."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from texir.ir import blob as blob_module
from texir.ir.blob import Blob, deferred_blob, is_deferred, real_digest, resolve_digests
from texir.serialize import pte
from texir.serialize.pte.schema import PtdEntry, PtdFile


def _stand_in(name: str) -> str:
    return hashlib.sha256(b"test stand-in " + name.encode()).hexdigest()


def _payload(seed: int, size: int) -> bytes:
    return bytes((seed * 31 + i * 7) % 251 for i in range(size))


def _file(blobs: list[tuple[str, Blob]]) -> PtdFile:
    return PtdFile(tag="weights", entries=tuple(PtdEntry(key=key, data=blob, alignment=16) for key, blob in blobs))


def test_a_ptd_with_deferred_digests_is_written_as_with_known_ones(tmp_path: Path) -> None:
    a, b, c = _payload(1, 5000), _payload(2, 3000), _payload(3, 700)
    stand_ins = {"a": _stand_in("a"), "b": _stand_in("b")}
    deferred = [deferred_blob(a, stand_ins["a"]), deferred_blob(b, stand_ins["b"])]
    lazy = _file([(stand_ins["a"], deferred[0]), (stand_ins["b"], deferred[1]), ("c", Blob(c)),
                  ("a_again", deferred[0])])
    known = _file([(hashlib.sha256(a).hexdigest(), Blob(a)), (hashlib.sha256(b).hexdigest(), Blob(b)),
                   ("c", Blob(c)), ("a_again", Blob(a))])
    assert all(blob.deferred and blob.digest() in stand_ins.values() for blob in deferred)
    pte.dump_ptd(lazy, tmp_path / "lazy.ptd")
    pte.dump_ptd(known, tmp_path / "known.ptd")
    assert (tmp_path / "lazy.ptd").read_bytes() == (tmp_path / "known.ptd").read_bytes() == pte.dumps_ptd(known)
    assert [blob.content_digest() for blob in deferred] == [hashlib.sha256(a).hexdigest(), hashlib.sha256(b).hexdigest()]
    assert real_digest(stand_ins["b"]) == hashlib.sha256(b).hexdigest() and real_digest("c") == "c"
    assert resolve_digests(b"key " + stand_ins["a"].encode()) == b"key " + hashlib.sha256(a).hexdigest().encode()
    loaded = pte.loads_ptd((tmp_path / "lazy.ptd").read_bytes())
    assert [e.key for e in loaded.entries] == [e.key for e in known.entries]


def test_equal_payloads_behind_two_stand_ins_are_written_as_with_known_digests(tmp_path: Path) -> None:
    """Two weights of equal bytes, each behind its own stand-in: the streamed write finds them equal
    only once hashed, so the file is written again by content (one segment for both, as known
    digests lay it out); no temporary file is left behind."""
    same = _payload(4, 4096)
    one, two = deferred_blob(same, _stand_in("one")), deferred_blob(bytes(same), _stand_in("two"))
    other = _payload(5, 300)
    real = hashlib.sha256(same).hexdigest()
    lazy = _file([("one", one), ("other", Blob(other)), ("two", two)])
    known = _file([("one", Blob(same)), ("other", Blob(other)), ("two", Blob(same))])
    pte.dump_ptd(lazy, tmp_path / "lazy.ptd")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lazy.ptd"]
    assert (tmp_path / "lazy.ptd").read_bytes() == pte.dumps_ptd(known) == pte.dumps_ptd(lazy)
    loaded = pte.loads_ptd((tmp_path / "lazy.ptd").read_bytes())
    assert [e.data.digest() for e in loaded.entries] == [real, hashlib.sha256(other).hexdigest(), real]


def test_a_deferred_payload_equal_to_a_known_one_shares_its_segment(tmp_path: Path) -> None:
    """A tied weight: one use in the program (a deferred payload of the export's tensor), one in a
    backend's named data (its own copy of the bytes, digest known): one segment, as ExecuTorch's
    writer gives, in the `.ptd` and in a `.pte`'s named data."""
    weight = _payload(6, 8192)
    tied = deferred_blob(weight, _stand_in("tied"))
    copied = Blob(bytes(weight))
    real = hashlib.sha256(weight).hexdigest()
    lazy = _file([("embedding.weight", tied), (real, copied)])
    known = _file([("embedding.weight", Blob(weight)), (real, Blob(weight))])
    pte.dump_ptd(lazy, tmp_path / "lazy.ptd")
    assert (tmp_path / "lazy.ptd").read_bytes() == pte.dumps_ptd(known)
    assert len(pte.dumps_ptd(known)) < len(pte.dumps_ptd(_file([("a", Blob(weight)), ("b", Blob(_payload(7, 8192)))])))

    from texir.serialize.pte.schema import NamedBlob, Program, PteProgram

    def program(first: Blob, second: Blob) -> PteProgram:
        return PteProgram(program=Program(), named_data=(NamedBlob(key="a", data=first), NamedBlob(key="b", data=second)))

    assert pte.dumps(program(deferred_blob(weight, _stand_in("tied again")), Blob(bytes(weight)))) == pte.dumps(
        program(Blob(weight), Blob(bytes(weight))))


def test_a_stand_in_resolves_while_any_payload_carrying_it_lives() -> None:
    """A tied weight's two uses may be two Blobs carrying one stand-in: it resolves to the real
    digest while either lives (it named the 1B Llama's head weight in its files once the Blob
    registered last was gone), and its entry goes with the last of them."""
    import gc

    weight = _payload(8, 2048)
    stand_in = _stand_in("two uses")
    first = deferred_blob(weight, stand_in)
    second = deferred_blob(memoryview(weight), stand_in)
    real = hashlib.sha256(weight).hexdigest()
    assert second.content_digest() == real
    del second
    gc.collect()
    assert resolve_digests(b"key " + stand_in.encode()) == b"key " + real.encode()
    assert is_deferred(stand_in) and real_digest(stand_in) == real and first.content_digest() == real
    del first
    gc.collect()
    assert not is_deferred(stand_in) and stand_in not in blob_module._DEFERRED
    assert resolve_digests(b"key " + stand_in.encode()) == b"key " + stand_in.encode()


def test_snapshot_files_name_deferred_payloads_by_their_real_digest() -> None:
    import msgspec

    from texir.serialize import snapshot
    from texir.testing.programs import chain_program

    program = chain_program()
    entry = program.state[0]
    data = entry.value.data
    assert data is not None
    stand_in = _stand_in("snapshot")
    lazy = msgspec.structs.replace(program, state=(msgspec.structs.replace(entry, value=msgspec.structs.replace(
        entry.value, sha256=stand_in, data=deferred_blob(data.view(), stand_in))), *program.state[1:]))
    assert stand_in.encode() in snapshot.dumps(lazy)  # as is: in-process keys
    assert snapshot.dumps_value(lazy) == snapshot.dumps_value(program)
    assert stand_in.encode() in snapshot.dumps(lazy, format="msgpack")


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads Linux's /proc/self/maps")
def test_only_large_tensors_mapped_from_a_file_get_a_stand_in(tmp_path: Path) -> None:
    import mmap
    import os

    import torch

    from texir.adapters import tensors

    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(3 << 20))
    with open(path, "rb") as fh:
        mapping = mmap.mmap(fh.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    mapped = torch.frombuffer(mapping, dtype=torch.uint8)
    small = mapped[: 1 << 10]
    in_memory = mapped.clone()
    stand_ins = tensors.tensor_digests([mapped, small, in_memory], ["mapped", "small", "in memory"])
    real = hashlib.sha256(path.read_bytes()).hexdigest()
    assert stand_ins[0] == stand_ins[2] == real  # a copy shares its sample: both hashed at once, as equal
    assert stand_ins[1] == hashlib.sha256(path.read_bytes()[: 1 << 10]).hexdigest()
    alone = tensors.tensor_digests([mapped], ["mapped"])[0]
    data = tensors.tensor_data_from_tensor(mapped, digest=alone).data
    assert alone != real and data is not None and data.deferred and data.content_digest() == real
