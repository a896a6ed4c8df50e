"""`texir run FILE.pte|FILE.bpte [--data X.ptd] [--inputs FILE | --random] [--compare MODEL] [--repeat N]`:
run a method in ExecuTorch's runtime and report its outputs, latency and closeness to eager."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from texir.backends.external_data import external_data_keys
from texir.cli.noise import native_stderr_filtered
from texir.cli.model_spec import check_model_path, load_model_eager
from texir.errors import PteError, TexirError, UsageError
from texir.serialize import bpte
from texir.serialize.bpte.schema import BUNDLED_FILE_IDENTIFIER
from texir.serialize.pte import schema as s
from texir.serialize.pte.codec import loads as loads_pte
from texir.serialize.pte.dtypes import DTYPE_TO_SCALAR_TYPE
from texir.serialize.pte.ptd import PTD_FILE_IDENTIFIER, check_external, loads_ptd

__all__ = ["RunError", "needed_backends", "register", "run"]

EPILOG = """\
examples:
  texir run model.pte                                 # forward on random inputs (shapes/dtypes from the file)
  texir run model.pte --data _default_external_constant.ptd   # weights kept in a .ptd (texir lower --external-data)
  texir run model.pte --inputs inputs.pt --repeat 20  # a tuple of tensors saved with torch.save; median of 20 runs
  texir run model.pte --compare texir.models:conv_relu_tan    # and the max |difference| to eager PyTorch
  texir run model.bpte                                # a bundled program: check its own cases

