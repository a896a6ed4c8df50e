"""Benchmark the language-model path: a Llama-architecture decoder of about 1B parameters (random
weights, fp32, Llama-3.2-1B's shape) with a static KV cache, from export to `.pte` + `.ptd` with
XNNPACK: texir vs ExecuTorch 1.5.1, each side in a fresh subprocess, side by side in one run.

  * ExecuTorch: export -> tag the weights for the delegate's external data
    (delegate_external_constants_pass_unlifted on ep.module(), re-export, as ExecuTorch documents)
    -> to_edge_transform_and_lower(ep, [XnnpackPartitioner()], constant_methods=...)
    -> to_executorch(ExecutorchBackendConfig(external_constants=True)) -> write .pte and .ptd
  * texir: export -> lower(ep, [executorch_partitioner(XnnpackPartitioner())])
    -> emit(external_constants, external_named_data, constant_methods) -> write .ptd and .pte;
    then again with jobs=2 (XNNPACK's preprocess of the partitions in two worker processes)
Reported: seconds (export, then the rest), the rise of peak RSS over the exported model (the weights
are already in memory then) as a share of the weights' bytes, output sizes, ratios
ExecuTorch / texir, and whether both programs give the same logits for one decode step.

Run: .venv/bin/python benchmarks/bench_llm.py [--quick]   (--quick: a ~25M-parameter config)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from _child import ROOT, spawn, time_backend_preprocess  # benchmarks/ is on sys.path when a bench runs
from _memory import reset_peak, status

TAG = "_default_external_constant"
MAX_CACHE = 128
PROMPT = [1, 2, 3, 4]

CONFIGS: dict[str, dict[str, Any]] = {
    # Llama-3.2-1B's shape: 1.24B parameters (the embedding tied to the output projection)
    "1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True),
    "quick": dict(vocab_size=32000, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True),
}


def _exportable(size: str) -> Any:
    from tests.real_models import static_cache_llama

    return static_cache_llama(dict(max_position_embeddings=2048, **CONFIGS[size]), MAX_CACHE)


def _export(exportable: Any, module: Any = None) -> Any:
    import torch

    from tests.real_models import export_static_cache_llama

    if module is None:
        return export_static_cache_llama(exportable, PROMPT, MAX_CACHE)
    seq = torch.export.Dim("seq", min=1, max=MAX_CACHE - 1)  # ExecuTorch's re-export of the tagged module
    kwargs = {"input_ids": torch.tensor([PROMPT]), "cache_position": torch.arange(len(PROMPT))}
    shapes = {"input_ids": {1: seq}, "cache_position": {0: seq}}
    return torch.export.export(module, (), kwargs, dynamic_shapes=shapes, strict=True)


def _metadata(size: str) -> dict[str, Any]:
    return {"get_max_seq_len": MAX_CACHE, "get_vocab_size": CONFIGS[size]["vocab_size"], "use_kv_cache": True,
            "enable_dynamic_shape": True}


def _child(side: str, size: str, out: Path) -> dict[str, Any]:
    warnings.filterwarnings("ignore")
    sys.path.insert(0, ROOT)
    from tests.real_models import ensure_torchvision_ops

    ensure_torchvision_ops()
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    inside = time_backend_preprocess() if side != "executorch" else [0.0]
    exportable = _exportable(size)
    weights = sum(p.numel() * p.element_size() for p in exportable.parameters())
    start = time.perf_counter()
    ep = _export(exportable)
    result: dict[str, Any] = {"export": time.perf_counter() - start, "weights": weights}
    base = status("VmRSS")
    reset_peak()
    start = time.perf_counter()
    if side == "executorch":
        from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
        from executorch.exir.passes.external_constants_pass import delegate_external_constants_pass_unlifted

        tagged = ep.module()
        delegate_external_constants_pass_unlifted(tagged, gen_tag_fn=lambda node: TAG)
        ep = _export(exportable, tagged)
        manager = to_edge_transform_and_lower(
            ep, partitioner=[XnnpackPartitioner()], constant_methods=_metadata(size)
        ).to_executorch(ExecutorchBackendConfig(external_constants=True))
        with open(out / "model.pte", "wb") as fh:
            manager.write_to_file(fh)
        manager.write_tensor_data_to_file(str(out))
    else:
        from texir.adapters import constant_methods
        from texir.executorch import executorch_partitioner
        from texir.emit import EmitOptions, emit
        from texir.orchestrate import lower
        from texir.serialize import pte

        program = emit(
            lower(ep, [executorch_partitioner(XnnpackPartitioner())], cache=None,
                  jobs=2 if side == "texir-jobs2" else 1).program,
            EmitOptions(external_constants=True, external_named_data=TAG),
            constant_methods=constant_methods(_metadata(size)),
        )
        for data in program.external:
            pte.dump_ptd(data, out / f"{data.tag}.ptd")
        pte.dump(program, out / "model.pte")
    result["lower"] = time.perf_counter() - start
    result["backend"] = inside[0]
    result["extra_peak"] = status("VmHWM") - base
    result["pte"] = (out / "model.pte").stat().st_size
    result["ptd"] = sum(p.stat().st_size for p in out.glob("*.ptd"))
    del ep, exportable
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(out / "model.pte", data_path=str(out / f"{TAG}.ptd")).load_method("forward")
    (logits,) = method.execute([torch.tensor([[1, 2, 3, 4]]), torch.arange(4)])
    torch.save(logits, out / "logits.pt")
    return result


def _spawn(side: str, size: str, out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    return spawn(__file__, ["--child", side, size, str(out)], side)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", nargs=3, metavar=("SIDE", "SIZE", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        side, size, out = args.child
        print(json.dumps(_child(side, size, Path(out))))
        return 0
    size = "quick" if args.quick else "1b"
    with tempfile.TemporaryDirectory(prefix="bench_llm_") as tmp:
        et = _spawn("executorch", size, Path(tmp) / "executorch")
        tx = _spawn("texir", size, Path(tmp) / "texir")
        tx2 = _spawn("texir-jobs2", size, Path(tmp) / "texir-jobs2")
        import torch

        same = torch.equal(torch.load(Path(tmp) / "executorch" / "logits.pt"), torch.load(Path(tmp) / "texir" / "logits.pt"))
        same_bytes = all(
            (Path(tmp) / "texir" / f).read_bytes() == (Path(tmp) / "texir-jobs2" / f).read_bytes()
            for f in ("model.pte", f"{TAG}.ptd")
        )
    gib = 2**30
    print(f"Llama ({size}: {tx['weights'] / gib:.2f} GiB of fp32 weights), static KV cache {MAX_CACHE}, "
          "XNNPACK, .pte + .ptd; each side in a fresh process; ratio = ExecuTorch / texir")
    for label, r in (("ExecuTorch", et), ("texir", tx)):
        print(f"  {label:<10}  export {r['export']:7.1f} s  rest {r['lower']:7.1f} s  e2e {r['export'] + r['lower']:7.1f} s  "
              f"extra peak {r['extra_peak'] / gib:6.2f} GiB ({r['extra_peak'] / r['weights']:5.0%} of the weights)  "
              f".pte {r['pte'] / 2**20:7.2f} MiB  .ptd {r['ptd'] / gib:6.2f} GiB")
    et_e2e, tx_e2e = et["export"] + et["lower"], tx["export"] + tx["lower"]
    tx2_e2e = tx2["export"] + tx2["lower"]
    print(f"  texir jobs=2  rest {tx2['lower']:7.1f} s  e2e {tx2_e2e:7.1f} s  (partitions compiled in 2 worker "
          f"processes, whose memory the peak above leaves out); same bytes as serial: {same_bytes}")
    print(f"  ratio e2e {et_e2e / tx_e2e:5.1f}x (goal >= 3x)   after export {et['lower'] / tx['lower']:5.1f}x   "
          f"jobs=2 e2e {et_e2e / tx2_e2e:5.1f}x")
    floor = tx["export"] + tx["backend"]
    print(f"  of texir's rest, {tx['backend']:.1f} s is XNNPACK's own preprocess (both sides pay it); texir's own "
          f"work {tx['lower'] - tx['backend']:.1f} s; with none of it the ratio would be at most {et_e2e / floor:4.1f}x")
    print(f"  texir extra peak {tx['extra_peak'] / tx['weights']:5.0%} of the weights (goal <= 10%); "
          f"ExecuTorch {et['extra_peak'] / et['weights']:5.0%}")
    print(f"  same logits from both programs in the runtime: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
