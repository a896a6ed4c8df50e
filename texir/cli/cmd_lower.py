"""`texir lower MODEL --backend ID (--whole | --ops ... | --partitioner ...)`: partition, delegate, report."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Literal

import msgspec
import pydantic

from texir.errors import LoweringError, UsageError
from texir.ir import CallFunction, Program
from texir.ir.names import CALL_DELEGATE, GETITEM
from texir.lowering.plan import PartitionPlan, node_key, walk_keyed_graphs

EPILOG = """\
examples:
  texir lower texir.models:conv_relu_tan --backend texir-reference --whole --tag-constants
  texir lower models/mlp.py:build --backend texir-reference --ops aten::add.Tensor,aten::mul.Tensor --explain
  texir lower model.pt2 --backend texir-reference --partitioner my_pkg.parts:MyPartitioner --json
  texir lower texir.models:conv_relu_tan -o model.pte          # no --backend: written undelegated
  texir lower texir.models:conv_relu_tan --partitioner xnnpack -o model.pte     # ExecuTorch's XNNPACK
  texir lower model.pt2 --partitioner my_pkg.parts:MyEtPartitioner --jobs 2 -o model.pte

--partitioner MODULE:NAME (or FILE.py:NAME) with --backend ID: a texir partitioner; a class is
instantiated with the backend id, any other callable is used as the partitioner itself
(Program -> texir.lowering.PartitionPlan).
--partitioner NAME (xnnpack, vulkan, example) or MODULE:NAME without --backend: an ExecuTorch
partitioner (class built with no arguments, or instance), run like ExecuTorch's
to_edge_transform_and_lower (needs the executorch extra). Backends' results are cached in memory
and under $TEXIR_CACHE_DIR (--no-cache to compile everything); --jobs N compiles partitions in N
worker processes.
Each row is one partition: tag, backend, delegated node count, inputs, outputs, and the
parameters/buffers/constants the delegate consumed.
"""


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
    parser.add_argument("model", metavar="MODEL", help="FILE.py:CALLABLE, PACKAGE.MODULE:CALLABLE, FILE.pt2 or a snapshot")
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
                        help="keep weights (constants and delegates' named data) out of the .pte, in "
                        "_default_external_constant.ptd beside it")
    parser.add_argument("--etrecord", type=Path, default=None, metavar="FILE",
                        help="with an ExecuTorch --partitioner and -o: also write the ETRecord ExecuTorch's "
                        "Inspector reads with the .pte's ETDump")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help="compile partitions in N worker processes")
    parser.add_argument("--no-cache", action="store_true", help="compile every partition (no preprocess cache)")
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
    from texir.lowering.backend import registered_backends

    known = sorted(registered_backends())
    if backend not in known:
        raise UsageError(
            f"--backend {backend!r} is not a registered backend; registered: {', '.join(known)} "
            "(a backend registers itself with texir.lowering.register_backend when its module is imported)"
        )


def _check_ops(ops: tuple[str, ...]) -> None:
    from texir.adapters.targets import resolve_target
    from texir.errors import UnsupportedError

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
    from texir.lowering.partitioners import (
        OpSupportPartitioner,
        WholeProgramPartitioner,
    )

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


def explain(program: Program, plan: PartitionPlan, partitioner: Any, modules: dict[str, str]) -> list[dict[str, str]]:
    """One entry per call_function node of every graph: delegated (where) or why not."""
    tags = plan.tag_map()
    rows: list[dict[str, str]] = []
    why = getattr(partitioner, "explain", None)
    for path, graph in walk_keyed_graphs(program.graph):
        delegate_calls: set[str] = set()
        for node in graph.nodes:
            if not isinstance(node, CallFunction):
                continue
            key = node_key(path, node.name)
            tag = tags.get(key)
            first = node.args[0] if node.args else None
            if node.target == CALL_DELEGATE:
                delegate_calls.add(node.name)
            if tag is not None:
                spec = plan.spec_map()[tag]
                reason = f"delegated to {spec.backend_id} as {tag} ({modules.get(tag, '?')})"
                status = "delegated"
            elif node.target == CALL_DELEGATE or (
                node.target == GETITEM and getattr(first, "name", None) in delegate_calls
            ):
                status, reason = "kept", "already a delegate call (or its result)"
            else:
                status = "kept"
                reason = why(node) if callable(why) else "not tagged by the partitioner"
            rows.append({"node": key, "target": node.target, "status": status, "reason": reason})
    return rows


def run(args: argparse.Namespace) -> int:
    from texir.cli.model_spec import load_program
    from texir.cli.paths import refuse_clobbering
    from texir.cli.progress import Progress
    from texir.lowering.api import call_partitioner
    from texir.lowering.delegate import LoweringReport, lower_plan_explained
    from texir.lowering.plan import ops_to_not_decompose

    opts = _options(args)
    refuse_clobbering("texir lower", [opts.model],
                      [("--snapshot", args.snapshot), ("-o", args.output), ("--etrecord", args.etrecord)])
    if args.etrecord is not None and args.output is None:
        raise UsageError("--etrecord needs -o FILE.pte: the record describes that file's instructions")
    if opts.mode == "executorch":
        return _run_executorch(args, opts)
    if args.etrecord is not None:
        raise UsageError("--etrecord works with an ExecuTorch --partitioner (xnnpack, vulkan, example or MODULE:NAME)")
    with Progress("texir lower") as progress:
        if opts.backend is not None and opts.mode in ("whole", "ops"):
            _check_backend(opts.backend)  # (a --partitioner module may register its backend on import)
        if opts.mode == "ops":
            _check_ops(opts.ops)
        with progress.phase(f"loading {opts.model}"):
            program = load_program(opts.model, decompose=True)
        if opts.mode == "ops":
            _warn_absent_ops(program, opts.ops)
        report = LoweringReport(program=program, partitions=())
        explanation: list[dict[str, str]] = []
        if opts.mode != "none":
            partitioner = build_partitioner(opts)
            with progress.phase("partitioning"):
                plan = call_partitioner(partitioner, program)
            with progress.phase("lowering"):
                report = lower_plan_explained(program, plan)
            if args.explain:
                modules = {p.tag: p.module for p in report.partitions}
                explanation = explain(program, plan, partitioner, modules)
            keep = ops_to_not_decompose(partitioner, program)
            del keep  # the MODEL is decomposed before partitioning; listed ops are informational
        lowered = report.program
        _write_outputs(args, lowered, progress)

    rows = [
        {
            "tag": p.tag,
            "backend": p.backend_id,
            "module": p.module,
            "graph": p.graph,
            "nodes": len(p.nodes),
            "inputs": list(p.inputs),
            "outputs": list(p.outputs),
            "consumed": list(p.consumed),
        }
        for p in report.partitions
    ]
    if args.json:
        payload: dict[str, Any] = {"partitions": rows}
        if args.explain:
            payload["explain"] = explanation
        if args.output is not None:
            payload["pte"] = str(args.output)
        sys.stdout.write(msgspec.json.encode(payload).decode() + "\n")
        return 0
    out = sys.stdout
    if not rows:
        out.write("no partitions (nothing delegated)\n")
    else:
        header = ("tag", "backend", "module", "nodes", "inputs", "outputs", "consumed")
        table: list[tuple[str, str, str, str, str, str, str]] = [header] + [
            (
                p.tag if not p.graph else f"{p.graph}/{p.tag}",
                p.backend_id,
                p.module,
                str(len(p.nodes)),
                str(len(p.inputs)),
                str(len(p.outputs)),
                ", ".join(p.consumed) or "-",
            )
            for p in report.partitions
        ]
        _write_table(out, table)
    if args.explain:
        out.write("\n")
        for e in explanation:
            out.write(f"{e['node']} ({e['target']}): {e['status']}: {e['reason']}\n")
    if args.output is not None:
        out.write(f"wrote {args.output}\n")
    return 0


def _write_table(out: Any, table: Sequence[Sequence[str]]) -> None:
    """Rows of cells, left-aligned in columns two spaces apart (the first row is the header)."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() + "\n")


