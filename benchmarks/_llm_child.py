"""One side of bench_llm.py in its own process: build the Llama, export it, lower it to XNNPACK and
write `.pte` + `.ptd`, timing each stage and the peak RSS during it.

Sides: "executorch" (ExecuTorch 1.5.1's pipeline), "bridge" (texir through ExecuTorch's XNNPACK
backend) and "native" (texir's own partitioner and backend; executorch is not imported until the
runtime check after the measurements).
"""

from __future__ import annotations

import resource
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from _child import ROOT, STAGE, sha256_file, time_backend_preprocess  # benchmarks/ is on sys.path when a bench runs
from _memory import reset_peak, status

TAG = "_default_external_constant"
PROMPT = [1, 2, 3, 4]


def build(config: dict[str, Any], max_cache: int, dtype: str, quant: str) -> Any:
    """The exportable Llama: fp32 from tests.real_models, or (fp16) built on the meta device and
    materialised one block at a time, so the builder never holds a second copy of the weights."""
    if dtype == "fp32":
        from tests.real_models import static_cache_llama

        exportable = static_cache_llama(dict(max_position_embeddings=2048, **config), max_cache)
    else:
        exportable = _fp16_llama(config, max_cache)
    if quant == "8da4w":
        import torch
        from torchao.quantization import quantize_
        from torchao.quantization.granularity import PerGroup
        from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig

        quantize_(exportable.model,
                  Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32)))
    return exportable


def _fp16_llama(config: dict[str, Any], max_cache: int) -> Any:
    import torch
    import transformers
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from tests.real_models import ensure_torchvision_ops

    ensure_torchvision_ops()
    cfg = transformers.LlamaConfig(max_position_embeddings=2048, **config)
    cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg).to(torch.float16).eval()
    model.model.rotary_emb = LlamaRotaryEmbedding(config=cfg)  # computed buffers: built for real
    gen = torch.Generator().manual_seed(0)
    blocks = [model.model.embed_tokens, *model.model.layers, model.model.norm]
    if not cfg.tie_word_embeddings:
        blocks.append(model.lm_head)
    for block in blocks:  # one block at a time: each parameter is allocated once, filled in place
        block.to_empty(device="cpu")
        with torch.no_grad():
            for name, p in block.named_parameters():
                if "norm" in name:
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02, generator=gen)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"still on the meta device: {left[:5]}")
    model.generation_config.use_cache = True
    model.generation_config.cache_implementation = "static"
    return TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=max_cache).eval()


def export(exportable: Any, max_cache: int, module: Any = None, *, weightless: bool = False) -> Any:
    """torch's strict export of the Llama; `weightless`: through texir's `weightless` and
    `attach_weights` (traced on fake parameters, the real ones attached by reference)."""
    import torch

    from tests.real_models import export_static_cache_llama

    if weightless:
        from texir.adapters.weights import attach_weights
        from texir.adapters.weights import weightless as no_weights

        with no_weights(exportable) as weights:
            ep = export_static_cache_llama(exportable, PROMPT, max_cache)
        return attach_weights(ep, weights)
    if module is None:
        return export_static_cache_llama(exportable, PROMPT, max_cache)
    seq = torch.export.Dim("seq", min=1, max=max_cache - 1)  # ExecuTorch's re-export of the tagged module
    kwargs = {"input_ids": torch.tensor([PROMPT]), "cache_position": torch.arange(len(PROMPT))}
    shapes = {"input_ids": {1: seq}, "cache_position": {0: seq}}
    return torch.export.export(module, (), kwargs, dynamic_shapes=shapes, strict=True)


def weight_bytes(ep: Any) -> int:
    """Bytes of the exported program's parameters, buffers and constants (each storage once)."""
    import torch

    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    seen: dict[int, int] = {}

    def add(t: Any) -> None:
        if is_traceable_wrapper_subclass(t):  # torchao's quantized weights: their inner tensors
            for name in t.__tensor_flatten__()[0]:
                add(getattr(t, name))
        elif isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()

    for t in [*ep.state_dict.values(), *ep.constants.values()]:
        add(t)
    return sum(seen.values())


def lower_program(ep: Any, partitioners: list[Any]) -> Any:
    """texir's `lower`, the one call site: it returns a Program today and is becoming a `Lowered`
    with `.program`; both are taken."""
    from texir.orchestrate import lower

    result = lower(ep, partitioners, cache=None)
    report = getattr(result, "report", None)
    PHASES.clear()
    PHASES.update({p.name: p.seconds for p in getattr(report, "phases", ())})
    return getattr(result, "program", result)


PHASES: dict[str, float] = {}
"""The phases of the last `lower_program`'s report (wall seconds)."""


class Stages:
    """Seconds and the rise of peak RSS over `base` (the exported model in memory) per stage."""

    def __init__(self) -> None:
        self.base = status("VmRSS")
        self.seconds: dict[str, float] = {}
        self.peak: dict[str, int] = {}
        self.held: dict[str, int] = {}
        self._name = ""
        self._start = 0.0

    def __call__(self, name: str) -> "Stages":
        self._name = name
        return self

    def __enter__(self) -> None:
        print(f"{STAGE}{self._name}", file=sys.stderr, flush=True)
        reset_peak()
        self._start = time.perf_counter()

    def __exit__(self, *exc: Any) -> None:
        self.seconds[self._name] = time.perf_counter() - self._start
        self.peak[self._name] = status("VmHWM") - self.base
        self.held[self._name] = status("VmRSS") - self.base


