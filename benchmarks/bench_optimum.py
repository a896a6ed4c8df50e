"""optimum-executorch's XNNPACK export on ExecuTorch and on texir (`texir.compat.install()`), side by
side in one run, each side in a fresh subprocess: a Llama of random weights saved as a checkpoint
directory, exported with `optimum.exporters.executorch.main_export(DIR, task="text-generation",
recipe="xnnpack", max_seq_len=...)` exactly as optimum's CLI runs it.

Reported per side: seconds of the whole `main_export` (load the checkpoint, torch.export, lower,
write `model.pte`) and of its torch.export (optimum's `CausalLMExportableModule.export`), peak RSS
(VmHWM) over the run and its rise over the process before the export; the ratio ExecuTorch / texir
beside the floor, what the export would cost if lowering were free: load + torch.export + writing
the file (the same bytes written again, measured in the texir child), and ExecuTorch / floor.
Whether the two `.pte` files are byte-equal is printed too (see docs/compat.md).

Run: .venv/bin/python benchmarks/bench_optimum.py [--config tiny|small|both] [--qlinear 8da4w]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _child import spawn, sha256_file  # benchmarks/ is on sys.path when a bench runs

CONFIGS: dict[str, dict[str, Any]] = {
    # the test's model (tests/test_compat_optimum.py)
    "tiny": dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=2, max_position_embeddings=64),
    # ~10M parameters, four layers: the lowering's share of the time shows
    "small": dict(vocab_size=32000, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256),
}
MAX_SEQ_LEN = {"tiny": 32, "small": 128}
SIDES = ("executorch", "texir")


def child(side: str, spec: dict[str, Any]) -> None:
    """One side: import, then main_export timed, with the torch.export inside it timed too."""
    from _memory import reset_peak, status

    if side == "texir":
        import texir.compat

        texir.compat.install()
    from optimum.exporters.executorch import main_export
    from optimum.exporters.executorch.integrations import CausalLMExportableModule

    exported = [0.0]
    original = CausalLMExportableModule.export

    def timed_export(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            exported[0] += time.perf_counter() - start

    CausalLMExportableModule.export = timed_export  # type: ignore[method-assign]  # benchmark instrumentation
    kwargs = {"qlinear": spec["qlinear"]} if spec["qlinear"] else {}
    rss_before = status("VmRSS")
    reset_peak()
    start = time.perf_counter()
    main_export(spec["model"], task="text-generation", recipe="xnnpack", output_dir=spec["out"],
                max_seq_len=spec["max_seq_len"], **kwargs)
    total = time.perf_counter() - start
    peak = status("VmHWM")
    pte = Path(spec["out"]) / "model.pte"
    data = pte.read_bytes()
    start = time.perf_counter()  # the floor's write: the same bytes to a new file
    with open(Path(spec["out"]) / "rewrite.pte", "wb") as fh:
        fh.write(data)
    write = time.perf_counter() - start
    os.unlink(Path(spec["out"]) / "rewrite.pte")
    print(json.dumps({"total": total, "export": exported[0], "write": write, "peak": peak,
                      "rise": peak - rss_before, "size": len(data), "sha256": sha256_file(pte)}))


def run(name: str, qlinear: str | None, workdir: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM
    import torch

    model_dir = workdir / f"{name}_model"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**CONFIGS[name])).save_pretrained(model_dir)
    load = _load_seconds(model_dir)
    results: dict[str, dict[str, Any]] = {}
    for side in SIDES:
        out = workdir / f"{name}_{side}"
        out.mkdir()
        spec = {"model": str(model_dir), "out": str(out), "max_seq_len": MAX_SEQ_LEN[name], "qlinear": qlinear}
        results[side] = spawn(__file__, ["--child", side, json.dumps(spec)], f"{name} {side}")
    et, tx = results["executorch"], results["texir"]
    floor = load + tx["export"] + tx["write"]
    params = sum(p.numel() for p in LlamaForCausalLM(LlamaConfig(**CONFIGS[name])).parameters())
    print(f"\n{name} ({params / 1e6:.1f}M parameters, max_seq_len {MAX_SEQ_LEN[name]}, {qlinear or 'fp32'}):")
    print(f"  {'side':<11}{'main_export s':>14}{'torch.export s':>15}{'peak RSS MiB':>14}{'rise MiB':>10}{'.pte KiB':>10}")
    for side in SIDES:
        r = results[side]
        print(f"  {side:<11}{r['total']:>14.2f}{r['export']:>15.2f}{r['peak'] / 2**20:>14.0f}"
              f"{r['rise'] / 2**20:>10.0f}{r['size'] / 1024:>10.1f}")
    print(f"  floor (load {load:.2f} s + torch.export {tx['export']:.2f} s + write {tx['write'] * 1000:.1f} ms): "
          f"{floor:.2f} s")
    print(f"  ExecuTorch / texir: {et['total'] / tx['total']:.2f}x time, {et['peak'] / tx['peak']:.2f}x peak RSS; "
          f"ExecuTorch / floor: {et['total'] / floor:.2f}x, texir / floor: {tx['total'] / floor:.2f}x")
    print(f"  .pte byte-equal: {et['sha256'] == tx['sha256']}")


def _load_seconds(model_dir: Path) -> float:
    """Seconds to load the checkpoint as optimum does (`from_pretrained`), in this process (warm)."""
    from transformers import AutoModelForCausalLM

    start = time.perf_counter()
    AutoModelForCausalLM.from_pretrained(model_dir)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=[*CONFIGS, "both"], default="both")
    parser.add_argument("--qlinear", choices=["8da4w"], default=None)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], json.loads(args.child[1]))
        return
    names = list(CONFIGS) if args.config == "both" else [args.config]
    with tempfile.TemporaryDirectory(prefix="bench_optimum_") as tmp:
        for name in names:
            run(name, args.qlinear, Path(tmp))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