def _write_outputs(args: argparse.Namespace, lowered: Program, progress: Any, edge: Program | None = None) -> None:
    """--snapshot (with tensor data), -o (.pte, its .ptd first) and --etrecord (from `edge`, the
    program before partitioning), each written atomically."""
    if args.snapshot is not None:
        from texir.serialize import snapshot

        snapshot.dump(lowered, args.snapshot, include_data=True)
        print(f"wrote {args.snapshot} ({args.snapshot.stat().st_size:,} bytes, snapshot with tensor data)",
              file=sys.stderr)
    if args.output is not None:
        from texir.emit import DEFAULT_EXTERNAL_TAG, EmitOptions, emit, emit_with_debug
        from texir.serialize import pte

        options = EmitOptions(external_constants=True, external_named_data=DEFAULT_EXTERNAL_TAG) \
            if args.external_data else EmitOptions()
        with progress.phase(f"writing {args.output}"):
            emitted = emit_with_debug(lowered, options) if args.etrecord is not None else None
            program = emitted.program if emitted is not None else emit(lowered, options)
            for data in program.external:  # the data first: a .pte never refers to a missing file
                path = args.output.with_name(f"{data.tag}.ptd")
                pte.dump_ptd(data, path)
                print(f"wrote {path} ({path.stat().st_size:,} bytes, .ptd: {len(data.entries)} entries)", file=sys.stderr)
            pte.dump(program, args.output)
        print(f"wrote {args.output} ({args.output.stat().st_size:,} bytes, .pte)", file=sys.stderr)
        if emitted is not None and edge is not None:
            from texir.adapters.executorch import write_etrecord

            with progress.phase(f"writing {args.etrecord}"):
                write_etrecord(args.etrecord, edge, emitted)
            print(f"wrote {args.etrecord} ({args.etrecord.stat().st_size:,} bytes, ETRecord)", file=sys.stderr)


