"""Checkpoints on disk (issues #41 and #42): `texir lower hf:DIR --task text-generation` on
transformers checkpoint directories written by the tests (save_pretrained, safetensors). The
weights are memory-mapped: the files equal lowering the same weights loaded into memory, the
process's anonymous memory stays far below the weights' size, and the program runs in ExecuTorch's
runtime with the transformers model's logits. With `--qlinear 8da4w|8da8w` and `--qembedding 4w|8w` it
runs with the logits of the same checkpoint quantized in eager as optimum-executorch quantizes it (and
with `--qembedding`, bitwise with those of optimum-executorch's own `.pte`)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.real_models import ensure_torchvision_ops
from texir.cli.main import main

pytest.importorskip("executorch", reason="the executorch test extra (pip install -e '.[test]')")

ROOT = Path(__file__).resolve().parent.parent
MAX_SEQ_LEN = 16
PROMPT = [3, 7, 11, 5]
TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)
# fp16, untied, in three shards: ~160 MiB of weights, most of it the embedding and the output projection
WIDE = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2048, num_hidden_layers=2, num_attention_heads=8,
            num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False, bos_token_id=1,
            eos_token_id=[2, 3])


def _save(directory: Path, config: dict[str, Any], dtype: torch.dtype, **save: Any) -> Path:
    ensure_torchvision_ops()
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).to(dtype).eval()
    model.save_pretrained(directory, **save)
    return directory


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save(tmp_path_factory.mktemp("tiny"), TINY, torch.float32)


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save(tmp_path_factory.mktemp("wide"), WIDE, torch.float16, max_shard_size="60MB")


def _lower(directory: Path, out: Path, *extra: str) -> int:
    return main(["lower", f"hf:{directory}", "--task", "text-generation", "--max-seq-len", str(MAX_SEQ_LEN),
                 "-o", str(out), *extra])


def _eager(directory: Path) -> Any:
    """transformers' own loading of the checkpoint (into memory), wrapped for export as the CLI does."""
    import transformers
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    model.generation_config.use_cache = True
    model.generation_config.cache_implementation = "static"
    model.config._attn_implementation = "sdpa"
    return TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=MAX_SEQ_LEN).eval()


@pytest.fixture(scope="module")
def lowered_tiny(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint lowered in float (no recipe): llama.pte + llama.ptd."""
    out = tmp_path_factory.mktemp("lowered") / "llama.pte"
    assert _lower(tiny, out) == 0
    return out


def test_runs_in_executorch_with_the_transformers_models_logits(tiny: Path, lowered_tiny: Path) -> None:
    from executorch.runtime import Runtime

    from texir.executorch.runtime import load_method

    tmp_path = lowered_tiny.parent
    method = load_method(tmp_path / "llama.pte", data_path=str(tmp_path / "llama.ptd"))
    eager = _eager(tiny)
    ids, pos = torch.tensor([PROMPT]), torch.arange(len(PROMPT))
    for step in range(4):  # the prompt, then greedy decoding through the cache
        with torch.no_grad():
            expected = eager.model(input_ids=ids, cache_position=pos)
        (got,) = method.execute([ids, pos])
        assert got.shape == (1, ids.shape[1], TINY["vocab_size"]), step
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5, msg=f"step {step}")
        ids, pos = expected[:, -1:].argmax(-1), torch.tensor([len(PROMPT) + step])
    program = Runtime.get().load_program(tmp_path / "llama.pte", data_path=str(tmp_path / "llama.ptd"))
    answers = {name: program.load_method(name).execute([]) for name in (
        "get_max_seq_len", "get_max_context_len", "get_vocab_size", "use_kv_cache", "enable_dynamic_shape",
        "get_bos_id", "get_eos_ids")}
    assert answers == {"get_max_seq_len": [MAX_SEQ_LEN], "get_max_context_len": [MAX_SEQ_LEN], "get_vocab_size": [64],
                       "use_kv_cache": [True], "enable_dynamic_shape": [True], "get_bos_id": [1], "get_eos_ids": [2]}


def _quantized(directory: Path, case: str) -> Any:
    """`_eager` with its linears quantized as the case's flags say, spelled here independently:
    optimum-executorch's `quantize_model_` for `--qlinear 8da4w|8da8w` (torchao's
    Int8DynamicActivationIntxWeightConfig with hqq_scale_only qparams; int4 weights in groups of 32, or
    int8 per output channel), ExecuTorch's TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT recipe (the same
    config, torchao's default qparams) for `--recipe xnnpack-8da4w`."""
    from torchao.quantization import quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig

    eager = _eager(directory)
    int4 = getattr(torch, "int4")
    config = {
        "8da4w": Int8DynamicActivationIntxWeightConfig(weight_dtype=int4, weight_granularity=PerGroup(32),
                                                       intx_choose_qparams_algorithm="hqq_scale_only"),
        "8da8w": Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0),
                                                       intx_choose_qparams_algorithm="hqq_scale_only"),
        "recipe": Int8DynamicActivationIntxWeightConfig(weight_dtype=int4, weight_granularity=PerGroup(32)),
    }[case]
    quantize_(eager, config, lambda m, fqn: isinstance(m, torch.nn.Linear))
    return eager


