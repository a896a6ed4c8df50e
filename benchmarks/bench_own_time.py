"""texir's own time against torch.export's, in CPU seconds (issue 42's vision goal).

For mobilenet_v2 (torchvision, random weights), a GPT-2 of a tiny config and an MLP of 100
Linear+ReLU blocks (the models of bench_backends.py), each in a fresh process: torch.export, then
everything after it to the `.pte` file written (`lower` with texir's native XNNPACK partitioner,
`cache=None`, `emit`, `dumps`, the write), the first time in the process ("cold") and again
("steady": the best of --steady more runs). Times are `time.process_time()` of the child (CPU
seconds, so other jobs on a shared machine inflate them less than the wall clock); each ratio is
texir's time over the export's, printed beside the goal (steady <= 0.25x, cold <= 0.35x), and the
phases of `lower`'s own report (wall seconds) show where the time goes. --repeat N takes the
median of N fresh processes.

Run: PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_own_time.py [--models mobilenet_v2,gpt2,mlp] [--repeat N]
(the venv's texir-torchvision.pth imports texir at start-up: without PYTHONPATH, a checkout other
than the installed one measures the installed texir; each model's line says which it measured)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from _child import ROOT, spawn  # benchmarks/ is on sys.path when a bench runs
from bench_backends import _model  # the same models as the end-to-end benchmark

GOALS = {"cold": 0.35, "steady": 0.25}
SHOWN = ("import", "decompose", "to_edge", "partition", "preprocess_compiled", "apply")


def _child(name: str, blocks: int, steady: int) -> dict[str, Any]:
    warnings.filterwarnings("ignore")
    sys.path.insert(0, ROOT)
    from tests.real_models import ensure_torchvision_ops

    ensure_torchvision_ops()
    import torch

    from texir.backends import xnnpack
    from texir.emit import emit
    from texir.orchestrate import lower
    from texir.serialize.pte.codec import dumps

    module, args = _model(name, blocks)
    start = time.process_time()
    ep = torch.export.export(module, args, strict=False)
    result: dict[str, Any] = {"export": time.process_time() - start}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "model.pte"

        def run() -> tuple[float, dict[str, float], bytes]:
            start = time.process_time()
            with xnnpack.registered():
                done = lower(ep, [xnnpack.partitioner()], cache=None)
                data = dumps(emit(done.program))
            out.write_bytes(data)
            return time.process_time() - start, {p.name: p.seconds for p in done.report.phases}, data

        result["cold"], result["cold_phases"], data = run()
        runs = [run() for _ in range(steady)]
    best = min(runs, key=lambda r: r[0])
    result["steady"], result["steady_phases"] = best[0], best[1]
    result["same_bytes"] = all(r[2] == data for r in runs)
    result["sha256"] = hashlib.sha256(data).hexdigest()
    result["texir"] = str(Path(sys.modules["texir"].__file__ or "").parent)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=None, metavar="NAME,...", help="only these of mobilenet_v2, gpt2, mlp")
    parser.add_argument("--repeat", type=int, default=1, help="fresh processes per model (median)")
    parser.add_argument("--steady", type=int, default=3, help="lowerings after the first (best of)")
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "BLOCKS", "STEADY"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        name, blocks, steady = args.child
        print(json.dumps(_child(name, int(blocks), int(steady))))
        return 0
    models = [("mobilenet_v2", 0), ("gpt2", 0), ("mlp", 100)]
    if args.models:
        models = [m for m in models if m[0] in args.models.split(",")]
    print("CPU seconds (process_time of a fresh child); texir = lower + emit + .pte written; ratio = texir / export")
    for name, blocks in models:
        found = [spawn(__file__, ["--child", name, str(blocks), str(args.steady)], name) for _ in range(args.repeat)]
        export = statistics.median(f["export"] for f in found)
        label = f"mlp x{blocks}" if name == "mlp" else name
        for when in ("cold", "steady"):
            own = statistics.median(f[when] for f in found)
            ratio = own / export
            verdict = "met" if ratio <= GOALS[when] else "not met"
            phases = found[0][f"{when}_phases"]
            detail = " ".join(f"{key} {phases[key]:.3f}" for key in SHOWN)
            print(f"{label:<13} {when:<6} export {export:6.3f} s  texir {own:6.3f} s  {ratio:5.2f}x "
                  f"(goal <= {GOALS[when]:.2f}x: {verdict})  [{detail}]")
        same = all(f["same_bytes"] for f in found) and len({f["sha256"] for f in found}) == 1
        print(f"{'':<13} .pte sha256 {found[0]['sha256'][:16]}, the same in every run: {same}; texir from {found[0]['texir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
