"""Benchmark .pte emission: texir emit + dump vs ExecuTorch 1.5.1 to_executorch(), same run.

(1) a model with 512 MiB of weights (--quick: 16 MiB): time and extra peak memory of writing the .pte,
    each side in a fresh subprocess, memory measured as the VmHWM rise after the program is built;
(2) a non-delegated program of >= 5,000 nodes (--quick: ~500): texir emit + dumps vs to_executorch().

Run: .venv/bin/python benchmarks/bench_pte.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

from _memory import reset_peak, status  # benchmarks/ is on sys.path when a bench runs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _big_model(mib: int) -> tuple[object, tuple[object, ...]]:
    import torch

    side = int(((mib * 1024 * 1024) / 4 / 2) ** 0.5)
    torch.manual_seed(0)
    with torch.no_grad():
        model = torch.nn.Sequential(
            torch.nn.Linear(side, side, bias=False), torch.nn.ReLU(), torch.nn.Linear(side, side, bias=False)
        ).eval()
    return model, (torch.randn(1, side),)


def _write_weights(model: object, path: str) -> None:
    with open(path, "wb") as fh:
        for p in model.parameters():  # type: ignore[attr-defined]
            fh.write(memoryview(p.detach().numpy()).cast("B"))


def _child_big(side: str, mib: int, out_path: str) -> dict[str, float]:
    warnings.filterwarnings("ignore")
    import torch

    model, args = _big_model(mib)
    ep = torch.export.export(model, args, strict=False)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    # Warm the page cache the same way on both sides: the first large write of a fresh process is
    # slowed by page reclaim, which would otherwise dominate whichever side pays it.
    _write_weights(model, out_path + ".warm")
    os.unlink(out_path + ".warm")
    if side == "texir":
        sys.path.insert(0, ROOT)
        from texir.adapters import from_exported_program
        from texir.emit import emit
        from texir.serialize.pte import dump

        program = from_exported_program(ep, decompose=True)
        reset_peak()
        base = status("VmRSS")
        start = time.perf_counter()
        dump(emit(program), out_path)
        elapsed = time.perf_counter() - start
    else:
        from executorch import exir

        edge = exir.to_edge(ep)
        reset_peak()
        base = status("VmRSS")
        start = time.perf_counter()
        buffer = edge.to_executorch().buffer
        with open(out_path, "wb") as fh:
            fh.write(buffer)
        elapsed = time.perf_counter() - start
    peak = status("VmHWM")
    size = os.path.getsize(out_path)
    os.unlink(out_path)
    # The I/O floor: the weights' own bytes written straight to a file of the same directory.
    start = time.perf_counter()
    _write_weights(model, out_path + ".raw")
    floor = time.perf_counter() - start
    os.unlink(out_path + ".raw")
    return {"seconds": elapsed, "extra_peak": peak - base, "weights": weights, "file_size": size,
            "io_floor": floor}


def bench_big(mib: int) -> None:
    print(f"(1) model with {mib} MiB of weights: emit + write .pte")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for side in ("executorch", "texir"):
            out = os.path.join(tmp, f"{side}.pte")
            proc = subprocess.run(
                [sys.executable, __file__, "--child-big", side, str(mib), out],
                capture_output=True, text=True, check=True,
            )
            results[side] = json.loads(proc.stdout.strip().splitlines()[-1])
    weights = results["texir"]["weights"]
    for side, r in results.items():
        print(f"  {side:10s} {r['seconds']:8.3f} s   extra peak {r['extra_peak'] / 2**20:9.1f} MiB "
              f"({100 * r['extra_peak'] / weights:5.1f}% of weights)   file {r['file_size'] / 2**20:.1f} MiB"
              f"   (raw write of the weights alone: {r['io_floor']:.3f} s)")
    speedup = results["executorch"]["seconds"] / results["texir"]["seconds"]
    print(f"  speed-up texir vs ExecuTorch: {speedup:.1f}x (goal >= 3x); texir extra peak "
          f"{100 * results['texir']['extra_peak'] / weights:.1f}% of weights (goal <= 10%)")


def _deep_model(blocks: int) -> tuple[object, tuple[object, ...]]:
    import torch

    class Deep(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            for i in range(blocks):
                x = torch.sin(x * y + float(i % 7))
                x = torch.relu(x - y).view(-1).view(4, 4)
            return x

    return Deep(), (torch.randn(4, 4), torch.randn(4, 4))


def bench_deep(blocks: int) -> None:
    warnings.filterwarnings("ignore")
    import torch
    from executorch import exir

    sys.path.insert(0, ROOT)
    from texir.adapters import from_exported_program
    from texir.emit import emit
    from texir.serialize.pte import dumps

    model, args = _deep_model(blocks)
    ep = torch.export.export(model, args, strict=False)
    program = from_exported_program(ep, decompose=True)
    nodes = len(program.graph.nodes)
    start = time.perf_counter()
    data = dumps(emit(program))
    texir_s = time.perf_counter() - start
    edge = exir.to_edge(ep)
    start = time.perf_counter()
    et_data = edge.to_executorch().buffer
    et_s = time.perf_counter() - start
    print(f"(2) non-delegated program of {nodes} nodes: emit + serialize")
    print(f"  executorch {et_s:8.3f} s   ({len(et_data)} bytes)")
    print(f"  texir      {texir_s:8.3f} s   ({len(data)} bytes, {nodes / texir_s:,.0f} nodes/s)")
    print(f"  speed-up texir vs ExecuTorch: {et_s / texir_s:.1f}x (goal >= 20x)")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child-big":
        print(json.dumps(_child_big(sys.argv[2], int(sys.argv[3]), sys.argv[4])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    args = parser.parse_args()
    bench_big(16 if args.quick else 512)
    bench_deep(125 if args.quick else 720)


if __name__ == "__main__":
    main()
