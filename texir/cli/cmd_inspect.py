"""`texir inspect`: a stable view of a `.pte` file (texir's or ExecuTorch's): methods, values, code, sizes;
of a `.ptd` (its entries) and of a `.bpte` (its program, then its cases)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import msgspec

from texir.cli.bpte_report import format_bpte_report, inspect_bpte
from texir.cli.pte_report import format_ptd_report, format_report, inspect_ptd, inspect_pte
from texir.errors import PteError, UsageError
from texir.serialize.bpte.schema import BUNDLED_FILE_IDENTIFIER
from texir.serialize.pte.codec import read_pte, to_logical
from texir.serialize.pte.ptd import PTD_FILE_IDENTIFIER, check_external, loads_ptd

__all__ = ["format_ptd_report", "format_report", "inspect_ptd", "inspect_pte", "register", "run"]

EPILOG = """\
examples:
  texir inspect out/demo.pte            # methods, values, instructions, delegates, size breakdown
  texir inspect model.pte --brief       # without the value and instruction tables
  texir inspect model.pte --json | jq '.sizes'
  texir inspect weights.ptd             # the entries of a .ptd (external data) file
  texir inspect model.pte --data _default_external_constant.ptd   # check the .pte's external tensors
  texir inspect model.bpte --case forward:0   # a bundled program: its .pte, its cases, one case in full

Reads files written by texir and by ExecuTorch (schema ET12). Value references print as %N (an index
into the method's values table); IntList arguments print the Int values they point to.
"""

def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="show the methods, values, instructions, delegates and size breakdown of a .pte file",
        description="Decode a .pte file and print a stable, readable view of it.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("path", type=Path, metavar="MODEL.pte", help="the .pte (or .ptd, .bpte) file to inspect")
    parser.add_argument("--data", type=Path, action="append", default=[], metavar="FILE.ptd",
                        help="a .ptd file the .pte loads its external tensors from (repeatable): each "
                        "external tensor is checked against it")
    parser.add_argument("--json", action="store_true", help="print deterministic JSON instead of text")
    parser.add_argument("--brief", action="store_true", help="omit the per-value and per-instruction tables")
    parser.add_argument("--case", default=None, metavar="[METHOD:]K",
                        help="with a .bpte: show case K of METHOD in full (bytes, hash, first elements)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    path: Path = args.path
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PteError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if data[4:8] == BUNDLED_FILE_IDENTIFIER:
        if args.data:
            raise UsageError("--data checks a .pte's external tensors; a .bpte's program carries its data inside")
        bundled = inspect_bpte(data, brief=bool(args.brief), case=args.case)
        if args.json:
            sys.stdout.write(json.dumps(bundled, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
        else:
            sys.stdout.write(format_bpte_report(bundled))
        return 0
    if args.case is not None:
        raise UsageError(f"--case selects a case of a .bpte; {path} is not one")
    if data[4:8] == PTD_FILE_IDENTIFIER:
        report = inspect_ptd(data)
        if args.json:
            sys.stdout.write(json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
        else:
            sys.stdout.write(format_ptd_report(report))
        return 0
    report = inspect_pte(data, brief=bool(args.brief))
    if args.data:
        files = []
        for ptd_path in args.data:
            try:
                ptd = loads_ptd(ptd_path.read_bytes())
            except OSError as exc:
                raise PteError(f"cannot read {ptd_path}: {exc.strerror or exc}") from exc
            files.append(msgspec.structs.replace(ptd, tag=ptd_path.stem))
        checked = check_external(to_logical(read_pte(data)).program, files)
        report["external_check"] = {"files": [str(p) for p in args.data], "ok": True, "tensors": checked}
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(format_report(report))
    return 0
