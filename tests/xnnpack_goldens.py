"""The torch-free half of the native XNNPACK backend's goldens (tests/golden/xnnpack/<case>/), shared by
their generator (tools/make_xnnpack_goldens.py) and their test (tests/test_xnnpack_goldens.py).

A case is the program one delegate of a tiny model was lowered from (`program.txt`, as
`texir.ir.format_program` prints it), the payloads of its constants (`constants/<sha256>.bin`, the
text names them by hash) and what the backend makes of it: the blob as `format_blob` shows it
(`blob.txt`) and the working graph after each pass in `PASSES` (`passes.txt`). Nothing here imports
torch or executorch."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Final

from texir.backends.xnnpack.backend import XnnpackNativeBackend
from texir.backends.xnnpack.graph import XGraph
from texir.backends.xnnpack.inspect import format_blob, format_xgraph
from texir.backends.xnnpack.passes import PASSES, run_passes
from texir.ir import Program, parse_program

XNNPACK_GOLDENS: Final = Path(__file__).parent / "golden" / "xnnpack"
PROGRAM, BLOB, PASS_TEXT, CONSTANTS = "program.txt", "blob.txt", "passes.txt", "constants"


def load_case(case: Path) -> Program:
    """The case's program with its constants' bytes (each file checked against the hash it is named by)."""
    payloads: dict[str, bytes] = {}
    for path in sorted((case / CONSTANTS).glob("*.bin")):
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != path.stem:
            raise ValueError(f"{path}: its bytes do not hash to its name; regenerate the goldens")
        payloads[path.stem] = data
    return parse_program((case / PROGRAM).read_text(encoding="utf-8"), payloads=payloads)


def blob_text(program: Program) -> str:
    """The blob the native backend compiles `program` to, as text."""
    return format_blob(XnnpackNativeBackend().preprocess(program, ()).processed_bytes) + "\n"


def passes_text(program: Program) -> str:
    """The working graph as `from_program` reads it, then after each pass (or "unchanged")."""
    g = XGraph.from_program(program)
    before = format_xgraph(g)
    out = [f"# from_program\n{before}"]
    for named in PASSES:
        run_passes(g, (named,), check=True)
        after = format_xgraph(g)
        out.append(f"# {named.name}: unchanged" if after == before else f"# {named.name}\n{after}")
        before = after
    return "\n".join(out) + "\n"