QUANTIZED = {"8da4w": ["--qlinear", "8da4w"], "8da8w": ["--qlinear", "8da8w"],
             "recipe": ["--recipe", "xnnpack-8da4w", "--group-size", "32"]}
QUANTIZED_TOLERANCE = {"8da4w": 0.02, "8da8w": 0.002, "recipe": 0.02}
"""The largest difference to the eager quantized model's logits, as a fraction of their largest
magnitude. Both sides compute the same integers: XNNPACK's int8 x int4/int8 dot products accumulate
exactly in int32 whatever the CPU's instruction set (AVX2, AVX-512, VNNI), and its dynamic activation
quantization picks torchao's scales; what differs is float arithmetic around them. For 8da8w that
is rounding order (measured: 2e-7 of the logits' magnitude, the budget is 10^4 times it). For 8da4w
ExecuTorch's XNNPACK stores the per-group weight scales as bfloat16 (XNNPACK's blockwise int4 takes
no other), each within 2^-9 of torchao's fp32 scale: measured 0.8% of the logits' magnitude on a
tiny Llama, the budget 2.5 times it and still 1/5 of what quantization itself changes (below)."""


Close = Callable[[torch.Tensor, torch.Tensor, int], None]
"""Asserts that the runtime's logits (first) are close to the eager quantized model's at a step."""


def _within_fraction(fraction: float) -> Close:
    def close(got: torch.Tensor, expected: torch.Tensor, step: int) -> None:
        error = float((got - expected).abs().max())
        assert error <= fraction * float(expected.abs().max()), (step, error)

    return close


def _within(rtol: float, atol: float) -> Close:
    def close(got: torch.Tensor, expected: torch.Tensor, step: int) -> None:
        torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, msg=f"step {step}")

    return close


def _decodes_like(method: Any, quantized: Any, unquantized: Any, close: Close) -> None:
    """A prefill of PROMPT, then three greedy decode steps through the KV cache: at each, the
    runtime's logits `close` to the eager `quantized` model's and far closer to them than to the
    float model's (`unquantized`), so what runs is the quantized model."""
    ids, pos = torch.tensor([PROMPT]), torch.arange(len(PROMPT))
    for step in range(4):
        with torch.no_grad():
            expected = quantized.model(input_ids=ids, cache_position=pos)
            floats = unquantized.model(input_ids=ids, cache_position=pos)
        (got,) = method.execute([ids, pos])
        assert got.shape == expected.shape == (1, ids.shape[1], TINY["vocab_size"]), step
        close(got, expected, step)
        assert float((got - expected).abs().max()) <= 0.2 * float((expected - floats).abs().max()), step
        ids, pos = expected[:, -1:].argmax(-1), torch.tensor([len(PROMPT) + step])


