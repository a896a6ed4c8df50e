"""The language-model path ExecuTorch users ship, through texir: a transformers Llama-architecture
decoder (tiny config, random weights) exported with its static KV cache as transformers supports
for ExecuTorch, lowered to XNNPACK, written as `.pte` + `.ptd` with constant methods, and run in the
ExecuTorch 1.5.1 runtime: a 4-token prefill then 8 decode steps, logits equal to eager and to
ExecuTorch's own program at every step, the cache living in the program's state between calls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.real_models import export_static_cache_llama, static_cache_llama
from texir.adapters import constant_methods
from texir.emit import DEFAULT_EXTERNAL_TAG, EmitOptions, emit_with_debug
from texir.serialize import pte
from texir.executorch.runtime import load_method

pytest.importorskip("executorch", reason="the executorch test extra (pip install -e '.[test]')")

MAX_CACHE = 16
VOCAB = 64
PROMPT = [3, 7, 11, 5]
DECODE_STEPS = 8
METADATA: dict[str, Any] = {
    "get_max_seq_len": MAX_CACHE, "get_vocab_size": VOCAB, "use_kv_cache": True, "get_bos_id": 1,
    "get_eos_ids": [2], "enable_dynamic_shape": True,
}


def _exportable() -> Any:
    return static_cache_llama(
        dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64),
        MAX_CACHE,
    )


def _export(exportable: Any) -> torch.export.ExportedProgram:
    return export_static_cache_llama(exportable, PROMPT, MAX_CACHE)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from texir.executorch import executorch_partitioner
    from texir.orchestrate import lower

    exportable = _exportable()
    program = lower(_export(exportable), [executorch_partitioner(XnnpackPartitioner())]).program
    emitted = emit_with_debug(
        program,
        EmitOptions(external_constants=True, external_named_data=DEFAULT_EXTERNAL_TAG, emit_mutable_buffer_names=True),
        constant_methods=constant_methods(METADATA),
    )
    out = tmp_path_factory.mktemp("llm")
    (data,) = emitted.program.external
    pte.dump_ptd(data, out / f"{data.tag}.ptd")
    pte.dump(emitted.program, out / "model.pte")
    theirs = to_edge_transform_and_lower(
        _export(exportable), partitioner=[XnnpackPartitioner()], constant_methods=METADATA,
    ).to_executorch()
    return {"pte": out / "model.pte", "ptd": out / f"{data.tag}.ptd", "theirs": bytes(theirs.buffer),
            "program": program, "emitted": emitted}


def _steps(eager: Any) -> list[tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]]:
    """(input_ids, cache_position) and eager logits: the prompt at once, then greedy decoding."""
    calls = []
    ids, pos = torch.tensor([PROMPT]), torch.arange(len(PROMPT))
    for step in range(1 + DECODE_STEPS):
        with torch.no_grad():
            logits = eager.model(input_ids=ids, cache_position=pos)
        calls.append(((ids, pos), logits))
        ids, pos = logits[:, -1:].argmax(-1), torch.tensor([len(PROMPT) + step])
    return calls


def test_prefill_and_decode_equal_eager_and_executorch_step_by_step(files: dict[str, Any]) -> None:
    from executorch.runtime import Runtime

    runtime = Runtime.get()
    ours = load_method(files["pte"], data_path=str(files["ptd"]))
    theirs = load_method(files["theirs"])
    calls = _steps(_exportable())
    assert len(calls) == 1 + DECODE_STEPS
    for step, (args, expected) in enumerate(calls):
        (got,) = ours.execute(list(args))
        (their,) = theirs.execute(list(args))
        assert got.shape == (1, args[0].shape[1], VOCAB), step
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5, msg=f"step {step} vs eager")
        torch.testing.assert_close(got, their, rtol=1e-5, atol=1e-6, msg=f"step {step} vs ExecuTorch")


def test_the_cache_is_state_that_survives_between_calls(files: dict[str, Any]) -> None:
    from executorch.runtime import Runtime

    calls = _steps(_exportable())
    (decode_args, expected) = calls[1]
    fresh = load_method(files["pte"], data_path=str(files["ptd"]))
    (cold,) = fresh.execute(list(decode_args))  # the first decode step without the prefill before it
    assert not torch.allclose(cold, expected, rtol=1e-3, atol=1e-4)
    (prefill_args, _) = calls[0]
    fresh.execute(list(prefill_args))
    (warm,) = fresh.execute(list(decode_args))
    torch.testing.assert_close(warm, expected, rtol=1e-4, atol=1e-5)


def test_constant_methods_answer_like_executorchs(files: dict[str, Any]) -> None:
    from executorch.runtime import Runtime

    ours = Runtime.get().load_program(files["pte"], data_path=str(files["ptd"]))
    theirs = Runtime.get().load_program(files["theirs"])
    assert set(METADATA) <= set(ours.method_names)
    for name, value in METADATA.items():
        got = ours.load_method(name).execute([])
        assert got == theirs.load_method(name).execute([]), name
        assert got == (value if isinstance(value, list) else [value]), name


def test_weights_live_in_the_ptd_and_the_cache_is_named_state(files: dict[str, Any]) -> None:
    from executorch.exir._serialize._program import deserialize_pte_binary

    data = pte.loads_ptd(Path(files["ptd"]).read_bytes())
    program = files["program"]
    named = {e.key for m in program.lowered_modules for e in m.module.named_data}
    assert named and named <= {e.key for e in data.entries}  # every XNNPACK weight is external
    assert Path(files["pte"]).stat().st_size < sum(e.data.nbytes for e in data.entries)
    plan = deserialize_pte_binary(Path(files["pte"]).read_bytes()).program.execution_plan[0]
    names = {v.val.extra_tensor_info.fully_qualified_name for v in plan.values
             if getattr(v.val, "extra_tensor_info", None) is not None and v.val.allocation_info is not None}
    assert {f"{kind}_cache_{i}" for kind in ("key", "value") for i in range(2)} <= names


def test_debug_maps_cover_every_delegate_call(files: dict[str, Any]) -> None:
    emitted = files["emitted"]
    handles, delegates = emitted.debug_handle_map()["forward"], emitted.delegate_map()["forward"]
    assert delegates and all(d["name"] == "XnnpackBackend" for d in delegates.values())
    assert all(isinstance(handles[i], list) and handles[i] for i in delegates)
    assert set(emitted.instruction_id_to_num_outs_map()["forward"]) == set(delegates)


def test_native_xnnpack_writes_the_same_llama_and_it_runs_bitwise_equal(files: dict[str, Any], tmp_path: Path) -> None:
    """texir's own XNNPACK (no ExecuTorch code at lowering) on the fp32 static-KV-cache Llama (issue
    #29): the partitions, blobs and named data of ExecuTorch's XnnpackPartitioner/XnnpackBackend (run
    by texir for `files`), the same .pte + .ptd, and the same logits bit for bit at every step."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from texir.backends.xnnpack import registered
    from texir.backends.xnnpack.partitioner import partitioner
    from texir.executorch import executorch_partitioner
    from texir.orchestrate import lower

    with registered():
        lowered = lower(_export(_exportable()), [partitioner()], cache=None)
    program = lowered.program
    # ExecuTorch's partitioner on the program texir's saw: the same tag on every node, tags in the same
    # order (its GroupBasedPartitioner's ids: the 24 partitions are tag0, tag1, tag5, tag17, ...).
    seen = lowered.edge
    ours, theirs = partitioner()(seen), executorch_partitioner(XnnpackPartitioner())(seen)
    assert dict(ours.tags) == dict(theirs.tags)
    assert [tag for tag, _ in ours.specs] == [tag for tag, _ in theirs.specs]

    def delegates(p: Any) -> list[tuple[str, bytes, list[tuple[str, bytes]]]]:
        return [(m.module.backend_id, bytes(m.module.processed_bytes),
                 sorted((e.key, e.data.tobytes() if e.data is not None else b"") for e in m.module.named_data))
                for m in p.lowered_modules]

    mine, reference = delegates(program), delegates(files["program"])
    assert len(mine) == len(reference) > 0
    for i, (a, b) in enumerate(zip(mine, reference)):
        assert a == b, f"delegate {i} ({a[0]}) differs from ExecuTorch's backend's"
    emitted = emit_with_debug(
        program,
        EmitOptions(external_constants=True, external_named_data=DEFAULT_EXTERNAL_TAG, emit_mutable_buffer_names=True),
        constant_methods=constant_methods(METADATA),
    )
    (data,) = emitted.program.external
    pte.dump_ptd(data, tmp_path / f"{data.tag}.ptd")
    pte.dump(emitted.program, tmp_path / "model.pte")
    assert (tmp_path / "model.pte").read_bytes() == Path(files["pte"]).read_bytes()
    assert (tmp_path / f"{data.tag}.ptd").read_bytes() == Path(files["ptd"]).read_bytes()
    native = load_method(tmp_path / "model.pte", data_path=str(tmp_path / f"{data.tag}.ptd"))
    bridge = load_method(files["pte"], data_path=str(files["ptd"]))
    for step, (args, _) in enumerate(_steps(_exportable())):
        (got,), (their,) = native.execute(list(args)), bridge.execute(list(args))
        assert torch.equal(got, their), f"step {step}: native and ExecuTorch-backend logits differ"