def _executorch(ep: Any, exportable: Any, spec: dict[str, Any], out: Path, st: Stages) -> None:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes.external_constants_pass import delegate_external_constants_pass_unlifted

    with st("lower"):
        tagged = ep.module()
        delegate_external_constants_pass_unlifted(tagged, gen_tag_fn=lambda node: TAG)
        again = export(exportable, spec["max_cache"], tagged)
        manager = to_edge_transform_and_lower(
            again, partitioner=[XnnpackPartitioner()], constant_methods=spec["metadata"]
        ).to_executorch(ExecutorchBackendConfig(external_constants=True))
    with st("write"):
        with open(out / "model.pte", "wb") as fh:
            manager.write_to_file(fh)
        manager.write_tensor_data_to_file(str(out))


def _texir(ep: Any, spec: dict[str, Any], out: Path, st: Stages, native: bool, draft: Any = None) -> None:
    import contextlib

    from texir.adapters import constant_methods
    from texir.emit import EmitOptions, emit
    from texir.serialize import pte

    if native:
        from texir.backends import xnnpack

        registration: Any = xnnpack.registered()
        partitioners = [xnnpack.partitioner()]
    else:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        from texir.executorch import executorch_partitioner

        registration = contextlib.nullcontext()
        partitioners = [executorch_partitioner(XnnpackPartitioner())]
    with st("lower"), registration:
        program = lower_program(ep, partitioners)
    with st("emit"):
        emitted = emit(program, EmitOptions(external_constants=True, external_named_data=TAG),
                       constant_methods=constant_methods(spec["metadata"]))
    with st("write"):
        for data in emitted.external:
            pte.dump_ptd(data, out / f"{data.tag}.ptd", draft=draft if data.tag == TAG else None)
        pte.dump(emitted, out / "model.pte")
    del program, emitted


def _preprocess_timer(side: str) -> list[float]:
    if side == "native":
        from texir.backends.xnnpack.backend import XnnpackNativeBackend

        return time_backend_preprocess(XnnpackNativeBackend)
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    return time_backend_preprocess(XnnpackBackend)  # ExecuTorch's own, which the bridge also calls


def run(side: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Measure one side; `spec`: config, max_cache, dtype, quant, metadata, out, limit (bytes of
    address space, 0: none), logits (run one prefill in the runtime afterwards), weightless (export
    through texir's weightless adapter). Peaks: `extra_peak` over the exported model (lowering and
    writing), `export_peak` and `run_peak` (export included) over the built model."""
    if spec.get("limit"):
        resource.setrlimit(resource.RLIMIT_AS, (spec["limit"], spec["limit"]))
    warnings.filterwarnings("ignore")
    sys.path.insert(0, ROOT)
    from tests.real_models import ensure_torchvision_ops

    ensure_torchvision_ops()
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    inside = _preprocess_timer(side)
    print(f"{STAGE}build", file=sys.stderr, flush=True)
    start = time.perf_counter()
    exportable = build(spec["config"], spec["max_cache"], spec["dtype"], spec["quant"])
    built = time.perf_counter() - start
    model_rss = status("VmRSS")  # the built model in memory: what every peak below is over
    draft, predict_s = None, 0.0
    if side == "native" and spec.get("draft") and spec.get("weightless"):
        # texir's own time: the prediction, then the export while the draft writes the weights
        from texir.adapters.ptd_prediction import predicted_ptd
        from texir.serialize.pte import PtdDraft

        start = time.perf_counter()
        draft = PtdDraft(out / f"{TAG}.ptd", predicted_ptd(exportable.model))  # the module torch.export traces
        predict_s = time.perf_counter() - start
    print(f"{STAGE}export", file=sys.stderr, flush=True)
    reset_peak()
    start = time.perf_counter()
    ep = export(exportable, spec["max_cache"], weightless=spec.get("weightless", False))
    export_s = time.perf_counter() - start
    export_peak = status("VmHWM") - model_rss
    st = Stages()
    if draft is not None:
        st.seconds["predict"] = predict_s
    if side == "executorch":
        _executorch(ep, exportable, spec, out, st)
    else:
        try:
            _texir(ep, spec, out, st, native=side == "native", draft=draft)
        finally:
            if draft is not None:
                draft.close()
    files = sorted(p.name for p in out.iterdir() if p.suffix in (".pte", ".ptd"))
    result: dict[str, Any] = {
        "build": built, "export": export_s, "weights": weight_bytes(ep), "base_rss": st.base,
        "seconds": st.seconds, "peak": st.peak, "held": st.held, "preprocess": inside[0],
        "extra_peak": max(st.peak.values()), "peak_rss": max(st.base + max(st.peak.values()), model_rss + export_peak),
        "export_peak": export_peak, "run_peak": max(export_peak, st.base - model_rss + max(st.peak.values())),
        "weightless": bool(spec.get("weightless", False)), "phases": dict(PHASES),
        "draft": None if draft is None else {"used": draft.outcome.used, "kept": draft.outcome.kept,
                                             "rewritten": draft.outcome.rewritten, "why": draft.outcome.why,
                                             "waited": draft.outcome.waited},
        "sizes": {f: (out / f).stat().st_size for f in files},
        "digests": {f: sha256_file(out / f) for f in files},
        "executorch_imported_before_check": any(m.split(".")[0] == "executorch" for m in sys.modules),
    }
    if spec.get("logits"):
        del ep, exportable
        import torch
        from executorch.runtime import Runtime

        program = Runtime.get().load_program(out / "model.pte", data_path=str(out / f"{TAG}.ptd"))
        (logits,) = program.load_method("forward").execute([torch.tensor([PROMPT]), torch.arange(len(PROMPT))])
        torch.save(logits, out / "logits.pt")
    return result
