"""The `.bpte` layer: ExecuTorch's bundled program (a `.pte` plus test cases per method), its schema
structs mirroring bundled_program_schema.fbs, the codec and the check of cases against methods.

Building cases from eager runs needs torch and lives in `texir.adapters.bundle`."""

from __future__ import annotations

from texir.serialize.bpte.check import BundleCaseError, check_cases, describe_value
from texir.serialize.bpte.codec import BpteDecodeError, BpteEncodeError, dump, dumps, load, loads, make_bundle, read_bundle
from texir.serialize.bpte.schema import *  # noqa: F403
from texir.serialize.bpte.schema import __all__ as _schema_all

__all__ = [
    *_schema_all,
    "BpteDecodeError",
    "BpteEncodeError",
    "BundleCaseError",
    "check_cases",
    "describe_value",
    "dump",
    "dumps",
    "load",
    "loads",
    "make_bundle",
    "read_bundle",
]
