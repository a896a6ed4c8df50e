"""The `.pte` layer: schema structs mirroring program.fbs and the codec (the emitter is `texir.emit`)."""

from __future__ import annotations

from texir.serialize.pte.codec import (
    PteArgumentError,
    PteDecodeError,
    PteEncodeError,
    PteOptions,
    dump,
    dumps,
    iter_chunks,
    load,
    loads,
    read_pte,
    tensor_nbytes,
    to_logical,
)
from texir.serialize.pte.ptd import (
    PtdDecodeError,
    PtdMismatchError,
    check_external,
    dump_ptd,
    dumps_ptd,
    load_ptd,
    loads_ptd,
)
from texir.serialize.pte.ptd_draft import DraftOutcome, PtdDraft
from texir.serialize.pte.schema import *  # noqa: F403
from texir.serialize.pte.schema import __all__ as _schema_all

__all__ = [
    *_schema_all,
    "PtdDecodeError",
    "PtdMismatchError",
    "PteDecodeError",
    "PteArgumentError",
    "PteEncodeError",
    "PteOptions",
    "check_external",
    "dump",
    "DraftOutcome",
    "PtdDraft",
    "dump_ptd",
    "dumps_ptd",
    "dumps",
    "iter_chunks",
    "load",
    "load_ptd",
    "loads",
    "loads_ptd",
    "read_pte",
    "tensor_nbytes",
    "to_logical",
]
