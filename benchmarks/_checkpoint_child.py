"""bench_llm.py --checkpoint in child processes: write a Llama-shaped fp16 checkpoint (random
weights, one safetensors shard per decoder block, never more than one block in memory), and lower
it natively from the checkpoint directory as `texir lower hf:DIR` does (weights memory-mapped),
timing each stage and watching anonymous memory (RssAnon) and total RSS."""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from _child import ROOT, STAGE, sha256_file  # benchmarks/ is on sys.path when a bench runs
from _memory import reset_peak, status

TAG = "_default_external_constant"


def _shard_of(name: str) -> str:
    """Parameters of decoder block i go to shard i+1, the rest (embedding, norm, output) to 0 / last."""
    parts = name.split(".")
    if parts[:2] == ["model", "layers"]:
        return f"{int(parts[2]) + 1:05d}"
    return "00000" if "embed_tokens" in name else "99999"


def write_checkpoint(spec: dict[str, Any]) -> dict[str, Any]:
    """Write the checkpoint directory `spec["out"]` for `spec["config"]` as save_pretrained lays it
    out (config.json, shards, model.safetensors.index.json). The model is built on the meta device
    for its parameter names and shapes; each shard's tensors are made, written and dropped in turn."""
    import torch
    import transformers
    from safetensors.torch import save_file

    from tests.real_models import ensure_torchvision_ops

    ensure_torchvision_ops()
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    cfg = transformers.LlamaConfig(max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, **spec["config"])
    cfg.dtype = torch.float16
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    shards: dict[str, list[tuple[str, torch.Size]]] = {}
    for name, p in model.named_parameters():  # tied parameters once, as save_pretrained writes them
        shards.setdefault(_shard_of(name), []).append((name, p.shape))
    names = sorted(shards)
    files = {key: f"model-{i + 1:05d}-of-{len(names):05d}.safetensors" for i, key in enumerate(names)}
    gen = torch.Generator().manual_seed(0)
    start, total = time.perf_counter(), 0
    weight_map: dict[str, str] = {}
    for key in names:
        tensors = {}
        for name, shape in shards[key]:
            t = torch.empty(shape, dtype=torch.float16)
            if "norm" in name:
                t.fill_(1.0)
            else:
                t.uniform_(-0.03, 0.03, generator=gen)
            tensors[name] = t
            weight_map[name] = files[key]
            total += t.nbytes
        save_file(tensors, str(out / files[key]), metadata={"format": "pt"})
        del tensors
    cfg.save_pretrained(out)
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2), encoding="utf-8")
    return {"seconds": time.perf_counter() - start, "bytes": total, "files": len(names)}


def lower_checkpoint(spec: dict[str, Any]) -> dict[str, Any]:
    """`texir lower hf:DIR --task text-generation` in stages (export, lower, emit, write), with
    RssAnon sampled every millisecond (its peak per stage and overall; past `spec["anon_limit"]`
    bytes the process ends) and total RSS peak (VmHWM, file-backed pages of the mapping included)."""
    warnings.filterwarnings("ignore")
    sys.path.insert(0, ROOT)
    from tests.checkpoint_memory import AnonPeak, rss_anon
    from tests.real_models import ensure_torchvision_ops

    ensure_torchvision_ops()
    import transformers.integrations.executorch  # noqa: F401  (imported before the clock starts, as the CLI has)

    from texir.adapters import constant_methods
    from texir.adapters.hf import export_text_generation
    from texir.backends import xnnpack
    from texir.emit import EmitOptions, emit
    from texir.orchestrate import lower
    from texir.serialize import pte

    directory, out = Path(spec["checkpoint"]), Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    base = rss_anon()
    reset_peak()
    seconds: dict[str, float] = {}
    anon: dict[str, int] = {}

    def stage(name: str, work: Any) -> Any:
        print(f"{STAGE}{name}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        with AnonPeak(limit=spec["anon_limit"]) as watch:
            result = work()
        seconds[name] = time.perf_counter() - start
        anon[name] = watch.peak - base
        return result

    ptd = out / f"{TAG}.ptd" if spec.get("draft", True) else None  # drafted during the export, as the CLI does
    model = stage("export", lambda: export_text_generation(directory, max_seq_len=spec["max_seq_len"], ptd=ptd))

    def lowering() -> Any:
        with xnnpack.registered():
            return lower(model.program, [xnnpack.partitioner()], cache=None)

    done = stage("lower", lowering)
    program = done.program
    emitted = stage("emit", lambda: emit(program, EmitOptions(external_constants=True, external_named_data=TAG,
                                                              emit_mutable_buffer_names=True),
                                         constant_methods=constant_methods(model.metadata)))

    def write() -> None:
        for data in emitted.external:
            pte.dump_ptd(data, out / f"{data.tag}.ptd", draft=model.draft if data.tag == TAG else None)
        pte.dump(emitted, out / "model.pte")

    try:
        stage("write", write)
    finally:
        if model.draft is not None:
            model.draft.close()
    outcome = model.draft.outcome if model.draft is not None else None
    files = sorted(p.name for p in out.iterdir() if p.suffix in (".pte", ".ptd"))
    return {"seconds": seconds, "phases": {p.name: p.seconds for p in done.report.phases}, "anon": anon, "anon_base": base, "total_peak": status("VmHWM"),
            "weights": sum(p.stat().st_size for p in directory.glob("*.safetensors")),
            "sizes": {f: (out / f).stat().st_size for f in files},
            "pte_sha256": sha256_file(out / "model.pte"),
            "draft": None if outcome is None else {"used": outcome.used, "kept": outcome.kept,
                                                   "rewritten": outcome.rewritten, "why": outcome.why,
                                                   "waited": outcome.waited}}
