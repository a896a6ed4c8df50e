"""`texir snapshot MODEL`: write the deterministic JSON or msgpack snapshot of a model's IR."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Literal

import pydantic

from texir.cli.model_spec import load_value
from texir.cli.paths import refuse_clobbering
from texir.cli.progress import Progress
from texir.errors import TexirError
from texir.serialize import snapshot
from texir.serialize.snapshot import format_for_path

EPILOG = """\
examples:
  texir snapshot texir.models:conv_relu_tan -o model.json
  texir snapshot models/mlp.py:build --format msgpack --include-data -o mlp.msgpack
  texir snapshot model.pt2 --decompose > model.json
  texir snapshot model.json --format msgpack -o model.msgpack     # convert a snapshot

MODEL is FILE.py:CALLABLE or PACKAGE.MODULE:CALLABLE (the callable returns (nn.Module,
example_inputs[, dynamic_shapes]) or an ExportedProgram), a FILE.pt2 written by torch.export.save,
or an existing snapshot. Without --include-data, tensors keep their metadata, sha256 and size but
not their bytes. The same input always gives the same bytes. The output file is written atomically.
"""


class SnapshotOptions(pydantic.BaseModel):
    """Validated `texir snapshot` options."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")

    model: str = pydantic.Field(min_length=1)
    format: Literal["json", "msgpack"] | None = None
    """None: msgpack for .msgpack/.mpk/.texir outputs, JSON otherwise."""
    include_data: bool = False
    decompose: bool = False
    output: Path | None = None

    @property
    def resolved_format(self) -> Literal["json", "msgpack"]:
        if self.format is not None:
            return self.format
        return format_for_path(self.output) if self.output is not None else "json"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "snapshot",
        help="write the IR snapshot (JSON or msgpack) of a MODEL",
        description="Export MODEL, convert it to texir's IR and write its versioned snapshot.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", metavar="MODEL", help="FILE.py:CALLABLE, PACKAGE.MODULE:CALLABLE, FILE.pt2 or a snapshot")
    parser.add_argument("--format", choices=("json", "msgpack"), default=None,
                        help="snapshot format (default: from the -o suffix; JSON otherwise)")
    parser.add_argument("--include-data", action="store_true", help="include tensor payloads (parameters, buffers, constants)")
    parser.add_argument("--decompose", action="store_true",
                        help="decompose a MODEL as ExecuTorch's to_edge does (what `texir lower` always does) before converting")
    parser.add_argument("-o", "--output", type=Path, default=None, metavar="FILE",
                        help="write to FILE (atomically) instead of stdout")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        options = SnapshotOptions(
            model=args.model, format=args.format, include_data=args.include_data,
            decompose=args.decompose, output=args.output,
        )
    except pydantic.ValidationError as exc:
        raise TexirError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())) from None
    if options.output is None and options.resolved_format == "msgpack" and sys.stdout.isatty():
        raise TexirError("refusing to write binary msgpack to a terminal; use -o FILE or redirect stdout")
    refuse_clobbering("texir snapshot", [options.model], [("-o", options.output)])
    with Progress("texir snapshot") as progress:
        with progress.phase(f"loading {options.model}"):
            value = load_value(options.model, decompose=options.decompose)
        with progress.phase("encoding"):
            data = snapshot.dumps_value(value, format=options.resolved_format, include_data=options.include_data)
        if options.output is not None:
            with progress.phase(f"writing {options.output}"):
                snapshot.atomic_write_bytes(options.output, data)
            print(f"wrote {options.output} ({len(data):,} bytes, {options.resolved_format} snapshot"
                  f"{', with tensor data' if options.include_data else ''})", file=sys.stderr)
    if options.output is None:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    return 0
