"""Golden hashes of the `.pte` bytes texir writes for every zoo model (as exported, core ATen, and with
every relu delegated to the reference backend): a refactor of the edge passes or the emitter must
not change one byte. Rewrite with `pytest --snapshot-update` only when a change of bytes is intended,
and say why in the commit."""

from __future__ import annotations

import functools
import hashlib
import json

from tests.zoo import ZOO, cached_export
from texir.adapters import from_exported_program
from texir.ir import CallFunction, Program
from texir.errors import PteError
from texir.lowering import OpSupportPartitioner, to_backend
from texir.backends import reference as _reference_backend  # noqa: F401  (registers it)
from texir.emit import emit
from texir.serialize.pte import dumps
from texir.testing.golden import Golden


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


@functools.cache
def _variants(name: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for decompose in (False, True):
        # allow_non_core: the bytes of every zoo program are pinned, including `norms`, whose
        # var_mean texir (like ExecuTorch's to_edge) refuses by default (tested in test_decompose_parity)
        program = from_exported_program(cached_export(name, decompose), decompose=decompose, allow_non_core=True)
        key = "core_aten" if decompose else "exported"
        try:
            out[key] = _sha(dumps(emit(program)))
        except PteError as exc:  # e.g. a non-core op with no out variant: the error is golden too
            out[key] = f"{type(exc).__name__}: {str(exc)[:80]}"
        if decompose and _has(program, "aten::relu.default"):
            lowered = to_backend(program, OpSupportPartitioner("texir-reference", {"aten::relu.default"}))
            out["relu_delegated"] = _sha(dumps(emit(lowered)))
    return out


def _has(program: Program, target: str) -> bool:
    return any(isinstance(n, CallFunction) and n.target == target for n in program.graph.nodes)


def test_zoo_pte_bytes_unchanged(golden: Golden) -> None:
    table = {m.name: _variants(m.name) for m in ZOO}
    golden("pte/zoo_hashes.json", json.dumps(table, indent=1, sort_keys=True) + "\n")