@pytest.mark.parametrize("case", list(QUANTIZED))
def test_qlinear_runs_in_executorch_with_the_quantized_models_logits(
    case: str, tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--qlinear (and ExecuTorch's 8da4w recipe) on hf:DIR: the program runs in ExecuTorch's runtime
    through a prefill and three decode steps with the logits of the eager model quantized the same
    way, far closer to them than to the float model's (so what runs is the quantized model). The CLI
    says the quantized weights are not memory-mapped."""
    from texir.executorch.runtime import load_method

    assert _lower(tiny, tmp_path / "q.pte", *QUANTIZED[case]) == 0
    err = capsys.readouterr().err
    assert "held in memory, not memory-mapped from the checkpoint" in err, err
    method = load_method(tmp_path / "q.pte", data_path=str(tmp_path / "q.ptd"))
    _decodes_like(method, _quantized(tiny, case), _eager(tiny), _within_fraction(QUANTIZED_TOLERANCE[case]))


QEMBEDDED = {"4w": ["--qembedding", "4w"], "8w-group-16": ["--qembedding", "8w", "--qembedding-group-size", "16"],
             "4w+8da4w": ["--qembedding", "4w", "--qlinear", "8da4w"]}
QEMBEDDED_KERNEL = {"4w": "quantized_decomposed::embedding_4bit.out", "8w-group-16": "quantized_decomposed::embedding_byte.out",
                    "4w+8da4w": "quantized_decomposed::embedding_4bit.out"}
QEMBEDDED_TOLERANCE = {"4w": (1e-4, 1e-5), "8w-group-16": (1e-4, 1e-5), "4w+8da4w": None}
"""(rtol, atol) against the eager quantized model, or None for QUANTIZED_TOLERANCE's 8da4w budget.
ExecuTorch's embedding kernels dequantize a row as torchao's `dequantize_affine` does, one fp32
multiply of the integer by its group's scale (optimum's hqq_scale_only qparams have zero points of
0), so the embedding's output is the same floats and what is left is the float model's rounding:
the float lowering's tolerance (test_runs_in_executorch_with_the_transformers_models_logits). With
--qlinear 8da4w, that flag's bf16 weight scales set the budget."""


def _embedding_quantized(directory: Path, case: str) -> Any:
    """`_eager` (`_quantized` with --qlinear 8da4w) with its embedding quantized as optimum-executorch's
    `quantize_model_` does for --qembedding: torchao's IntxWeightOnlyConfig, hqq_scale_only qparams,
    per row (PerAxis(0)) or in groups of columns."""
    from torchao.quantization import quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import IntxWeightOnlyConfig

    eager = _quantized(directory, "8da4w") if case.endswith("+8da4w") else _eager(directory)
    dtype = torch.int8 if case.startswith("8w") else getattr(torch, "int4")
    granularity = PerGroup(16) if case.endswith("group-16") else PerAxis(0)
    config = IntxWeightOnlyConfig(weight_dtype=dtype, granularity=granularity, intx_choose_qparams_algorithm="hqq_scale_only")
    quantize_(eager, config, lambda m, fqn: isinstance(m, torch.nn.Embedding))
    return eager


@pytest.fixture(scope="module")
def qembedded(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The tiny checkpoint lowered with a QEMBEDDED case's flags (each once per module): its `.pte`.
    The CLI says which ExecuTorch kernel the quant-fusion pass put in place of the embedding."""
    done: dict[str, Path] = {}

    def lowered(case: str) -> Path:
        if case not in done:
            out = tmp_path_factory.mktemp("qembedding") / "q.pte"
            with contextlib.redirect_stderr(io.StringIO()) as err:
                assert _lower(tiny, out, *QEMBEDDED[case]) == 0
            fused = QEMBEDDED_KERNEL[case].removesuffix(".out")
            assert (f"ExecuTorch's quant-fusion pass replaced torchao::dequantize_affine + aten::embedding with "
                    f"{fused}.default") in err.getvalue(), err.getvalue()
            done[case] = out
        return done[case]

    return lowered


@pytest.mark.parametrize("case", list(QEMBEDDED))
def test_qembedding_runs_in_executorch_with_the_quantized_models_logits(
    case: str, tiny: Path, qembedded: Callable[[str], Path]
) -> None:
    """--qembedding on hf:DIR: ExecuTorch's quant-fusion pass leaves its embedding kernel (no torchao
    op) in the `.pte`, which runs in ExecuTorch's runtime through a prefill and three decode steps
    with the logits of the eager model quantized the same way, far closer to them than to the float
    model's (so what runs is the quantized embedding)."""
    from texir.executorch.runtime import load_method
    from texir.serialize.pte.codec import loads

    pte = qembedded(case)
    plan = loads(pte.read_bytes()).program.execution_plan[0]
    kernels = {op.name + (f".{op.overload}" if op.overload else "") for op in plan.operators}
    assert QEMBEDDED_KERNEL[case] in kernels and not any(k.startswith("torchao::") for k in kernels), kernels
    method = load_method(pte, data_path=str(pte.with_suffix(".ptd")))
    tolerance = QEMBEDDED_TOLERANCE[case]
    close = _within_fraction(QUANTIZED_TOLERANCE["8da4w"]) if tolerance is None else _within(*tolerance)
    _decodes_like(method, _embedding_quantized(tiny, case), _eager(tiny), close)


def test_python_qembedding_writes_the_clis_file(tiny: Path, qembedded: Callable[[str], Path]) -> None:
    """The Python API gives `--qembedding 4w`'s files byte for byte: `texir.recipes.quantize_in_place`
    as the export's `prepare`, `texir.lower` with the native XNNPACK partitioner, then
    `texir.recipes.fuse_quantized_embeddings` (ExecuTorch's quant-fusion pass), emitted as the CLI
    emits a checkpoint (weights to the `.ptd`, ExecuTorch's LLM metadata methods)."""
    import functools

    import texir
    from texir.adapters import constant_methods
    from texir.adapters.hf import export_text_generation
    from texir.backends import xnnpack
    from texir.emit import DEFAULT_EXTERNAL_TAG, EmitOptions, emit
    from texir.recipes import Recipe, fuse_quantized_embeddings, quantize_in_place
    from texir.serialize import pte

    recipe = Recipe(name="xnnpack", qembedding="4w")
    model = export_text_generation(tiny, max_seq_len=MAX_SEQ_LEN, prepare=functools.partial(quantize_in_place, recipe=recipe))
    with xnnpack.registered():
        lowered = fuse_quantized_embeddings(texir.lower(model.program, [xnnpack.partitioner()], cache=None))
    options = EmitOptions(external_constants=True, external_named_data=DEFAULT_EXTERNAL_TAG, emit_mutable_buffer_names=True)
    program = emit(lowered.program, options, constant_methods=constant_methods(model.metadata))
    cli = qembedded("4w")
    assert pte.dumps(program) == cli.read_bytes()
    (data,) = program.external
    assert pte.dumps_ptd(data) == cli.with_suffix(".ptd").read_bytes()


@pytest.mark.slow  # optimum-executorch's export of the checkpoint: ~25 s on the shared 2-core machine
def test_qembedding_logits_equal_optimums_own(tiny: Path, qembedded: Callable[[str], Path], tmp_path: Path) -> None:
    """`--qembedding 4w --qlinear 8da4w` gives, through a prefill and three decode steps, the logits
    of optimum-executorch's own `.pte` for the same flags bit for bit: the same torchao
    quantization, XNNPACK delegates and ExecuTorch embedding kernel. (Its files differ: optimum keeps
    the weights in the `.pte`; texir's are in the `.ptd`.)"""
    from optimum.exporters.executorch import main_export

    from texir.executorch.runtime import load_method

    main_export(str(tiny), task="text-generation", recipe="xnnpack", output_dir=str(tmp_path), max_seq_len=MAX_SEQ_LEN,
                qembedding="4w", qlinear="8da4w")
    theirs = load_method((tmp_path / "model.pte").read_bytes())
    pte = qembedded("4w+8da4w")
    ours = load_method(pte, data_path=str(pte.with_suffix(".ptd")))
    ids, pos = torch.tensor([PROMPT]), torch.arange(len(PROMPT))
    for step in range(4):
        (want,), (got,) = theirs.execute([ids, pos]), ours.execute([ids, pos])
        assert got.shape == (1, ids.shape[1], TINY["vocab_size"]) and torch.equal(got, want), step
        ids, pos = got[:, -1:].argmax(-1), torch.tensor([len(PROMPT) + step])


def test_the_xnnpack_recipe_is_the_float_lowering(tiny: Path, lowered_tiny: Path, tmp_path: Path) -> None:
    """--recipe xnnpack (ExecuTorch's FP32 recipe) on hf:DIR quantizes nothing: the same files as no
    recipe, weights still memory-mapped."""
    assert _lower(tiny, tmp_path / "llama.pte", "--recipe", "xnnpack") == 0
    for suffix in (".pte", ".ptd"):
        assert (tmp_path / "llama.pte").with_suffix(suffix).read_bytes() == lowered_tiny.with_suffix(suffix).read_bytes()


RECIPE_MISTAKES = [
    (["--qlinear", "8da4bit"], "--qlinear '8da4bit': give one of 8da4w, 8da8w"),
    (["--qlinear", "8da4w", "--group-size", "64"],
     "--group-size 64 does not divide the 32 input features of linear 'model.layers.0.self_attn.q_proj'; "
     "sizes that do: 32; 0 quantizes per output channel, or --qlinear 8da4w,8da8w quantizes such linears per channel"),
    (["--qlinear", "8da4w", "--group-size", "48"], "--group-size 48: XNNPACK's int4 kernels take groups of a multiple of 32"),
    (["--qlinear", "8da4w", "--group-size", "32", "--qlinear-group-size", "32"], "drop one"),
    (["--qembedding", "2w"], "--qembedding '2w': give one of 4w, 8w"),
    (["--qembedding", "4w", "--qembedding-group-size", "12"],
     "--qembedding-group-size 12 does not divide the 32 columns of embedding 'model.embed_tokens'; "
     "sizes that do: 2, 4, 8, 16, 32; 0 quantizes per row"),
    (["--qembedding", "8w", "--qembedding-group-size", "7"], "--qembedding-group-size 7: give an even number"),
    (["--qembedding-group-size", "16"], "--qembedding-group-size goes with a quantization recipe: add --qembedding"),
    (["--recipe", "xnnpack-int8-dynamic"], "a checkpoint (hf:DIR) is quantized in place before its export: use --qlinear 8da8w"),
    (["--qlinear", "8da4w", "--calibration", "c.pt"], "--calibration: hf:DIR is quantized with torchao"),
]


@pytest.mark.parametrize("flags, expected", RECIPE_MISTAKES, ids=[" ".join(f) for f, _ in RECIPE_MISTAKES])
def test_a_bad_quantization_of_a_checkpoint_is_one_line_and_writes_nothing(
    flags: list[str], expected: str, tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _lower(tiny, tmp_path / "out.pte", *flags) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("texir lower: ")]
    assert len(lines) == 1 and lines[0].startswith("texir lower: error: ") and expected in lines[0], err
    assert not (tmp_path / "out.pte").exists() and not (tmp_path / "out.ptd").exists()


def _in_memory(directory: Path, out: Path) -> None:
    """What the CLI writes, from transformers' in-memory model and a plain (not weightless) export."""
    from texir.adapters import constant_methods
    from texir.adapters.hf import text_generation_metadata
    from texir.backends import xnnpack
    from texir.emit import DEFAULT_EXTERNAL_TAG, EmitOptions, emit
    from texir.orchestrate import lower
    from texir.serialize import pte

    exportable = _eager(directory)
    seq = torch.export.Dim("seq", min=1, max=MAX_SEQ_LEN - 1)
    ep = exportable.export(input_ids=torch.tensor([[1, 2, 3, 4]]), cache_position=torch.arange(4), strict=True,
                           dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}})
    with xnnpack.registered():
        lowered = lower(ep, [xnnpack.partitioner()], cache=None).program
    program = emit(lowered, EmitOptions(external_constants=True, external_named_data=DEFAULT_EXTERNAL_TAG,
                                        emit_mutable_buffer_names=True),
                   constant_methods=constant_methods(text_generation_metadata(exportable.model.model.config,
                                                                              MAX_SEQ_LEN)))
    (data,) = program.external
    pte.dump_ptd(data, out.with_suffix(".ptd"))
    pte.dump(program, out)


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads RssAnon from Linux's /proc")
def test_mapped_checkpoint_lowers_byte_equal_with_little_anonymous_memory(tiny: Path, wide: Path,
                                                                         tmp_path: Path) -> None:
    """In a fresh process (after a warm-up lowering), lowering the sharded fp16 checkpoint raises
    RssAnon by a fraction of its weights (a copy of the embedding alone would be 39%), and the files
    equal lowering transformers' in-memory model of the same checkpoint. The CLI's `.ptd` was
    drafted during the export (`PtdDraft`, issue 42): most of it kept, the rest (XNNPACK's
    partitions order some projections otherwise than the module) written after lowering."""
    assert len(list(wide.glob("*.safetensors"))) == 3 and (wide / "model.safetensors.index.json").is_file()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "tests.checkpoint_memory", str(tiny), str(wide), str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    memory = json.loads(done.stdout.strip().splitlines()[-1])
    assert memory["code"] == 0 and memory["weights"] > 150 * 2**20
    assert memory["peak"] - memory["before"] < 0.25 * memory["weights"], memory
    drafted = re.findall(r"the \.ptd was written during the export: ([\d,.]+) MiB of weights in place, ([\d,.]+) MiB",
                         done.stderr)
    assert len(drafted) == 2, done.stderr[-3000:]  # the warm-up's and the wide checkpoint's
    kept, rewritten = (float(x.replace(",", "")) for x in drafted[-1])
    assert kept > 0.75 * memory["weights"] / 2**20 and kept + rewritten < 1.01 * memory["weights"] / 2**20
    _in_memory(wide, tmp_path / "memory.pte")
    assert (tmp_path / "model.ptd").read_bytes() == (tmp_path / "memory.ptd").read_bytes()
    assert (tmp_path / "model.pte").read_bytes() == (tmp_path / "memory.pte").read_bytes()


