"""`texir bundle MODEL [-o FILE.bpte] [--partitioner NAME] [--cases N]`: a `.bpte` with test cases from eager runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Literal

import msgspec

from texir.cli.cmd_lower import executorch_partitioner_for
from texir.cli.model_spec import load_model_eager
from texir.cli.paths import refuse_clobbering
from texir.cli.progress import Progress
from texir.errors import ConversionError, UsageError
from texir.serialize import bpte, pte
from texir.serialize.bpte import Tensor, describe_value

EPILOG = """\
examples:
  texir bundle texir.models:conv_relu_tan -o model.bpte               # portable kernels, the example args
  texir bundle models/mlp.py:build --partitioner xnnpack --cases 4    # XNNPACK; 4 random input sets too
  texir bundle model.pt2 --cases 2 --seed 1 --verify                  # check every case in ExecuTorch's runtime
  texir inspect model.bpte                                            # the program and its cases

Exports MODEL, lowers it as `texir lower` does (with an ExecuTorch --partitioner, or to portable
kernels), writes the .pte into a bundled program (ExecuTorch's .bpte, which its runtime loads with
_load_bundled_program_from_buffer) with one test case per input set: the example args, then N input
sets of the same shapes and dtypes drawn from a generator seeded with --seed (floats normal,
integers within the example's range). Each case's expected outputs are eager PyTorch's on the
module MODEL returns (or the exported program's own module for a .pt2). --verify then runs every
case in ExecuTorch's runtime and compares (|out - expected| <= atol + rtol * |expected|); exit 1 if
one fails.
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "bundle",
        help="write a .bpte: the lowered MODEL plus test cases (inputs, eager outputs)",
        description="Export and lower MODEL, emit its .pte and bundle it with test cases computed by eager runs.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", metavar="MODEL", help="FILE.py:CALLABLE, PACKAGE.MODULE:CALLABLE or FILE.pt2")
    parser.add_argument("-o", "--output", type=Path, default=None, metavar="FILE.bpte",
                        help="where to write (default: the MODEL's name with .bpte, in the current directory)")
    parser.add_argument("--partitioner", default=None, metavar="NAME|MODULE:NAME",
                        help="an ExecuTorch partitioner (xnnpack, vulkan, example or MODULE:NAME); default: none")
    parser.add_argument("--cases", type=int, default=0, metavar="N", help="add N seeded random input sets")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the random input sets (default 0)")
    parser.add_argument("--verify", action="store_true", help="run every case in ExecuTorch's runtime and compare")
    parser.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance of --verify (default 1e-5)")
    parser.add_argument("--atol", type=float, default=1e-6, help="absolute tolerance of --verify (default 1e-6)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help="compile partitions in N worker processes")
    parser.add_argument("--no-cache", action="store_true", help="compile every partition (no preprocess cache)")
    parser.set_defaults(func=run)


def default_output(spec: str) -> Path:
    """``pkg.models:build`` -> ``build.bpte``; ``dir/model.pt2`` -> ``model.bpte``."""
    if spec.endswith(".pt2"):
        return Path(Path(spec).stem + ".bpte")
    return Path(spec.rpartition(":")[2].rpartition(".")[2] + ".bpte")


def _check(args: argparse.Namespace) -> Path:
    if args.cases < 0:
        raise UsageError(f"--cases {args.cases}: give a number of random input sets, 0 or more")
    if args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: give 1 or more worker processes")
    if not (args.rtol >= 0 and args.atol >= 0):
        raise UsageError("--rtol and --atol must be 0 or more")
    output: Path = args.output if args.output is not None else default_output(args.model)
    if output.suffix.lower() in (".pte", ".ptd"):
        raise UsageError(f"-o {output}: a bundled program is a .bpte; `texir lower -o` writes a .pte")
    refuse_clobbering("texir bundle", [args.model], [("-o", output)])
    return output


def _describe(values: tuple[Any, ...]) -> list[str]:
    return [describe_value(v.val).removeprefix("Tensor ") if isinstance(v.val, Tensor) else describe_value(v.val)
            for v in values]


def run(args: argparse.Namespace) -> int:
    # torch loads in seconds (the adapters and orchestrate import it), the emitter in a few tenths:
    # only `texir bundle` pays, not every command's start
    from texir.adapters.bundle import eager_case, random_inputs
    from texir.emit import emit
    from texir.orchestrate import lower

    output = _check(args)
    with Progress("texir bundle") as progress:
        partitioners = [executorch_partitioner_for(args.partitioner)] if args.partitioner else []
        with progress.phase(f"loading {args.model}"):
            ep, eager, example_args, example_kwargs = load_model_eager(args.model)
        cache: Literal["default"] | None = None if args.no_cache else "default"
        with progress.phase("lowering" if partitioners else "lowering to portable kernels"):
            lowered = lower(ep, partitioners, cache=cache, jobs=args.jobs).program
        with progress.phase("emitting"):
            program = pte.dumps(emit(lowered))
        sets: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [("example", example_args, example_kwargs)]
        for i, (a, k) in enumerate(random_inputs((example_args, example_kwargs), args.cases, seed=args.seed)):
            sets.append((f"random #{i} (seed {args.seed})", a, k))
        cases = []
        with progress.phase("running eagerly"):
            for n, (_, a, k) in enumerate(sets):
                try:
                    cases.append(eager_case(eager, a, k))
                except ConversionError as exc:
                    raise ConversionError(f"case {n}: {exc}") from exc
        bundle = bpte.make_bundle(program, {"forward": cases})
        with progress.phase(f"writing {output}"):
            bpte.dump(bundle, output)
        results = None
        if args.verify:
            from texir.executorch import verify_bpte  # executorch is an optional extra: imported on use

            with progress.phase("verifying in ExecuTorch's runtime"):
                results = verify_bpte(output.read_bytes(), rtol=args.rtol, atol=args.atol)
    rows: list[dict[str, Any]] = [
        {"method": "forward", "case": n, "source": source, "inputs": _describe(case.inputs),
         "expected_outputs": _describe(case.expected_outputs)}
        for n, ((source, _, _), case) in enumerate(zip(sets, cases))
    ]
    if results is not None:
        verdict = {(r.method, r.case): r for r in results}
        for row in rows:
            r = verdict.get((row["method"], row["case"]))
            row["verified"] = None if r is None else r.ok
            if r is not None and not r.ok:
                row["error"] = r.error
    failed = sum(1 for row in rows if row.get("verified") is False)
    if args.json:
        payload = {"bpte": str(output), "bytes": output.stat().st_size, "program_bytes": len(program), "cases": rows}
        sys.stdout.write(msgspec.json.encode(payload).decode() + "\n")
        return 1 if failed else 0
    out = sys.stdout
    out.write(f"wrote {output} ({output.stat().st_size:,} bytes: a {len(program):,}-byte .pte and {len(rows)} cases)\n")
    for row in rows:
        line = (f"  {row['method']}[{row['case']}] {row['source']}: inputs {', '.join(row['inputs']) or '-'}"
                f" -> expected {', '.join(row['expected_outputs']) or '-'}")
        if "verified" in row:
            line += "  ok" if row["verified"] else f"  FAILED ({row.get('error', '')})"
        out.write(line + "\n")
    if results is not None:
        out.write(f"verified in ExecuTorch's runtime (rtol {args.rtol:g}, atol {args.atol:g}): "
                  f"{len(results) - failed} of {len(results)} cases pass\n")
    return 1 if failed else 0
