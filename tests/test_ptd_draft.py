"""`PtdDraft` (issue 42): a `.ptd` written from a prediction before its program exists, finished by
`dump_ptd(..., draft=...)`. Whatever the prediction, the file is byte-equal to `dump_ptd` without a
draft; what the draft put in place is not written again, and digests it computed are not computed
again."""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

import pytest

from texir.errors import PteError
from texir.ir.blob import Blob, deferred_blob
from texir.serialize.pte.ptd import _layout
from texir.serialize.pte.ptd_draft import identity
from texir.serialize.pte import PtdDraft, PtdEntry, PtdFile, ScalarType, TensorLayout, dump_ptd, dumps_ptd

KEY = 64  # a digest key's length: what a prediction gives for keys it cannot know yet


def _payloads(seed: int, sizes: list[int]) -> list[bytearray]:
    rng = random.Random(seed)
    return [bytearray(rng.randbytes(n)) for n in sizes]


def _named(data: bytearray, *, deferred: bool = False) -> PtdEntry:
    """A backend's named payload, keyed by its digest (a stand-in until hashed when `deferred`)."""
    digest = hashlib.sha256(data).hexdigest()
    if deferred:
        stand_in = hashlib.sha256(b"stand-in" + bytes(data[:64])).hexdigest()
        return PtdEntry(key=stand_in, data=deferred_blob(memoryview(data), stand_in), alignment=16)
    return PtdEntry(key=digest, data=Blob(memoryview(data), digest=digest), alignment=16)


def _external(name: str, data: bytearray) -> PtdEntry:
    layout = TensorLayout(scalar_type=ScalarType.BYTE, sizes=(len(data),), dim_order=(0,))
    return PtdEntry(key=name, data=Blob(memoryview(data)), layout=layout)


def _guess(entries: list[PtdEntry]) -> PtdFile:
    """A prediction: the same memory, digest keys unknown (any distinct 64 characters)."""
    return PtdFile(entries=tuple(
        PtdEntry(key=e.key if e.layout is not None else f"{i:?>{KEY}}", data=Blob(e.data.view()),
                 alignment=e.alignment, layout=e.layout)
        for i, e in enumerate(entries)))


def _offsets(ptd: PtdFile) -> dict[tuple[int, int], int]:
    """Where each payload's memory lands in the file `ptd` gives."""
    head, pieces, _ = _layout(ptd)
    at, out = len(head), {}
    for pad, blob in pieces:
        out[identity(blob)] = at + pad
        at += pad + blob.nbytes
    return out


@pytest.fixture
def payloads() -> list[bytearray]:
    return _payloads(0, [1000, 4096, 70_000, 5, 130, 33_333, 4096])


def _real(payloads: list[bytearray], *, deferred: bool = False) -> list[PtdEntry]:
    return [_external("embed.weight", payloads[0]), _external("norm.weight", payloads[3]),
            *(_named(p, deferred=deferred) for p in (payloads[1], payloads[2], payloads[4], payloads[5], payloads[6]))]


def test_a_right_prediction_is_kept_whole_and_gives_the_same_bytes(tmp_path: Path, payloads: list[bytearray]) -> None:
    entries = _real(payloads)
    ptd = PtdFile(entries=tuple(entries))
    with PtdDraft(tmp_path / "m.ptd", _guess(entries)) as draft:
        dump_ptd(ptd, tmp_path / "m.ptd", draft=draft)
    assert (tmp_path / "m.ptd").read_bytes() == dumps_ptd(ptd)
    assert draft.outcome.used and draft.outcome.rewritten == 0
    assert draft.outcome.kept == sum(len(p) for p in payloads)
    assert [p.name for p in tmp_path.iterdir()] == ["m.ptd"]  # no temporary file left


def test_deferred_digests_come_from_the_draft(tmp_path: Path, payloads: list[bytearray]) -> None:
    """Deferred payloads (stand-in keys) get their real digests from the draft's hashes: the header
    names them as a plain dump does, and nothing hashes them after the lowering."""
    entries = _real(payloads, deferred=True)
    with PtdDraft(tmp_path / "m.ptd", _guess(entries)) as draft:
        dump_ptd(PtdFile(entries=tuple(entries)), tmp_path / "m.ptd", draft=draft)
    assert all(e.data._content is not None for e in entries if e.data.deferred)
    plain = PtdFile(entries=tuple(entries))
    assert (tmp_path / "m.ptd").read_bytes() == dumps_ptd(plain)
    assert hashlib.sha256(payloads[2]).hexdigest().encode() in (tmp_path / "m.ptd").read_bytes()


@pytest.mark.parametrize("seed", range(6))
def test_a_wrong_order_rewrites_only_what_moved(tmp_path: Path, payloads: list[bytearray], seed: int) -> None:
    """Named payloads predicted in another order: same bytes; the payloads predicted in place are
    kept (equal sizes swapped keep their offsets but not their bytes: rewritten)."""
    entries = _real(payloads)
    guess = list(entries)
    tail = guess[2:]
    random.Random(seed).shuffle(tail)
    guess[2:] = tail
    ptd = PtdFile(entries=tuple(entries))
    with PtdDraft(tmp_path / "m.ptd", _guess(guess)) as draft:
        dump_ptd(ptd, tmp_path / "m.ptd", draft=draft)
    assert (tmp_path / "m.ptd").read_bytes() == dumps_ptd(ptd)
    real, drafted = _offsets(ptd), _offsets(_guess(guess))
    moved = sum(size for (address, size), at in real.items() if drafted[(address, size)] != at)
    assert draft.outcome.used and draft.outcome.rewritten == moved
    assert draft.outcome.kept + moved == sum(len(p) for p in payloads)