def executorch_partitioner_for(spec: str) -> Any:
    """The texir partitioner for `--partitioner SPEC` without --backend: a short name or a
    MODULE:NAME naming an ExecuTorch partitioner class, instance, or function returning one."""
    from texir.adapters.executorch import as_executorch_partitioner, partitioner_by_name

    if ":" not in spec:
        return partitioner_by_name(spec)
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


def _rows_of(program: Program) -> list[dict[str, Any]]:
    """One row per delegate call of the top graph, in graph order."""
    from texir.ir import GetAttr, Placeholder, UserInput

    modules = {m.name: m.module for m in program.lowered_modules}
    rows: list[dict[str, Any]] = []
    for node in program.graph.nodes:
        if not isinstance(node, GetAttr) or node.target not in modules:
            continue
        module = modules[node.target]
        sub = module.original_program
        user = {s.arg.name for s in sub.signature.inputs if isinstance(s, UserInput) and hasattr(s.arg, "name")}
        inputs = [n.name for n in sub.graph.nodes if isinstance(n, Placeholder) and n.name in user]
        consumed = [n.name for n in sub.graph.nodes if isinstance(n, Placeholder) and n.name not in user]
        rows.append({
            "tag": node.target,
            "backend": module.backend_id,
            "module": node.target,
            "graph": "",
            "nodes": sum(isinstance(n, CallFunction) for n in sub.graph.nodes),
            "inputs": inputs,
            "outputs": [f"out{i}" for i in range(len(sub.signature.outputs))],
            "consumed": consumed,
            "bytes": len(module.processed_bytes),
            "named_data": len(module.named_data),
        })
    return rows


def _run_executorch(args: argparse.Namespace, opts: LowerOptions) -> int:
    from texir.cli.model_spec import is_snapshot_path, load_model, load_program
    from texir.cli.progress import Progress
    from texir.lowering import lower, lower_with_edge

    if args.explain:
        raise UsageError("--explain works with texir partitioners; an ExecuTorch partitioner does not say why")
    if opts.partitioner is None:
        raise UsageError("give --partitioner NAME (xnnpack, vulkan, example) or MODULE:NAME")
    with Progress("texir lower") as progress:
        partitioner = executorch_partitioner_for(opts.partitioner)
        with progress.phase(f"loading {opts.model}"):
            source: Any = load_program(opts.model) if is_snapshot_path(opts.model) else load_model(opts.model)
        cache: Literal["default"] | None = "default" if opts.cache else None
        edge: Program | None = None
        with progress.phase(f"lowering with {partitioner!r}"):
            if args.etrecord is not None:
                lowered, edge = lower_with_edge(source, [partitioner], cache=cache, jobs=opts.jobs)
            else:
                lowered = lower(source, [partitioner], cache=cache, jobs=opts.jobs)
        _write_outputs(args, lowered, progress, edge)
    rows = _rows_of(lowered)
    if args.json:
        payload: dict[str, Any] = {"partitions": rows}
        if args.output is not None:
            payload["pte"] = str(args.output)
        sys.stdout.write(msgspec.json.encode(payload).decode() + "\n")
        return 0
    out = sys.stdout
    if not rows:
        out.write("no partitions (nothing delegated)\n")
    else:
        header = ("module", "backend", "nodes", "inputs", "consumed", "blob bytes", "named data")
        table = [header] + [
            (r["module"], r["backend"], str(r["nodes"]), str(len(r["inputs"])), str(len(r["consumed"])),
             f"{r['bytes']:,}", str(r["named_data"]))
            for r in rows
        ]
        _write_table(out, table)
    if args.output is not None:
        out.write(f"wrote {args.output}\n")
    return 0
