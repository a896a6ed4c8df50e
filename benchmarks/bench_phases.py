"""Where `texir.lower`'s time goes: the seconds of each phase of one call (`LowerReport.phases`).

For mobilenet_v2 (torchvision, random weights), a GPT-2 of a tiny config (transformers) and an MLP of
100 Linear+ReLU blocks (the models of bench_backends.py; --quick: the MLP with 20 blocks and GPT-2),
each lowered to XNNPACK in a fresh process, through texir's native partitioner and backend
(`--partitioner xnnpack`) and through ExecuTorch's XnnpackPartitioner and backend via the bridge
(`executorch_partitioner(XnnpackPartitioner())`), with no preprocess cache: the first lowering in the
process ("cold": imports and XNNPACK's first-use costs included) and a second one ("steady").

Printed per row: import (FX -> IR), decompose, to_edge, partition, preprocess (the cache's hits /
compiled), apply (building the lowered program), total; ExecuTorch's own preprocess (the seconds
inside XnnpackBackend.preprocess, measured around it: 0 for native; the rest of "pre comp" is texir
converting each partition for it and reading its result back); and texir's own time, the total
minus ExecuTorch's preprocess.

Run: .venv/bin/python benchmarks/bench_phases.py [--quick] [--models mobilenet_v2,gpt2,mlp]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from typing import Any

from _child import ROOT, spawn  # benchmarks/ is on sys.path when a bench runs
from bench_backends import _export  # the same models as the end-to-end benchmark

SIDES = ("native", "bridge")
COLUMNS = (
    ("import", "import"), ("decompose", "decomp"), ("to_edge", "to_edge"), ("partition", "partition"),
    ("preprocess_cached", "pre hit"), ("preprocess_compiled", "pre comp"), ("apply", "apply"), ("total", "total"),
)


def _time_executorch_preprocess() -> list[float]:
    """Accumulate, in the returned one-element list, the seconds inside ExecuTorch's XnnpackBackend's
    own `preprocess` (texir's conversion of the partition around it not included)."""
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    inside = [0.0]
    original = XnnpackBackend.preprocess

    def timed(*args: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args)
        finally:
            inside[0] += time.perf_counter() - start

    XnnpackBackend.preprocess = staticmethod(timed)  # benchmark instrumentation
    return inside


def _child(side: str, name: str, blocks: int) -> dict[str, Any]:
    warnings.filterwarnings("ignore")
    sys.path.insert(0, ROOT)
    from tests.real_models import ensure_torchvision_ops

    ensure_torchvision_ops()
    from texir.orchestrate import lower

    ep, _, _ = _export(name, blocks)
    if side == "native":
        from texir.backends import xnnpack

        inside = [0.0]  # no ExecuTorch code runs

        def run() -> Any:
            with xnnpack.registered():
                return lower(ep, [xnnpack.partitioner()], cache=None)
    else:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        from texir.executorch import executorch_partitioner

        inside = _time_executorch_preprocess()

        def run() -> Any:
            return lower(ep, [executorch_partitioner(XnnpackPartitioner())], cache=None)

    result: dict[str, Any] = {}
    for when in ("cold", "steady"):
        before = inside[0]
        done = run()
        result[when] = {p.name: p.seconds for p in done.report.phases}
        result[when]["executorch_preprocess"] = inside[0] - before
    result["partitions"] = len(done.report.delegates)
    return result


def _row(label: str, phases: dict[str, float]) -> str:
    cells = [f"{phases[key]:10.2f}" for key, _ in COLUMNS]
    et = phases["executorch_preprocess"]
    return f"{label:<26}" + "".join(cells) + f"{et:11.2f}{phases['total'] - et:11.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--models", default=None, metavar="NAME,...", help="only these of mobilenet_v2, gpt2, mlp")
    parser.add_argument("--child", nargs=3, metavar=("SIDE", "MODEL", "BLOCKS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        side, name, blocks = args.child
        print(json.dumps(_child(side, name, int(blocks))))
        return 0
    models = [("mlp", 20), ("gpt2", 0)] if args.quick else [("mobilenet_v2", 0), ("gpt2", 0), ("mlp", 100)]
    if args.models:
        models = [m for m in models if m[0] in args.models.split(",")]
    print("texir.lower per phase, seconds (cache=None; each side a fresh process; 'cold' = first lowering in it)")
    print(f"{'model / side':<26}" + "".join(f"{title:>10}" for _, title in COLUMNS) + f"{'ET preproc':>11}{'texir own':>11}")
    for name, blocks in models:
        label = f"mlp x{blocks}" if name == "mlp" else name
        for side in SIDES:
            found = spawn(__file__, ["--child", side, name, str(blocks)], f"{side} {name}")
            for when in ("cold", "steady"):
                print(_row(f"{label} {side} {when}", found[when]))
        print(f"  ({found['partitions']} XNNPACK partition(s) through the bridge)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
