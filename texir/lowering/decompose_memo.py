"""Reusing a decomposition when only weights changed.

Decomposing a program (torch's `run_decompositions`, a full retrace) reads its structure (nodes,
arguments, shapes, dtypes, provenance, signature) and never its weights' values: torch traces on
fake tensors. So the decomposed program of a model whose weights changed is the old decomposed
program with the new weights. `decomposition_key` hashes the structure with every state payload and
content hash blanked; `template_of` keeps a decomposed program without payloads (only when each of its
state entries is one of the undecomposed program's, same target, metadata and bytes: a decomposition
that made new state is not reused); `rebind_state` fills a template with another program's state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import msgspec

from texir.ir import Program, StateEntry
from texir.serialize import snapshot

__all__ = ["decomposition_key", "rebind_state", "template_of"]

_KEY_VERSION = b"texir-decomposition-1"


def _blank(entry: StateEntry) -> StateEntry:
    return msgspec.structs.replace(entry, value=msgspec.structs.replace(entry.value, sha256="", data=None))


def decomposition_key(aten: Program, keep: Sequence[str]) -> str:
    """A key for decomposing `aten` keeping the ops `keep`: equal for programs that differ only in
    their state's values."""
    structure = msgspec.structs.replace(aten, state=tuple(_blank(e) for e in aten.state))
    h = hashlib.sha256(_KEY_VERSION)
    for part in (msgspec.msgpack.encode(sorted(keep)), snapshot.dumps(structure, format="msgpack")):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def template_of(decomposed: Program, aten: Program) -> Program | None:
    """`decomposed` without state payloads, or None when some of its state is not `aten`'s as it is
    (then the state's values could come from the decomposition itself, and it is not reused)."""
    own = {e.target: e.value for e in aten.state}
    for entry in decomposed.state:
        mine = own.get(entry.target)
        if mine is None or mine.sha256 != entry.value.sha256 or mine.meta != entry.value.meta:
            return None
    return msgspec.structs.replace(decomposed, state=tuple(_blank(e) for e in decomposed.state))


def rebind_state(template: Program, aten: Program) -> Program:
    """`template` (from `template_of`) with the state of `aten`, a program of the same key."""
    own = {e.target: e for e in aten.state}
    return msgspec.structs.replace(template, state=tuple(own[e.target] for e in template.state))
