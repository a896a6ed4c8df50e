"""`texir lower MODEL --backend ID (--whole | --ops ... | --partitioner ...)`: partition, delegate, report."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Final, Literal

import pydantic

import texir.backends  # noqa: F401  (registers texir-reference and the demo backend for --backend)
from texir.errors import LoweringError, UsageError
from texir.ir import CallFunction, Program
from texir.ir.analysis import walk_keyed_graphs
from texir.cli.cmd_lower_hf import add_checkpoint_arguments, check_checkpoint_arguments, is_checkpoint, run_checkpoint
from texir.cli.lower_output import explain_rows, print_json, print_report
from texir.cli.lower_recipe import add_recipe_arguments, lower_with_recipe, recipe_from_args
from texir.cli.model_spec import is_snapshot_path, load_model, load_program
from texir.cli.paths import Outputs, refuse_clobbering
from texir.cli.progress import Progress
from texir.errors import UnsupportedError
from texir.lowering.backend import registered_backends
from texir.lowering.lower import lower_decomposed
from texir.lowering.partitioners import (
    OpSupportPartitioner,
    WholeProgramPartitioner,
)
from texir.lowering.report import LowerReport
from texir.serialize import snapshot

EPILOG = """\
examples:
  texir lower texir.models:conv_relu_tan --backend texir-reference --whole --tag-constants
  texir lower models/mlp.py:build --backend texir-reference --ops aten::add.Tensor,aten::mul.Tensor --explain
  texir lower model.pt2 --backend texir-reference --partitioner my_pkg.parts:MyPartitioner --json
  texir lower texir.models:conv_relu_tan -o model.pte          # no --backend: written undelegated
  texir lower texir.models:conv_relu_tan --partitioner xnnpack -o model.pte     # texir's native XNNPACK
  texir lower texir.models:conv_relu_tan --partitioner executorch:xnnpack -o model.pte  # ExecuTorch's
  texir lower model.pt2 --partitioner my_pkg.parts:MyEtPartitioner --jobs 2 -o model.pte
  texir lower hf:path/to/llama --task text-generation --max-seq-len 256 -o llama.pte   # + llama.ptd
  texir lower hf:path/to/llama --task text-generation --qlinear 8da4w --group-size 64 -o llama.pte

--partitioner MODULE:NAME (or FILE.py:NAME) with --backend ID: a texir partitioner; a class is
instantiated with the backend id, any other callable is used as the partitioner itself
(Program -> texir.lowering.PartitionPlan).
--partitioner xnnpack: texir's native XNNPACK partitioner and backend (texir.backends.xnnpack;
ExecuTorch's blobs without executorch; ops it does not take stay undelegated).
--partitioner executorch:NAME, NAME (vulkan, example) or MODULE:NAME without --backend: an ExecuTorch
partitioner (class built with no arguments, or instance), run like ExecuTorch's
to_edge_transform_and_lower (needs the executorch extra). Backends' results are cached in memory
and under $TEXIR_CACHE_DIR, a directory or an fsspec URL such as s3://bucket/texir (--no-cache to
compile everything); --jobs N compiles partitions in N worker processes.
Each row is one delegate, in the order the program calls it: lowered module, backend, tag, node
count, inputs, outputs, parameters/buffers/constants it consumed, blob size, named data, whether the
preprocess cache had it, seconds. The nodes left undelegated follow, by op and reason (turned_down: a
partitioner that supports the op refused the node; no_partitioner: none supports it; --explain: each
node and why), then, with --partitioner xnnpack or an ExecuTorch partitioner, the seconds of each
phase of the lowering. hf:DIR, a transformers checkpoint directory (config.json + safetensors), is
lowered for ExecuTorch's LLM runner with texir's native XNNPACK: static KV cache of --max-seq-len
positions, weights memory-mapped (never read into memory as a whole), X.pte + X.ptd with the
runner's constant methods; --qlinear (or --recipe xnnpack-8da4w) quantizes it first, in place, and
the quantized weights are then held in memory, not mapped. --json prints the same report. Every output (-o, its .ptd, --snapshot, --etrecord) is checked
before any work and written all together at the end: an error or Ctrl-C leaves none of them.
"""

NATIVE_PARTITIONERS: Final[dict[str, str]] = {"xnnpack": "texir.backends.xnnpack"}
"""Short name -> texir module with `partitioner()` and `registered()` (its backend for one lowering);
`executorch:NAME` names ExecuTorch's partitioner instead."""