def _config(directory: Path, fields: dict[str, Any] | None) -> Path:
    """A directory holding `fields` as its config.json (None: no config.json) and no weights."""
    directory.mkdir()
    if fields is not None:
        (directory / "config.json").write_text(json.dumps(fields), encoding="utf-8")
    return directory


@pytest.mark.parametrize("case, expected", [
    ("missing", "does not exist"),
    ("no_config", "no config.json"),
    ("gpt2", "model_type 'gpt2' is not supported for text-generation; supported: llama"),
    ("no_weights", "no safetensors weights"),
    ("too_long", "at most the model's max_position_embeddings, 64"),
])
def test_checkpoint_mistakes_are_one_line_errors(case: str, expected: str, tiny: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    if case in ("missing", "too_long"):
        directory = tmp_path / "nowhere" if case == "missing" else tiny
    else:
        fields = {"no_config": None, "gpt2": {"model_type": "gpt2"},
                  "no_weights": json.loads((tiny / "config.json").read_text())}[case]
        directory = _config(tmp_path / "d", fields)
    extra = ["--max-seq-len", "65"] if case == "too_long" else []
    assert _lower(directory, tmp_path / "out.pte", *extra) == 2
    err = capsys.readouterr().err
    assert "texir lower: error: " in err and expected in err, err
    assert not (tmp_path / "out.pte").exists() and not (tmp_path / "out.ptd").exists()


def test_checkpoint_options_need_a_checkpoint(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lower", "texir.models:conv_relu_tan", "--task", "text-generation"]) == 2
    assert "--task is for a checkpoint directory MODEL (hf:DIR)" in capsys.readouterr().err
    assert main(["lower", "hf:.", "--backend", "texir-reference", "--whole"]) == 2
    assert "--backend, --whole: not with hf:DIR" in capsys.readouterr().err


def test_deferred_digests_write_the_bytes_hashing_first_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #42: the digests of memory-mapped weights are computed by the `.ptd` writer as it
    copies them (one read of the checkpoint, not two), and the files equal hashing every weight
    first: two weights with equal bytes still share one payload, and two that differ only where
    the sample does not look are hashed at once and kept apart."""
    from safetensors.torch import load_file, save_file

    import texir.adapters.tensors as tensors
    from texir.ir import blob

    directory = _save(tmp_path / "ckpt", TINY, torch.float32)
    (path,) = directory.glob("*.safetensors")
    weights = load_file(path)
    weights["model.layers.1.mlp.up_proj.weight"] = weights["model.layers.0.mlp.up_proj.weight"].clone()
    near = weights["model.layers.0.mlp.gate_proj.weight"].clone()
    near.view(-1)[near.numel() // 4] += 1.0  # outside the first, middle and last 64 bytes
    weights["model.layers.1.mlp.gate_proj.weight"] = near
    save_file(weights, path, metadata={"format": "pt"})

    (tmp_path / "eager").mkdir()
    (tmp_path / "deferred").mkdir()
    monkeypatch.setattr(tensors, "_DEFER_BYTES", 1 << 62)
    assert _lower(directory, tmp_path / "eager" / "llama.pte") == 0
    monkeypatch.setattr(tensors, "_DEFER_BYTES", 1024)
    monkeypatch.setattr(tensors, "_SAMPLE", 64)
    stand_ins = len(tensors._STAND_INS)
    copies: list[int] = []
    chunks = blob.HashingCopy.chunks

    def counted(self: blob.HashingCopy, payload: blob.Blob) -> Any:
        if payload.deferred:
            copies.append(payload.nbytes)
        return chunks(self, payload)

    monkeypatch.setattr(blob.HashingCopy, "chunks", counted)
    assert _lower(directory, tmp_path / "deferred" / "llama.pte") == 0
    for name in ("llama.pte", "llama.ptd"):
        assert (tmp_path / "deferred" / name).read_bytes() == (tmp_path / "eager" / name).read_bytes(), name
    assert len(tensors._STAND_INS) - stand_ins >= 8 and len(copies) >= 8, (copies, tensors._STAND_INS)
    from texir.serialize import pte

    ptd = pte.loads_ptd((tmp_path / "deferred" / "llama.ptd").read_bytes())
    payloads = [bytes(e.data.view()) for e in ptd.entries]
    equal = weights["model.layers.0.mlp.up_proj.weight"].numpy().tobytes()
    assert payloads.count(equal) == 1 and near.numpy().tobytes() in payloads


def test_a_checkpoint_beyond_half_the_available_memory_is_not_drafted(tiny: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Drafting reads every weight during the export: a checkpoint the page cache cannot keep
    (more than half of MemAvailable) is written after lowering instead."""
    from texir.adapters import hf

    size = sum(p.stat().st_size for p in tiny.glob("*.safetensors"))
    meminfo = tmp_path / "meminfo"
    monkeypatch.setattr(hf, "_MEMINFO", str(meminfo))
    meminfo.write_text(f"MemTotal: 99 kB\nMemAvailable: {2 * size // 1024 - 1} kB\n", encoding="ascii")
    assert not hf._draft_fits(tiny)
    model = hf.export_text_generation(tiny, max_seq_len=MAX_SEQ_LEN, ptd=tmp_path / "m.ptd")
    assert model.draft is None and list(tmp_path.iterdir()) == [meminfo]
    meminfo.write_text(f"MemAvailable: {2 * size // 1024 + 2} kB\n", encoding="ascii")
    assert hf._draft_fits(tiny)


def test_a_draft_that_cannot_start_leaves_the_export_alone(tiny: Path, tmp_path: Path) -> None:
    """A `.ptd` destination the draft cannot write (its directory missing) is no export error: the
    program exports without a draft, and writing it later says what is wrong, as without one."""
    from texir.adapters.hf import export_text_generation

    model = export_text_generation(tiny, max_seq_len=MAX_SEQ_LEN, ptd=tmp_path / "missing" / "m.ptd")
    assert model.draft is None and model.program.graph_signature.parameters
