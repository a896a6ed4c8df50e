"""`texir show MODEL|SNAPSHOT|PTE`: print a program in texir's stable text form (or draw it: --html)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from texir.cli.model_spec import load_input
from texir.cli.paths import is_model_spec, refuse_clobbering
from texir.cli.pte_report import check_xnnpack_delegates
from texir.cli.progress import Progress
from texir.ir import canonicalize, format_lowered_module, format_program
from texir.ir.types import LoweredBackendModule, Program
from texir.serialize.bpte.schema import BundledProgram
from texir.serialize.pte.codec import loads as loads_pte
from texir.serialize.pte.schema import PteProgram
from texir.serialize.snapshot import atomic_write_bytes
from texir.viz.pte_view import bundle_text, pte_text

EPILOG = """\
examples:
  texir show texir.models:conv_relu_tan
  texir show models/mlp.py:build --decompose
  texir show model.json                  # a snapshot written by `texir snapshot`
  texir show model.pt2 --canonical       # nodes renamed %0, %1, ... (compare two programs)
  texir show model.pte                   # methods, operators, delegates, values, instructions
  texir show lowered.json --html graph.html   # one self-contained page: zoom, pan, click a node

MODEL is FILE.py:CALLABLE or PACKAGE.MODULE:CALLABLE (returning (nn.Module, example_inputs[,
dynamic_shapes]) or an ExportedProgram), a FILE.pt2 written by torch.export.save, or a snapshot
(.json, .msgpack), or a .pte file. The text form is the one goldens use: the same program always prints the same.
"""


def render(value: Program | LoweredBackendModule | PteProgram | BundledProgram, *, canonical: bool = False) -> str:
    if isinstance(value, BundledProgram):
        return bundle_text(value)
    if not isinstance(value, (Program, LoweredBackendModule)):
        return pte_text(value)

    if isinstance(value, LoweredBackendModule):
        if canonical:
            value = LoweredBackendModule(
                backend_id=value.backend_id, processed_bytes=value.processed_bytes,
                compile_specs=value.compile_specs, original_program=canonicalize(value.original_program),
                debug_handle_map=value.debug_handle_map,
            )
        return format_lowered_module(value)
    return format_program(canonicalize(value) if canonical else value)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "show",
        help="print a MODEL, snapshot or .pte file in texir's text form",
        description="Load MODEL (exporting and converting it), a snapshot or a .pte file and print the program.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", metavar="MODEL|SNAPSHOT|PTE",
                        help="FILE.py:CALLABLE, PACKAGE.MODULE:CALLABLE, FILE.pt2, a snapshot file or a .pte file")
    parser.add_argument("--decompose", action="store_true",
                        help="decompose a MODEL as ExecuTorch's to_edge does (what `texir lower` always does) before converting")
    parser.add_argument("--canonical", action="store_true",
                        help="print the canonical form (nodes renamed in order, tables sorted)")
    parser.add_argument("-o", "--output", type=Path, default=None, metavar="FILE",
                        help="write the text to FILE instead of stdout")
    parser.add_argument("--html", type=Path, default=None, metavar="FILE",
                        help="draw the graph into one self-contained HTML page instead of printing")
    parser.set_defaults(func=run)


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def run(args: argparse.Namespace) -> int:
    refuse_clobbering("texir show", [args.model], [("--html", args.html), ("-o", args.output)])
    with Progress("texir show") as progress:
        with progress.phase(f"loading {args.model}"):
            value = load_input(args.model, decompose=args.decompose)
            # a damaged XNNPACK delegate fails here, not on a device
            if isinstance(value, PteProgram):
                check_xnnpack_delegates(value)
            elif isinstance(value, BundledProgram):
                check_xnnpack_delegates(loads_pte(value.program.tobytes()))
        if is_model_spec(args.model) and not args.decompose:
            print("texir show: showing MODEL as exported; `texir lower` decomposes it first (add --decompose "
                  "to see that form)", file=sys.stderr)
        if args.html is not None:
            from texir.viz.html import write_html  # the page builder's import costs every command: --html pays

            with progress.phase(f"writing {args.html}"):
                stats = write_html(value, args.html, title=args.model)
            print(f"wrote {args.html}: {stats.nodes} nodes, {stats.edges} edges, "
                  f"{_count(stats.partitions, 'partition')}, {_count(stats.graphs, 'graph')}, {stats.bytes} bytes")
            if args.output is None:
                return 0
        text = render(value, canonical=args.canonical)
    if not text.endswith("\n"):
        text += "\n"
    if args.output is not None:
        atomic_write_bytes(args.output, text.encode("utf-8"))
    else:
        sys.stdout.write(text)
    return 0