def test_8da4w_quantized_llama_equals_executorch_step_by_step() -> None:
    """torchao's 8da4w (int4 grouped weights as tensor subclasses, int8 dynamic activations), the
    quantization ExecuTorch's LLM recipes use, through texir's native XNNPACK: the same delegates,
    blobs, named data and kernels as ExecuTorch's own program, and the same logits bit for bit at
    every step. (texir through ExecuTorch's XNNPACK backend on 8da4w: tests/test_executorch_backends.py,
    q_mlp_8da4w.)"""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization import quantize_
    from torchao.quantization.granularity import PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig

    from tests.xnnpack_oracle import pte_view
    from texir.backends.xnnpack import registered
    from texir.backends.xnnpack.partitioner import partitioner
    from texir.emit import emit
    from texir.orchestrate import lower
    from texir.serialize.pte.codec import dumps

    exportable = _exportable()
    quantize_(exportable.model, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32)))
    with registered():  # texir's native XNNPACK partitioner and backend
        native = dumps(emit(lower(_export(exportable), [partitioner()], cache=None).program))
    theirs = bytes(to_edge_transform_and_lower(_export(exportable), partitioner=[XnnpackPartitioner()]).to_executorch().buffer)
    mine, reference = pte_view(native), pte_view(theirs)
    assert len(mine.delegates) == len(reference.delegates) > 0
    assert mine.delegates == reference.delegates and mine.named == reference.named
    assert mine.kernels == reference.kernels
    a, b = (load_method(data) for data in (native, theirs))
    for step, (args, expected) in enumerate(_steps(exportable)):
        (got,), (their,) = a.execute(list(args)), b.execute(list(args))
        assert torch.equal(got, their), f"step {step}: native vs ExecuTorch"
        torch.testing.assert_close(got, expected, rtol=0.05, atol=0.02, msg=f"step {step} vs eager (quantized)")