Loads FILE in ExecuTorch's runtime (the executorch pip package), runs --method (default forward)
--repeat times on the same inputs and prints each output's shape, dtype, min/max/mean, and the median
latency. --random (the default) draws inputs of the shapes and dtypes the .pte declares from a
generator seeded with --seed: floats normal, bools uniform, integers 0 (indices stay valid).
--compare MODEL (as `texir lower` takes it) runs the MODEL's module eagerly on the same inputs and
prints the largest absolute difference per output. A .bpte runs every case it carries and compares
with its expected outputs (|out - expected| <= atol + rtol * |expected|); exit 1 if one fails.
"""


class RunError(TexirError):
    """A `.pte` cannot run as given: a backend the runtime lacks, a missing `.ptd`, wrong inputs."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a .pte (or check a .bpte's cases) in ExecuTorch's runtime",
        description="Run a method of a .pte in ExecuTorch's runtime: outputs, latency, difference to eager.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("file", type=Path, metavar="FILE.pte|FILE.bpte")
    parser.add_argument("--data", type=Path, default=None, metavar="FILE.ptd",
                        help="the .ptd holding the program's external weights")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--inputs", type=Path, default=None, metavar="FILE.pt",
                        help="a tuple of tensors saved with torch.save (loaded with weights_only=True)")
    source.add_argument("--random", action="store_true", help="random inputs from the file's metadata (default)")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="seed of --random (default 0)")
    parser.add_argument("--compare", default=None, metavar="MODEL",
                        help="FILE.py:CALLABLE, PACKAGE.MODULE:CALLABLE or FILE.pt2 to run eagerly on the same inputs")
    parser.add_argument("--repeat", type=int, default=1, metavar="N", help="run N times; report the median latency")
    parser.add_argument("--method", default="forward", metavar="NAME", help="the method to run (default forward)")
    parser.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance of a .bpte's cases (default 1e-5)")
    parser.add_argument("--atol", type=float, default=1e-6, help="absolute tolerance of a .bpte's cases (default 1e-6)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="show third-party log output (the runtime's, torch's)")
    parser.set_defaults(func=run)


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{what} {str(path)!r} does not exist") from None
    except OSError as exc:
        raise UsageError(f"cannot read {what} {str(path)!r}: {exc.strerror or exc}") from None


def needed_backends(program: s.PteProgram, method: str) -> list[str]:
    """The backend ids `method`'s delegates name, in order, each once."""
    plan = next(p for p in program.program.execution_plan if p.name == method)
    return list(dict.fromkeys(d.id for d in plan.delegates))


def _check_data(program: s.PteProgram, method: str, data: Path | None, file: Path) -> None:
    """Refuse before loading what the runtime would fail on (or crash on: ExecuTorch 1.5.1's XNNPACK
    delegate dereferences a null data map when its weights' .ptd is missing)."""
    missing = external_data_keys(program, method)
    if data is None:
        if missing:
            raise RunError(
                f"{str(file)!r} keeps {len(missing)} weights outside the .pte (e.g. {missing[0]!r}); "
                f"give the .ptd written beside it: --data FILE.ptd"
            )
        return
    raw = _read(data, "--data")
    if raw[4:8] != PTD_FILE_IDENTIFIER:
        raise UsageError(f"--data {data}: not a .ptd file (no {PTD_FILE_IDENTIFIER.decode()} identifier)")
    ptd = loads_ptd(raw)
    check_external(program.program, [ptd])
    present = {e.key for e in ptd.entries}
    absent = [k for k in missing if k not in present]
    if absent:
        raise RunError(f"--data {data} lacks {len(absent)} of the weights {str(file)!r} needs (e.g. {absent[0]!r}); "
                       "give the .ptd written together with this .pte")


def _check_backends(program: s.PteProgram, method: str) -> None:
    from texir.executorch.runtime import runtime  # executorch is an optional extra: imported on use

    registry = runtime().backend_registry
    for backend in needed_backends(program, method):
        if not registry.is_available(backend):
            have = ", ".join(registry.registered_backend_names) or "none"
            raise RunError(
                f"method {method!r} delegates to {backend}, which this ExecuTorch runtime does not have "
                f"(it has: {have}); lower without it or use a runtime built with {backend}"
            )


def _random_inputs(plan: s.ExecutionPlan, seed: int) -> list[Any]:
    import torch  # torch loads in seconds: only `texir run` pays

    from texir.adapters.bundle import random_inputs  # the adapters import torch: only `texir run` pays
    from texir.adapters.tensors import DTYPE_TO_TORCH  # the adapters import torch: only `texir run` pays

    to_dtype = {st: DTYPE_TO_TORCH[dt] for dt, st in DTYPE_TO_SCALAR_TYPE.items() if dt in DTYPE_TO_TORCH}
    example: list[Any] = []
    for k, index in enumerate(plan.inputs):
        val = plan.values[index].val
        if isinstance(val, s.Tensor):
            dtype = to_dtype.get(val.scalar_type)
            if dtype is None:
                raise RunError(f"input {k} is {val.scalar_type.name}, which --random cannot draw; pass --inputs FILE.pt")
            # zeros as the example: random_inputs draws floats normal, bools uniform, integers in
            # the example's range (0: indices stay valid)
            example.append(torch.zeros(tuple(val.sizes), dtype=dtype))
        elif isinstance(val, s.Int | s.Double | s.Bool):
            example.append(val.int_val if isinstance(val, s.Int) else
                           val.double_val if isinstance(val, s.Double) else val.bool_val)
        else:
            raise RunError(f"input {k} is a {type(val).__name__}, which --random cannot draw; pass --inputs FILE.pt")
    return list(random_inputs(tuple(example), 1, seed=seed)[0])


def _file_inputs(path: Path, plan: s.ExecutionPlan) -> list[Any]:
    import torch  # torch loads in seconds: only `texir run` pays

    _read(path, "--inputs")
    try:
        value = torch.load(path, weights_only=True)
    except Exception as exc:  # torch raises pickle, zip and runtime errors alike for a bad file
        raise UsageError(f"--inputs {path}: cannot load it with torch.load(weights_only=True): "
                         f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}") from exc
    if isinstance(value, torch.Tensor):
        value = (value,)
    if not isinstance(value, tuple | list):
        raise UsageError(f"--inputs {path} holds {type(value).__name__}; save a tuple of tensors: torch.save((x,), FILE)")
    inputs = list(value)
    if len(inputs) != len(plan.inputs):
        raise RunError(f"--inputs {path} holds {len(inputs)} values; method {plan.name!r} takes {len(plan.inputs)}")
    for k, (x, index) in enumerate(zip(inputs, plan.inputs)):
        val = plan.values[index].val
        if isinstance(val, s.Tensor) and isinstance(x, torch.Tensor) and tuple(x.shape) != tuple(val.sizes) \
                and val.shape_dynamism == s.TensorShapeDynamism.STATIC:
            raise RunError(f"--inputs {path}: input {k} has shape {list(x.shape)}; method {plan.name!r} takes "
                           f"{val.scalar_type.name}{list(val.sizes)}")
    return inputs


def _summary(t: Any) -> dict[str, Any]:
    import torch  # loaded already: the runtime returned tensors

    out: dict[str, Any] = {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
    if t.numel() and (t.dtype.is_floating_point or t.dtype in (torch.int8, torch.uint8, torch.int16,
                                                               torch.int32, torch.int64, torch.bool)):
        f = t.detach().to(torch.float64)
        out.update(min=float(f.min()), max=float(f.max()), mean=float(f.mean()))
    return out


def _eager_diffs(spec: str, inputs: Sequence[Any], outputs: Sequence[Any]) -> list[float | None]:
    import torch  # torch loads in seconds: only `texir run` pays
    from torch.utils import _pytree as pytree  # part of torch: as above

    _, eager, _, _ = load_model_eager(spec)
    try:
        with torch.no_grad():
            expected = [x for x in pytree.tree_leaves(eager(*inputs)) if isinstance(x, torch.Tensor)]
    except Exception as exc:  # the user's module raising on these inputs
        raise RunError(f"--compare {spec}: running it eagerly on the inputs failed: {type(exc).__name__}: {exc}") from exc
    if len(expected) != len(outputs):
        raise RunError(f"--compare {spec}: eager returns {len(expected)} tensors, the .pte {len(outputs)}; "
                       "compare with the MODEL the file was lowered from")
    diffs: list[float | None] = []
    for got, want in zip(outputs, expected):
        if tuple(got.shape) != tuple(want.shape):
            diffs.append(None)
            continue
        diffs.append(float((got.to(torch.float64) - want.to(torch.float64)).abs().max()) if got.numel() else 0.0)
    return diffs


def _run_bpte(args: argparse.Namespace, data: bytes, verbose: bool) -> int:
    for flag, given in (("--data", args.data), ("--inputs", args.inputs), ("--compare", args.compare)):
        if given is not None:
            raise UsageError(f"{flag}: a .bpte runs its own cases with the data inside it; run its .pte for {flag}")
    bundle = bpte.loads(data)
    from texir.executorch import verify_bpte  # executorch is an optional extra: imported on use

    program = loads_pte(bundle.program.tobytes())
    for suite in bundle.method_test_suites:
        _check_backends(program, suite.method_name)
    with native_stderr_filtered(verbose):
        results = verify_bpte(data, rtol=args.rtol, atol=args.atol)
    failed = [r for r in results if not r.ok]
    if args.json:
        payload = {"file": str(args.file), "cases": [msgspec.to_builtins(r) for r in results]}
        sys.stdout.write(msgspec.json.encode(payload).decode() + "\n")
        return 1 if failed else 0
    for r in results:
        sys.stdout.write(f"  {r.method}[{r.case}]: " + ("ok" if r.ok else f"FAILED ({r.error})") + "\n")
    skipped = sum(len(c.expected_outputs) == 0 for suite in bundle.method_test_suites for c in suite.test_cases)
    tail = f" ({skipped} without expected outputs skipped)" if skipped else ""
    sys.stdout.write(f"{args.file}: {len(results) - len(failed)} of {len(results)} cases pass in ExecuTorch's "
                     f"runtime (rtol {args.rtol:g}, atol {args.atol:g}){tail}\n")
    return 1 if failed else 0


def _check_args(args: argparse.Namespace) -> None:
    if args.repeat < 1:
        raise UsageError(f"--repeat {args.repeat}: give 1 or more runs")
    if not (args.rtol >= 0 and args.atol >= 0):
        raise UsageError("--rtol and --atol must be 0 or more")
    if args.compare is not None:
        check_model_path(args.compare)  # a typo'd MODEL is reported before torch loads


def run(args: argparse.Namespace) -> int:
    _check_args(args)
    verbose = bool(getattr(args, "verbose", False))
    file: Path = args.file
    data = _read(file, "FILE")
    if data[4:8] == BUNDLED_FILE_IDENTIFIER:
        return _run_bpte(args, data, verbose)
    if data[4:8] == PTD_FILE_IDENTIFIER:
        raise UsageError(f"{file} is a .ptd (weights only); run the .pte it belongs to with --data {file}")
    try:
        program = loads_pte(data)
    except PteError as exc:
        raise PteError(f"{file} is not a .pte ExecuTorch can load: {exc}") from exc
    names = [p.name for p in program.program.execution_plan]
    if args.method not in names:
        raise UsageError(f"--method {args.method}: {file} has no such method; it has {', '.join(names) or 'none'}")
    plan = program.program.execution_plan[names.index(args.method)]
    _check_data(program, args.method, args.data, file)
    _check_backends(program, args.method)
    inputs = _file_inputs(args.inputs, plan) if args.inputs is not None else _random_inputs(plan, args.seed)

    import torch  # torch loads in seconds: only `texir run` pays

    from texir.executorch.runtime import RuntimeRunError, load_method  # executorch is an optional extra: imported on use

    times: list[float] = []
    with native_stderr_filtered(verbose):
        loaded = load_method(file, args.method, data_path=args.data)
        outputs: list[Any] = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            try:
                result = loaded.execute(list(inputs))
            except Exception as exc:  # the runtime reports failures as RuntimeError with a status code
                raise RuntimeRunError(f"ExecuTorch's runtime failed running {args.method!r}: {exc}") from exc
            times.append(time.perf_counter() - start)
            outputs = [t for t in result if isinstance(t, torch.Tensor)]
    diffs = _eager_diffs(args.compare, inputs, outputs) if args.compare is not None else None
    rows = [_summary(t) for t in outputs]
    if diffs is not None:
        for row, d in zip(rows, diffs):
            row["max_abs_diff"] = d
    median_ms = statistics.median(times) * 1e3
    if args.json:
        payload = {"file": str(file), "method": args.method, "runs": args.repeat, "median_ms": median_ms, "outputs": rows}
        sys.stdout.write(msgspec.json.encode(payload).decode() + "\n")
        return 0
    out = sys.stdout
    backends = needed_backends(program, args.method)
    via = f" (delegates: {', '.join(backends)})" if backends else ""
    source = f"from {args.inputs}" if args.inputs is not None else f"random, seed {args.seed}"
    plural = "s" if len(inputs) != 1 else ""
    out.write(f"{file} {args.method}{via}: {len(inputs)} input{plural} ({source})\n")
    for k, row in enumerate(rows):
        line = f"  output {k}: {row['dtype']}{row['shape']}"
        if "min" in row:
            line += f"  min {row['min']:.6g}  max {row['max']:.6g}  mean {row['mean']:.6g}"
        if "max_abs_diff" in row:
            d = row["max_abs_diff"]
            line += "  vs eager: shapes differ" if d is None else f"  max |diff| vs eager {d:.3g}"
        out.write(line + "\n")
    out.write(f"latency: median {median_ms:.3f} ms over {args.repeat} run{'s' if args.repeat != 1 else ''}\n")
    return 0
