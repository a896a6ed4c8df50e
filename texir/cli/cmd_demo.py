"""`texir demo`: export the built-in ConvReLUTan model, lower it to XNNPACK (or texir's demo backend),
write .pte + snapshot, run the .pte in ExecuTorch's runtime and compare with eager."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any, Literal

import pydantic

from texir.backends.demo import BACKEND_ID
from texir.cli.noise import native_stderr_filtered
from texir.cli.progress import Progress
from texir.errors import TexirError
from texir.ir import CallFunction, verify
from texir.lowering import OpSupportPartitioner, WholeProgramPartitioner, get_lowered_submodules, to_backend
from texir.serialize import snapshot
from texir.serialize.pte import dump as dump_pte
from texir.serialize.pte.codec import dumps as pte_bytes
from texir.ir.names import CALL_DELEGATE, GETITEM

EPILOG = """\
examples:
  texir demo                      # XNNPACK: writes out/demo.pte and out/demo.snapshot.json, runs the .pte
  texir demo --out-dir /tmp/x --json
  texir demo --partitioner executorch:xnnpack   # ExecuTorch's XNNPACK partitioner and backend
  texir demo --partitioner ops    # texir's demo backend instead
  texir demo --partitioner whole

The model is texir.models:conv_relu_tan (two conv+relu blocks, then tan; input 4x3x64x64), exported
with torch.export. By default texir's native XNNPACK partitioner and backend (texir.backends.xnnpack,
the blobs ExecuTorch's XnnpackBackend writes) lower it with texir.orchestrate.lower (as ExecuTorch's
to_edge_transform_and_lower); --partitioner executorch:xnnpack uses ExecuTorch's own partitioner and
backend instead. XNNPACK takes the convs and relus, tan stays a portable kernel; the .pte then runs in ExecuTorch's runtime and its output is
compared with eager. With 'ops' or 'whole' the program is delegated to texir's demo backend
BackendWithDelegateMappingDemo, which fuses each conv+relu into one backend op and splits tan into
sin, cos and div; the debug handle map says which backend op implements which IR nodes.
"""

DEMO_OPS = ("aten::convolution.default", "aten::relu.default", "aten::tan.default")
SNAPSHOT_NAME = "demo.snapshot.json"
PTE_NAME = "demo.pte"


class DemoOptions(pydantic.BaseModel):
    """Validated `texir demo` options."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")

    out_dir: Path = Path("out")
    partitioner: Literal["xnnpack", "executorch:xnnpack", "ops", "whole"] = "xnnpack"
    json_output: bool = False
    verbose: bool = False
    """Let native libraries' probes through (the runtime's cpuinfo lines)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="lower the built-in ConvReLUTan model to XNNPACK, write .pte + snapshot, run it in ExecuTorch",
        description="Run the whole pipeline on the built-in ConvReLUTan model: export, convert, "
        "partition, delegate (XNNPACK by default), write demo.pte and demo.snapshot.json, run the .pte.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out-dir", type=Path, default=Path("out"), metavar="DIR",
                        help="directory for demo.pte and demo.snapshot.json (default ./out)")
    parser.add_argument("--partitioner", choices=("xnnpack", "executorch:xnnpack", "ops", "whole"),
                        default="xnnpack", help="'xnnpack': texir's native XNNPACK (default); "
                        "'executorch:xnnpack': ExecuTorch's; 'ops': convolution/relu/tan partitions "
                        "for texir's demo backend; 'whole': the whole program to the demo backend")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        options = DemoOptions(out_dir=args.out_dir, partitioner=args.partitioner, json_output=args.json,
                              verbose=bool(getattr(args, "verbose", False)))
    except pydantic.ValidationError as exc:
        raise TexirError(f"invalid demo options: {exc.errors()[0]['msg']}") from None
    summary = run_demo(options)
    if options.json_output:
        print(json.dumps(summary, indent=2, sort_keys=True))
    else:
        print(format_summary(summary))
    return 0


def run_demo(options: DemoOptions) -> dict[str, Any]:
    """Run the demo pipeline and return its summary (what `--json` prints)."""
    if options.partitioner in ("xnnpack", "executorch:xnnpack"):
        return _run_xnnpack(options)
    # torch (and the adapters and model, which import it) loads in seconds, the emitter in a few
    # tenths: only `texir demo` pays, not every command's start
    import torch

    from texir.adapters import from_exported_program, to_exported_program
    from texir.emit import emit
    from texir.models import conv_relu_tan

    out_dir = _out_dir(options)
    with Progress("texir demo") as progress, warnings.catch_warnings():
        # torch's own deprecation noise (pytree, strict export): not actionable for demo users.
        warnings.simplefilter("ignore", FutureWarning)
        with progress.phase("exporting ConvReLUTan"):
            model, inputs = conv_relu_tan()
            exported = torch.export.export(model, inputs, strict=True)
        with progress.phase("converting to IR"):
            program = from_exported_program(exported, decompose=True)
        partitioner = (
            WholeProgramPartitioner(BACKEND_ID)
            if options.partitioner == "whole"
            else OpSupportPartitioner(BACKEND_ID, DEMO_OPS)
        )
        with progress.phase("delegating"):
            lowered = to_backend(program, partitioner)
            verify(lowered)
        with progress.phase("checking against eager"):
            with torch.no_grad():
                expected = model(*inputs)
                got = to_exported_program(lowered).module()(*inputs)
            max_abs_diff = float((got - expected).abs().max())
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TexirError(f"cannot create --out-dir {out_dir}: {exc.strerror or exc}") from None
        snapshot_path = out_dir / SNAPSHOT_NAME
        pte_path = out_dir / PTE_NAME
        with progress.phase("writing snapshot"):
            snapshot.dump(lowered, snapshot_path, format="json", include_data=True)
        with progress.phase("writing .pte"):
            dump_pte(emit(lowered), pte_path)

    partitions, delegated = _partition_rows(lowered, describe_blob=lambda b: b.decode("utf-8", errors="replace"))
    remaining = [
        n.target for n in lowered.graph.nodes
        if isinstance(n, CallFunction) and n.target not in (CALL_DELEGATE, GETITEM)
    ]
    return {
        "model": "texir.models:conv_relu_tan",
        "partitioner": options.partitioner,
        "call_function_nodes": sum(isinstance(n, CallFunction) for n in program.graph.nodes),
        "partitions": partitions,
        "delegated_nodes": delegated,
        "remaining_ops": remaining,
        "max_abs_diff_vs_eager": max_abs_diff,
        "files": {
            "pte": {"path": str(pte_path), "bytes": pte_path.stat().st_size},
            "snapshot": {"path": str(snapshot_path), "bytes": snapshot_path.stat().st_size},
        },
    }


def _partition_rows(lowered: Any, describe_blob: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """One summary row per lowered module, and the names of all delegated call nodes."""
    partitions: list[dict[str, Any]] = []
    delegated: list[str] = []
    for name, module, call in get_lowered_submodules(lowered):
        members = [n.name for n in module.original_program.graph.nodes if isinstance(n, CallFunction)]
        delegated.extend(members)
        row: dict[str, Any] = {
            "module": name,
            "call": call.name,
            "backend": module.backend_id,
            "nodes": members,
            "processed_bytes": describe_blob(module.processed_bytes),
            "debug_handle_map": [
                {"identifier": e.identifier, "debug_handles": list(e.debug_handles)}
                for e in module.debug_handle_map or ()
            ],
        }
        if module.named_data:
            row["named_data"] = [{"key": e.key, "bytes": e.nbytes, "alignment": e.alignment} for e in module.named_data]
        partitions.append(row)
    return partitions, delegated


def _out_dir(options: DemoOptions) -> Path:
    out_dir = options.out_dir
    if out_dir.exists() and not out_dir.is_dir():
        raise TexirError(f"--out-dir {out_dir} exists and is not a directory; pass a directory path")
    return out_dir


def _run_xnnpack(options: DemoOptions) -> dict[str, Any]:
    # torch (and the bridge, orchestrate and model, which import it) loads in seconds, the emitter
    # and the XNNPACK backend in a few tenths: only `texir demo` pays, not every command's start
    import torch

    from texir.backends import xnnpack
    from texir.emit import emit
    from texir.executorch import partitioner_by_name, run_pte
    from texir.models import conv_relu_tan
    from texir.orchestrate import lower

    out_dir = _out_dir(options)
    with Progress("texir demo") as progress, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with progress.phase("exporting ConvReLUTan"):
            model, inputs = conv_relu_tan()
            exported = torch.export.export(model, inputs, strict=True)
        with progress.phase(f"lowering to XNNPACK ({options.partitioner})"):
            if options.partitioner == "xnnpack":
                with xnnpack.registered():  # the native backend for this lowering only
                    lowered = lower(exported, [xnnpack.partitioner()]).program
            else:
                lowered = lower(exported, [partitioner_by_name("xnnpack")]).program
            verify(lowered)
        with progress.phase("emitting .pte"):
            data = pte_bytes(emit(lowered))
        with progress.phase("running the .pte in ExecuTorch's runtime"), native_stderr_filtered(options.verbose):
            (got,) = run_pte(data, inputs)
            with torch.no_grad():
                expected = model(*inputs)
            max_abs_diff = float((got - expected).abs().max())
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TexirError(f"cannot create --out-dir {out_dir}: {exc.strerror or exc}") from None
        snapshot_path, pte_path = out_dir / SNAPSHOT_NAME, out_dir / PTE_NAME
        with progress.phase("writing snapshot and .pte"):
            snapshot.dump(lowered, snapshot_path, format="json", include_data=True)
            dump_pte(emit(lowered), pte_path)
    partitions, delegated = _partition_rows(
        lowered, describe_blob=lambda b: f"<{len(b):,} bytes of XNNPACK flatbuffer>"
    )
    remaining = [
        n.target for n in lowered.graph.nodes
        if isinstance(n, CallFunction) and n.target not in (CALL_DELEGATE, GETITEM)
    ]
    return {
        "model": "texir.models:conv_relu_tan",
        "partitioner": options.partitioner,
        "call_function_nodes": len(delegated) + len(remaining),
        "partitions": partitions,
        "delegated_nodes": delegated,
        "remaining_ops": remaining,
        "max_abs_diff_vs_eager": max_abs_diff,
        "checked_in": "ExecuTorch runtime",
        "files": {
            "pte": {"path": str(pte_path), "bytes": pte_path.stat().st_size},
            "snapshot": {"path": str(snapshot_path), "bytes": snapshot_path.stat().st_size},
        },
    }


def format_summary(summary: dict[str, Any]) -> str:
    lines = [
        f"texir demo: {summary['model']} -> {len(summary['partitions'])} partition(s), "
        f"{len(summary['delegated_nodes'])}/{summary['call_function_nodes']} call nodes delegated "
        f"(partitioner: {summary['partitioner']})",
    ]
    for part in summary["partitions"]:
        lines.append(f"  {part['module']} [{part['backend']}] nodes: {', '.join(part['nodes'])}")
        lines.append(f"    processed bytes: {part['processed_bytes']}")
        for entry in part.get("named_data", ()):
            lines.append(f"    named data {entry['key'][:16]}... {entry['bytes']:,} bytes (align {entry['alignment']})")
        for entry in part["debug_handle_map"]:
            handles = ", ".join(str(h) for h in entry["debug_handles"])
            lines.append(f"    debug identifier {entry['identifier']} -> debug handles [{handles}]")
    remaining = summary["remaining_ops"]
    lines.append(f"  not delegated: {', '.join(remaining) if remaining else 'nothing'}")
    where = summary.get("checked_in", "lowered program")
    lines.append(f"  {where} vs eager: max abs diff {summary['max_abs_diff_vs_eager']:.3g}")
    for kind, info in summary["files"].items():
        lines.append(f"  wrote {info['path']} ({info['bytes']:,} bytes, {kind})")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run(argparse.Namespace(out_dir=Path("out"), partitioner="xnnpack", json=False)))