def test_missing_and_extra_predictions(tmp_path: Path, payloads: list[bytearray]) -> None:
    """A prediction that drafts a payload the file does not hold and misses one it does: the
    header length may still agree (same count of digest keys), and the stale bytes are overwritten."""
    entries = _real(payloads)
    other = _payloads(1, [70_000])[0]
    guess = [*entries[:3], _named(other), *entries[4:]]  # the 70,000-byte payload replaced by another
    ptd = PtdFile(entries=tuple(entries))
    with PtdDraft(tmp_path / "m.ptd", _guess(guess)) as draft:
        dump_ptd(ptd, tmp_path / "m.ptd", draft=draft)
    assert (tmp_path / "m.ptd").read_bytes() == dumps_ptd(ptd)
    assert draft.outcome.used and draft.outcome.rewritten == 70_000


def test_other_entries_drop_the_draft(tmp_path: Path, payloads: list[bytearray]) -> None:
    """A prediction with fewer entries gives another header: the draft is dropped, the file written
    as without one."""
    entries = _real(payloads)
    ptd = PtdFile(entries=tuple(entries))
    with PtdDraft(tmp_path / "m.ptd", _guess(entries[:-1])) as draft:
        dump_ptd(ptd, tmp_path / "m.ptd", draft=draft)
    assert (tmp_path / "m.ptd").read_bytes() == dumps_ptd(ptd)
    assert not draft.outcome.used and "header" in draft.outcome.why
    assert [p.name for p in tmp_path.iterdir()] == ["m.ptd"]


def test_bytes_changed_since_the_draft_are_written_again(tmp_path: Path, payloads: list[bytearray]) -> None:
    """A payload whose memory changed after it was drafted (its known digest disagrees with the
    draft's hash) is not trusted: written again."""
    entries = _real(payloads)
    with PtdDraft(tmp_path / "m.ptd", _guess(entries)) as draft:
        draft._thread.join()
        payloads[2][0] ^= 0xFF
        changed = _real(payloads)  # digests of the new bytes, same memory
        ptd = PtdFile(entries=tuple(changed))
        dump_ptd(ptd, tmp_path / "m.ptd", draft=draft)
    assert (tmp_path / "m.ptd").read_bytes() == dumps_ptd(ptd)
    assert draft.outcome.rewritten == 70_000


def test_an_unused_draft_leaves_nothing(tmp_path: Path, payloads: list[bytearray]) -> None:
    with PtdDraft(tmp_path / "m.ptd", _guess(_real(payloads))):
        pass
    assert list(tmp_path.iterdir()) == []


def test_a_read_only_destination_is_refused_before_drafting(tmp_path: Path, payloads: list[bytearray]) -> None:
    target = tmp_path / "m.ptd"
    target.write_bytes(b"old")
    os.chmod(target, 0o444)  # refused by its mode, also for root
    with pytest.raises(PteError, match="read-only"):
        PtdDraft(target, _guess(_real(payloads)))
    assert [p.name for p in tmp_path.iterdir()] == ["m.ptd"]


def test_a_large_draft_goes_past_the_page_cache(tmp_path: Path) -> None:
    """Files from 64 MiB up are drafted with O_DIRECT where the file system allows it; the result
    is the same bytes, also with a payload predicted at the wrong place."""
    big = _payloads(2, [40 << 20, 30 << 20, 3_000])
    entries = [_named(big[0], deferred=True), _named(big[1], deferred=True), _named(big[2])]
    ptd = PtdFile(entries=tuple(entries))
    with PtdDraft(tmp_path / "m.ptd", _guess([entries[1], entries[0], entries[2]])) as draft:
        dump_ptd(ptd, tmp_path / "m.ptd", draft=draft)
    assert hashlib.sha256((tmp_path / "m.ptd").read_bytes()).digest() == hashlib.sha256(dumps_ptd(ptd)).digest()
    assert draft.outcome.used and draft.outcome.kept == 3_000


def test_a_missing_directory_is_a_pte_error(tmp_path: Path, payloads: list[bytearray]) -> None:
    with pytest.raises(PteError, match="cannot write"):
        PtdDraft(tmp_path / "nowhere" / "m.ptd", _guess(_real(payloads)))


def test_a_draft_is_used_once(tmp_path: Path, payloads: list[bytearray]) -> None:
    """A second `dump_ptd` with a used draft writes its file afresh, with the same bytes."""
    entries = _real(payloads)
    ptd = PtdFile(entries=tuple(entries))
    with PtdDraft(tmp_path / "m.ptd", _guess(entries)) as draft:
        dump_ptd(ptd, tmp_path / "m.ptd", draft=draft)
        dump_ptd(ptd, tmp_path / "again.ptd", draft=draft)
    assert (tmp_path / "again.ptd").read_bytes() == (tmp_path / "m.ptd").read_bytes() == dumps_ptd(ptd)
    assert draft.outcome.used


def test_a_full_disk_while_finishing_is_a_pte_error_and_leaves_no_file(
    tmp_path: Path, payloads: list[bytearray], monkeypatch: pytest.MonkeyPatch
) -> None:
    from texir.serialize.pte import ptd_draft

    entries = _real(payloads)
    guess = [*entries[:2], entries[3], entries[2], *entries[4:]]  # something to write after lowering

    def full(fd: int, data: object, at: int) -> int:
        raise OSError(28, "No space left on device")

    with PtdDraft(tmp_path / "m.ptd", _guess(guess)) as draft:
        draft._thread.join()
        monkeypatch.setattr(ptd_draft.os, "pwrite", full)
        with pytest.raises(PteError, match="No space left on device"):
            dump_ptd(PtdFile(entries=tuple(entries)), tmp_path / "m.ptd", draft=draft)
    assert list(tmp_path.iterdir()) == []
