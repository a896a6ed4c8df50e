"""`texir diff A B`: structural diff of two snapshots, .pte files or MODEL specs (exit 1 if they differ)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import msgspec

from texir.cli.model_spec import load_input
from texir.cli.progress import Progress
from texir.errors import TexirError
from texir.ir.types import LoweredBackendModule, Program
from texir.serialize.bpte import BundledProgram
from texir.serialize.pte import loads
from texir.viz.diff import ProgramDiff, diff_modules, diff_programs, diff_texts, format_diff, summary_line
from texir.viz.views import text_view

EPILOG = """\
examples:
  texir diff before.json after.json            # two snapshots (texir snapshot MODEL -o before.json)
  texir diff model_a.pte model_b.pte --json    # two .pte files, machine-readable
  texir diff a.bpte b.bpte                     # two bundled programs: their .pte, then their cases
  texir diff texir.models:conv_relu_tan lowered.msgpack

A and B are each a snapshot (.json/.msgpack, written by `texir snapshot` or `texir lower --snapshot`),
a .pte or .bpte file, or a MODEL spec (file.py:callable, package.module:callable, file.pt2). Programs
are compared in canonical form: node names do not matter, content does. A program compared with a .pte
file is emitted to .pte first; a .bpte compared with anything but a .bpte stands for its .pte. Exit status: 0 equal, 1 different, 2 error.
"""

def _as_pte(value: Any) -> Any:
    if isinstance(value, Program):
        from texir.emit import emit  # the emitter loads in a few tenths: only diffs of a Program and a .pte pay

        return emit(value)
    return value


def _unbundle(value: Any) -> Any:
    """A bundled program's `.pte` (compared with anything but another bundle)."""
    return loads(value.program.view()) if isinstance(value, BundledProgram) else value


def compare(a: Any, b: Any, *, a_label: str, b_label: str) -> ProgramDiff:
    kinds = (type(a).__name__, type(b).__name__)
    if "BundledProgram" in kinds and kinds[0] != kinds[1]:
        a, b = _unbundle(a), _unbundle(b)
        kinds = (type(a).__name__, type(b).__name__)
    if "PteProgram" in kinds and kinds[0] != kinds[1]:
        a, b = _as_pte(a), _as_pte(b)
    elif isinstance(a, LoweredBackendModule) != isinstance(b, LoweredBackendModule):
        raise TexirError(
            f"cannot compare a {kinds[0]} ({a_label}) with a {kinds[1]} ({b_label}): compare two "
            "programs or two lowered modules"
        )
    if isinstance(a, Program) and isinstance(b, Program):
        return diff_programs(a, b, a_label=a_label, b_label=b_label)
    if isinstance(a, LoweredBackendModule) and isinstance(b, LoweredBackendModule):
        return diff_modules(a, b, a_label=a_label, b_label=b_label)
    va, vb = text_view(a), text_view(b)  # .pte programs: their outline views
    return diff_texts(va.text, vb.text, a_label=a_label, b_label=b_label, a_names=va.names,
                      b_names=vb.names)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "diff",
        help="structural diff of two snapshots, .pte files or MODEL specs",
        description="Compare A and B in canonical form and print nodes added, removed or changed, "
        "signature, state, partitions (backend, compile specs, blobs by hash); for .pte files: "
        "methods, operators, delegates, values and instructions.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("a", metavar="A", help="snapshot, .pte or .bpte file or MODEL spec")
    parser.add_argument("b", metavar="B", help="snapshot, .pte or .bpte file or MODEL spec")
    parser.add_argument("--json", action="store_true", help="print the diff as JSON")
    parser.add_argument("--decompose", action="store_true",
                        help="decompose MODEL specs as ExecuTorch's to_edge does (what `texir lower` always does) before comparing")
    parser.add_argument("--limit", type=int, default=200, metavar="N",
                        help="show at most N changes in the text report (default 200; 0: all)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.limit < 0:
        raise TexirError("--limit must be 0 (no limit) or a positive number of changes")
    with Progress("texir diff") as progress:
        with progress.phase(f"loading {args.a}"):
            a = load_input(args.a, decompose=args.decompose)
        with progress.phase(f"loading {args.b}"):
            b = load_input(args.b, decompose=args.decompose)
        with progress.phase("comparing"):
            result = compare(a, b, a_label=args.a, b_label=args.b)
    if args.json:
        doc = {
            "equal": result.equal,
            "a": result.a_label,
            "b": result.b_label,
            "summary": summary_line(result) if not result.equal else "equal",
            "counts": result.counts(),
            "changes": result.changes,
        }
        sys.stdout.write(msgspec.json.encode(doc).decode() + "\n")
    else:
        sys.stdout.write(format_diff(result, limit=args.limit or None))
    return 0 if result.equal else 1