class LowerOptions(pydantic.BaseModel):
    """The validated options of `texir lower`."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")

    model: str = pydantic.Field(min_length=1)
    backend: str | None = None
    mode: Literal["whole", "ops", "partitioner", "executorch", "none"]
    ops: tuple[str, ...] = ()
    partitioner: str | None = None
    tag_constants: bool = False
    tag_mutated_buffers: bool = False
    jobs: int = pydantic.Field(default=1, ge=1)
    cache: bool = True
    allow_non_core: bool = False

    @pydantic.field_validator("ops")
    @classmethod
    def _canonical(cls, ops: tuple[str, ...]) -> tuple[str, ...]:
        for op in ops:
            if "::" not in op:
                raise ValueError(f"op '{op}' is not canonical; write it like 'aten::add.Tensor'")
        return ops

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> LowerOptions:
        if self.mode in ("whole", "ops") and not self.backend:
            raise ValueError("--whole and --ops need --backend ID")
        if self.mode == "executorch" and self.backend:
            raise ValueError(
                f"--partitioner {self.partitioner} is an ExecuTorch partitioner, which names its own backends; "
                "drop --backend"
            )
        if self.mode == "executorch" and (self.tag_constants or self.tag_mutated_buffers):
            raise ValueError("--tag-constants/--tag-mutated-buffers are for texir partitioners; ExecuTorch's decide themselves")
        if self.backend and self.mode == "none":
            raise ValueError("--backend needs one of --whole, --ops OP,OP or --partitioner MODULE:NAME")
        if self.mode == "ops" and not self.ops:
            raise ValueError("--ops needs at least one op")
        return self


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "lower",
        help="partition a MODEL and delegate the partitions to a backend",
        description="Export MODEL, partition it, lower each partition with its backend and report.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", metavar="MODEL", help="FILE.py:CALLABLE, PACKAGE.MODULE:CALLABLE, FILE.pt2, a snapshot or "
                        "hf:DIR (a transformers checkpoint directory)")
    parser.add_argument("--backend", metavar="ID", default=None, help="registered backend id")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--whole", action="store_true", help="delegate the whole program as one partition")
    how.add_argument("--ops", metavar="OP,OP", default=None, help="maximal convex partitions of these canonical ops")
    how.add_argument("--partitioner", metavar="MODULE:NAME", default=None, help="a custom partitioner")
    parser.add_argument("--tag-constants", action="store_true", help="delegates consume the parameters/buffers/constants they use")
    parser.add_argument("--tag-mutated-buffers", action="store_true", help="delegates also own the buffers they mutate")
    parser.add_argument("--snapshot", type=Path, default=None, metavar="FILE", help="write the lowered program's snapshot")
    parser.add_argument("--explain", action="store_true", help="say for every call node whether and why it was (not) delegated")
    parser.add_argument("-o", "--output", type=Path, default=None, metavar="FILE.pte", help="write the program as a .pte file")
    parser.add_argument("--external-data", action="store_true",
                        help="with -o X.pte: keep weights (constants and delegates' named data) out of the "
                        ".pte, in X.ptd beside it")
    parser.add_argument("--etrecord", type=Path, default=None, metavar="FILE",
                        help="with an ExecuTorch --partitioner and -o: also write the ETRecord ExecuTorch's "
                        "Inspector reads with the .pte's ETDump")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help="compile partitions in N worker processes")
    parser.add_argument("--no-cache", action="store_true", help="compile every partition (no preprocess cache)")
    parser.add_argument("--allow-non-core", action="store_true",
                        help="keep ops outside core ATen (which ExecuTorch's to_edge refuses) instead of refusing "
                             "them; the runtime may lack their kernels")
    add_recipe_arguments(parser)
    add_checkpoint_arguments(parser)
    parser.set_defaults(func=run)


def _options(args: argparse.Namespace) -> LowerOptions:
    mode: Literal["whole", "ops", "partitioner", "executorch", "none"] = (
        "whole" if args.whole else "ops" if args.ops is not None else "partitioner" if args.partitioner else "none"
    )
    if mode == "partitioner" and (":" not in args.partitioner or args.backend is None):
        mode = "executorch"  # a short name, or MODULE:NAME without a backend id
    try:
        return LowerOptions(
            model=args.model,
            backend=args.backend,
            mode=mode,
            ops=tuple(op.strip() for op in (args.ops or "").split(",") if op.strip()),
            partitioner=args.partitioner,
            tag_constants=args.tag_constants,
            tag_mutated_buffers=args.tag_mutated_buffers,
            jobs=args.jobs,
            cache=not args.no_cache,
            allow_non_core=args.allow_non_core,
        )
    except pydantic.ValidationError as exc:
        error = exc.errors()[0]
        where = f"--{str(error['loc'][0]).replace('_', '-')}: " if error.get("loc") else ""
        raise LoweringError(where + str(error["msg"]).removeprefix("Value error, ")) from None


def _load_attr(spec: str) -> Any:
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise LoweringError(f"--partitioner {spec!r}: write MODULE:NAME or FILE.py:NAME")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            loader_spec = importlib.util.spec_from_file_location(path.stem, path)
            if loader_spec is None or loader_spec.loader is None or not path.is_file():
                raise LoweringError(f"--partitioner {spec!r}: file {module_name!r} not found")
            module = importlib.util.module_from_spec(loader_spec)
            loader_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except LoweringError:
        raise
    except Exception as exc:  # any import failure of user code is a user error
        raise LoweringError(f"--partitioner {spec!r}: cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
    if not hasattr(module, attr):
        raise LoweringError(f"--partitioner {spec!r}: {module_name!r} has no attribute {attr!r}")
    return getattr(module, attr)


def _check_backend(backend: str) -> None:

    known = sorted(registered_backends())
    if backend not in known:
        raise UsageError(
            f"--backend {backend!r} is not a registered backend; registered: {', '.join(known)} "
            "(a backend registers itself with texir.lowering.register_backend when its module is imported)"
        )


def _check_ops(ops: tuple[str, ...]) -> None:
    # the adapters import torch (~2 s): only --ops pays for it
    from texir.adapters.targets import resolve_target

    for op in ops:
        namespace, _, rest = op.partition("::")
        if not namespace or not rest:
            raise UsageError(f"--ops {op!r}: spell an op 'namespace::name.overload', e.g. aten::relu.default")
        if "." not in rest:
            raise UsageError(f"--ops {op!r} names no overload; did you mean {op}.default? (texir show MODEL lists them)")
        try:
            resolve_target(op)
        except UnsupportedError:
            raise UsageError(f"--ops {op!r} is not a registered torch operator; check the name and overload") from None


def _warn_absent_ops(program: Program, ops: tuple[str, ...]) -> None:
    present = {n.target for _, g in walk_keyed_graphs(program.graph) for n in g.nodes if isinstance(n, CallFunction)}
    for op in ops:
        if op in present:
            continue
        # A decomposed node keeps its original node's name as ancestor ('conv2d.0' for the nodes
        # aten::conv2d became), and FX names nodes after their op: that tells what it became.
        base = op.partition("::")[2].partition(".")[0]
        became: dict[str, None] = {}
        for _, graph in walk_keyed_graphs(program.graph):
            for i, node in enumerate(graph.nodes):
                prov = graph.prov(i)
                ancestor = (prov.ancestor or "") if prov is not None else ""
                stem = ancestor.partition(".")[0].rstrip("0123456789").rstrip("_")
                if isinstance(node, CallFunction) and stem == base:
                    became[node.target] = None
        what = f"; it was decomposed into {', '.join(became)}" if became else ""
        print(
            f"texir lower: warning: --ops {op}: no node calls it after `lower` decomposed MODEL to core ATen "
            f"(as ExecuTorch's to_edge does){what}; `texir show --decompose MODEL` shows the decomposed ops",
            file=sys.stderr,
        )


def build_partitioner(opts: LowerOptions) -> Any:

    if opts.backend is None:
        raise UsageError("--whole, --ops and a texir --partitioner need --backend ID")
    if opts.mode == "whole":
        return WholeProgramPartitioner(
            opts.backend, tag_constants=opts.tag_constants, tag_mutated_buffers=opts.tag_mutated_buffers
        )
    if opts.mode == "ops":
        return OpSupportPartitioner(
            opts.backend, opts.ops, tag_constants=opts.tag_constants, tag_mutated_buffers=opts.tag_mutated_buffers
        )
    assert opts.partitioner is not None
    target = _load_attr(opts.partitioner)
    if isinstance(target, type):
        try:
            return target(opts.backend)
        except Exception as exc:  # a user class that cannot be built from the backend id
            raise LoweringError(f"--partitioner {opts.partitioner!r}: {target.__name__}({opts.backend!r}) failed: {exc}") from exc
    if not callable(target):
        raise LoweringError(f"--partitioner {opts.partitioner!r} is not callable")
    return target


def _ptd_path(output: Path) -> Path:
    """The .ptd of `-o X.pte --external-data`: X.ptd beside it (named after its program, so two
    programs lowered into one directory keep their own weights)."""
    return output.with_suffix(".ptd")


def _declared(args: argparse.Namespace) -> list[tuple[str, Path | None]]:
    ptd = _ptd_path(args.output) if args.external_data and args.output is not None else None
    return [("--snapshot", args.snapshot), ("--external-data", ptd), ("-o", args.output), ("--etrecord", args.etrecord)]


def run(args: argparse.Namespace) -> int:

    if is_checkpoint(args.model):
        return run_checkpoint(args)
    check_checkpoint_arguments(args)
    recipe = recipe_from_args(args)  # None without --recipe/--qlinear/--qembedding; sets --partitioner xnnpack
    opts = _options(args)
    for flag, given in (("--etrecord", args.etrecord is not None), ("--external-data", args.external_data)):
        if given and args.output is None:
            raise UsageError(f"{flag} needs -o FILE.pte: it describes that file" if flag == "--etrecord"
                             else f"{flag} needs -o FILE.pte: the weights go beside that file")
    if opts.mode != "executorch" and args.etrecord is not None:
        raise UsageError("--etrecord works with an ExecuTorch --partitioner (xnnpack, vulkan, example or MODULE:NAME)")
    if opts.mode == "executorch" and opts.partitioner is None:  # pragma: no cover - _options rules this out
        raise UsageError("give --partitioner NAME (xnnpack, vulkan, example) or MODULE:NAME")
    declared = _declared(args)
    refuse_clobbering("texir lower", [opts.model], declared)
    with Outputs() as outputs, Progress("texir lower") as progress:
        for flag, path in declared:  # every output checked before any work
            outputs.add(flag, path)
        if opts.mode == "executorch":
            lowered, report, edge = _lower_executorch(args, opts, progress, recipe)
        else:
            lowered, report = _lower_texir(args, opts, progress)
            edge = None
        written = _write_outputs(args, outputs, lowered, progress, edge)
        outputs.commit()
    explained = explain_rows(report) if args.explain else None
    if args.json:
        print_json(sys.stdout, report, explained, written)
    else:
        print_report(sys.stdout, report, explained)
    for name, kind, size in written:
        print(f"wrote {name} ({size:,} bytes, {kind})", file=sys.stderr)
    return 0


def _lower_texir(args: argparse.Namespace, opts: LowerOptions, progress: Any) -> tuple[Program, LowerReport]:
    """--whole, --ops, a texir --partitioner, or none: the program decomposed at load, then
    `lower_decomposed` (the path `texir.lower` finishes on: to_edge rewrites, each partitioner);
    the lowered program and its report."""

    if opts.backend is not None and opts.mode in ("whole", "ops"):
        _check_backend(opts.backend)  # (a --partitioner module may register its backend on import)
    if opts.mode == "ops":
        _check_ops(opts.ops)
    with progress.phase(f"loading {opts.model}"):
        program = load_program(opts.model, decompose=True, allow_non_core=opts.allow_non_core)
    if opts.mode == "ops":
        _warn_absent_ops(program, opts.ops)
    partitioners = [] if opts.mode == "none" else [build_partitioner(opts)]
    with progress.phase("lowering"):
        done = lower_decomposed(program, partitioners, cache="default" if opts.cache else None, jobs=opts.jobs)
    return done.program, done.report


def _lower_executorch(
    args: argparse.Namespace, opts: LowerOptions, progress: Any, recipe: Any = None
) -> tuple[Program, LowerReport, Program]:
    """An ExecuTorch partitioner, through `texir.lower` (as ExecuTorch's to_edge_transform_and_lower);
    with a `recipe` (`texir.recipes.Recipe`), MODEL quantized by it first (`texir.cli.lower_recipe`)."""
    # lowering from an ExportedProgram imports torch: only this path pays for it
    from texir.orchestrate import lower

    assert opts.partitioner is not None  # checked in run
    with contextlib.ExitStack() as scope:
        if opts.partitioner in NATIVE_PARTITIONERS:
            module = importlib.import_module(NATIVE_PARTITIONERS[opts.partitioner])
            partitioner = module.partitioner()
            scope.enter_context(module.registered())  # its backend, for this lowering only
        else:
            partitioner = executorch_partitioner_for(opts.partitioner)
        if recipe is not None:
            return lower_with_recipe(args, recipe, partitioner, progress, jobs=opts.jobs, cache=opts.cache)
        with progress.phase(f"loading {opts.model}"):
            source: Any = load_program(opts.model) if is_snapshot_path(opts.model) else load_model(opts.model)
        cache: Literal["default"] | None = "default" if opts.cache else None
        with progress.phase(f"lowering with {partitioner!r}"):
            done = lower(source, [partitioner], cache=cache, jobs=opts.jobs, allow_non_core=opts.allow_non_core)
    return done.program, done.report, done.edge


def _write_outputs(
    args: argparse.Namespace, outputs: Any, lowered: Program, progress: Any, edge: Program | None
) -> list[tuple[str, str, int]]:
    """--snapshot (with tensor data), -o (.pte, its .ptd) and --etrecord (from `edge`, the program
    before partitioning), each to its temporary file (`outputs` renames them together);
    (path, kind, bytes) of each."""
    written: list[tuple[str, str, int]] = []
    if args.snapshot is not None:

        fmt = snapshot.format_for_path(args.snapshot)
        with progress.phase(f"writing {args.snapshot}"):
            outputs.write(args.snapshot, lambda tmp: snapshot.dump(lowered, tmp, format=fmt, include_data=True))
        written.append((str(args.snapshot), "snapshot with tensor data", outputs.size(args.snapshot)))
    if args.output is None:
        return written
    # the emitter loads only when -o asks for a file (it costs every other command's startup)
    from texir.emit import DEFAULT_EXTERNAL_TAG, EmitOptions, emit, emit_with_debug
    from texir.serialize import pte

    options = EmitOptions(external_constants=True, external_named_data=DEFAULT_EXTERNAL_TAG) \
        if args.external_data else EmitOptions()
    with progress.phase(f"writing {args.output}"):
        emitted = emit_with_debug(lowered, options) if args.etrecord is not None else None
        program = emitted.program if emitted is not None else emit(lowered, options)
        for data in program.external:
            path = _ptd_path(args.output)
            if data.tag != DEFAULT_EXTERNAL_TAG:  # pragma: no cover - the CLI's options make one tag
                path = args.output.with_name(f"{args.output.stem}.{data.tag}.ptd")
                outputs.add("--external-data", path)
            outputs.write(path, lambda tmp, data=data: pte.dump_ptd(data, tmp))
            written.append((str(path), f".ptd: {len(data.entries)} entries", outputs.size(path)))
        outputs.write(args.output, lambda tmp: pte.dump(program, tmp))
        written.append((str(args.output), ".pte", outputs.size(args.output)))
    if emitted is not None and edge is not None:
        # the ExecuTorch bridge imports torch and the optional executorch extra: only --etrecord pays
        from texir.executorch import write_etrecord

        with progress.phase(f"writing {args.etrecord}"):
            outputs.write(args.etrecord, lambda tmp: write_etrecord(tmp, edge, emitted))
        written.append((str(args.etrecord), "ETRecord", outputs.size(args.etrecord)))
    return written


def executorch_partitioner_for(spec: str) -> Any:
    """The texir partitioner for `--partitioner SPEC` without --backend: a short name or a
    MODULE:NAME naming an ExecuTorch partitioner class, instance, or function returning one."""
    # the ExecuTorch bridge imports torch: only an ExecuTorch --partitioner pays for it
    from texir.executorch import PARTITIONERS, as_executorch_partitioner, partitioner_by_name

    if ":" not in spec:
        if spec not in PARTITIONERS:
            raise LoweringError(
                f"--partitioner {spec!r} is not a known partitioner; texir's own: {', '.join(sorted(NATIVE_PARTITIONERS))}; "
                f"ExecuTorch's (NAME or executorch:NAME): {', '.join(sorted(PARTITIONERS))}; or give MODULE:CLASS"
            )
        return partitioner_by_name(spec)
    prefix, _, short = spec.partition(":")
    if prefix == "executorch" and "." not in short:  # executorch:xnnpack, ExecuTorch's own by short name
        return partitioner_by_name(short)
    target = _load_attr(spec)
    found = as_executorch_partitioner(target)
    if found is None and callable(target) and not isinstance(target, type):
        try:
            found = as_executorch_partitioner(target())
        except TypeError:
            found = None
    if found is None:
        raise LoweringError(
            f"--partitioner {spec!r} is not an ExecuTorch partitioner (a Partitioner class, instance or a function "
            "returning one); for a texir partitioner add --backend ID"
        )
    return found
