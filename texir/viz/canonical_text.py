"""Canonical text (what snapshots store and `texir diff` reads back), the original node names by line,
and parsing a stored text back into IR with delegate blobs named only by hash."""

from __future__ import annotations

import hashlib
import re

import msgspec

from texir.ir.canonical import canonicalize, canonicalize_with_names
from texir.ir.parser import parse_lowered_module, parse_program
from texir.ir.printer import format_lowered_module, format_program
from texir.ir.types import LoweredBackendModule, Program

__all__ = [
    "MODULE_HEADER", "Names", "StandIns", "canonical_module_text", "canonical_text", "module_original_names",
    "names_of", "original_names", "parse_text",
]

# Tensors compare by content hash: whether a payload is attached (a snapshot written without
# data) is not part of what a program is, so the printer's "(no data)" marker is dropped.
_NO_DATA_RE = re.compile(r"( sha256=[0-9a-f]+(?: nbytes=\d+)?) \(no data\)$", re.MULTILINE)
MODULE_HEADER = "lowered_module:\n"


def canonical_text(program: Program) -> str:
    """The canonical text form: what snapshots store."""
    return _NO_DATA_RE.sub(r"\1", format_program(canonicalize(program)))


def canonical_module_text(module: LoweredBackendModule) -> str:
    """The canonical text form of a lowered backend module (its program canonicalized)."""
    canon = msgspec.structs.replace(module, original_program=canonicalize(module.original_program))
    return _NO_DATA_RE.sub(r"\1", MODULE_HEADER + format_lowered_module(canon))


Names = dict[tuple[str, str], str]
"""(graph path, canonical node name) -> original name; paths as in `canonicalize_with_names`."""


def names_of(program: Program) -> Names:
    _, maps = canonicalize_with_names(program)
    return {(path, new): old for path, names in maps.items() for old, new in names.items()}


def _by_line(text: str, names: Names, module: bool) -> dict[int, str]:
    lines: dict[tuple[str, str], int] = {}
    parse_text(text, module, lines)
    return {lines[key] - 1: name for key, name in names.items() if key in lines}


def original_names(program: Program, text: str | None = None) -> dict[int, str]:
    """Line number (0-based) in `canonical_text(program)` (or `text`) -> original name of the node
    defined there."""
    return _by_line(text if text is not None else canonical_text(program), names_of(program), False)


def module_original_names(module: LoweredBackendModule, text: str | None = None) -> dict[int, str]:
    """As `original_names`, for `canonical_module_text(module)`."""
    text = text if text is not None else canonical_module_text(module)
    return _by_line(text, names_of(module.original_program), True)


class StandIns:
    """Delegate blobs a stored text names only by hash parse as stand-ins that remember it."""

    def __init__(self) -> None:
        self.known: dict[bytes, tuple[int, str]] = {}

    def __call__(self, sha: str, nbytes: int) -> bytes:
        stand_in = f"<blob {nbytes}B sha256={sha}>".encode()
        self.known[stand_in] = (nbytes, sha)
        return stand_in

    def identity(self, data: bytes) -> tuple[int, str]:
        return self.known.get(data) or (len(data), hashlib.sha256(data).hexdigest())


def parse_text(text: str, module: bool, lines: dict[tuple[str, str], int] | None = None,
           blobs: StandIns | None = None) -> Program | LoweredBackendModule:
    stand_in = blobs or StandIns()
    if module:
        body = text.removeprefix(MODULE_HEADER)
        shift = text[: len(text) - len(body)].count("\n")
        found: dict[tuple[str, str], int] = {}
        parsed = parse_lowered_module(body, missing_blob=stand_in, node_lines=found)
        if lines is not None:
            lines.update({k: v + shift for k, v in found.items()})
        return parsed
    return parse_program(text, missing_blob=stand_in, node_lines=lines)
