"""optimum-executorch, a real client of `texir.compat`: its XNNPACK export of a small random Llama
(fp32 and `qlinear="8da4w"`) runs on texir after `texir.compat.install()`, and the `.pte` runs in
ExecuTorch's runtime with logits equal to those of optimum's own `.pte` (exported in the same session
without install()).

What holds between the two files (docs/compat.md, "optimum-executorch"): every XNNPACK delegate,
every named-data entry (the delegates' weights) and every constant buffer byte-equal, the same
kernels called, hence bitwise-equal logits; the same instructions in the same order and the same
memory plan; the files differ only in `requires_grad` on some values (the runtime does not read it).

Also here, small and fast: `EdgeCompileConfig(_skip_dim_order=True)` (which optimum's recipe sets)
and `ExecutorchBackendConfig(do_quant_fusion_and_const_prop=True)` (which it also sets) on texir give
ExecuTorch's file byte for byte."""

from __future__ import annotations

import io
import os
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import texir.compat
from texir.executorch.runtime import load_method
from texir.ir import CallFunction
from texir.serialize.pte.codec import loads
from texir.serialize.pte.schema import KernelCall, PteProgram

MAX_SEQ_LEN = 32
PROMPT = torch.tensor([[5, 17, 3, 99]], dtype=torch.long)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-layer Llama with random weights saved as a transformers checkpoint directory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=64,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("llama")
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def optimum_export(model_dir: Path, out: Path, **kwargs: object) -> bytes:
    """optimum-executorch's export, as its CLI and `from_pretrained` run it; the `.pte` bytes."""
    from optimum.exporters.executorch import main_export

    out.mkdir()
    main_export(str(model_dir), task="text-generation", recipe="xnnpack", output_dir=str(out),
                max_seq_len=MAX_SEQ_LEN, **kwargs)
    assert sorted(os.listdir(out)) == ["model.pte"]  # no .ptd: write_tensor_data_to_file writes none
    return (out / "model.pte").read_bytes()


@pytest.fixture(scope="module", params=["fp32", "8da4w"])
def exports(request: pytest.FixtureRequest, llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, bytes, bytes]]:
    """(variant, optimum's own .pte, optimum's .pte on texir) for one variant."""
    kwargs = {} if request.param == "fp32" else {"qlinear": request.param}
    root = tmp_path_factory.mktemp(f"optimum_{request.param}")
    plain = optimum_export(llama_dir, root / "executorch", **kwargs)
    calls = texir.compat.program.CALLS[0]
    with texir.compat.installed():
        on_texir = optimum_export(llama_dir, root / "texir", **kwargs)
    assert texir.compat.program.CALLS[0] > calls, "texir did not run: install() did not reach optimum's recipe"
    yield request.param, plain, on_texir


def logits(pte: bytes) -> list[torch.Tensor]:
    """A prefill of PROMPT, then one decode step, on a fresh load of `pte` (its KV cache starts empty)."""
    method = load_method(pte)
    n = PROMPT.shape[1]
    prefill = method.execute([PROMPT, torch.arange(n, dtype=torch.long)])[0]
    step = method.execute([torch.tensor([[7]], dtype=torch.long), torch.tensor([n], dtype=torch.long)])[0]
    return [prefill.clone(), step.clone()]


@pytest.mark.slow  # four optimum exports (the module's fixture): ~4 min on the shared 2-core machine
def test_logits_equal_optimums_own(exports: tuple[str, bytes, bytes]) -> None:
    _, plain, on_texir = exports
    want, got = logits(plain), logits(on_texir)
    assert [t.shape for t in got] == [torch.Size([1, PROMPT.shape[1], 128]), torch.Size([1, 1, 128])]
    assert all(torch.isfinite(t).all() for t in got)
    for w, g in zip(want, got):
        assert torch.equal(w, g)  # bitwise: the delegates and the kernels they feed are the same


def _kernels(pte: PteProgram, method: str) -> Counter[str]:
    """How often each kernel is called in `method`."""
    plan = next(p for p in pte.program.execution_plan if p.name == method)
    names = [op.name + (f".{op.overload}" if op.overload else "") for op in plan.operators]
    return Counter(
        names[i.instr_args.op_index] for chain in plan.chains for i in chain.instructions
        if isinstance(i.instr_args, KernelCall)
    )


@pytest.mark.slow
def test_delegates_and_data_byte_equal(exports: tuple[str, bytes, bytes]) -> None:
    variant, plain, on_texir = exports
    a, b = loads(plain), loads(on_texir)
    assert [p.name for p in a.program.execution_plan] == [p.name for p in b.program.execution_plan]
    forward_a, forward_b = a.program.execution_plan[0], b.program.execution_plan[0]
    assert forward_a.name == "forward" and len(forward_a.delegates) >= 10
    assert forward_a.delegates == forward_b.delegates  # backend, blob index, compile specs, in call order
    assert a.program.backend_delegate_data == b.program.backend_delegate_data  # every XNNPACK blob
    assert a.named_data == b.named_data  # the delegates' weights, keyed by sha256
    assert a.program.constant_buffer == b.program.constant_buffer  # incl. the folded constants
    assert _kernels(a, "forward") == _kernels(b, "forward")
    # optimum's constant methods (get_max_seq_len, use_kv_cache, ...): the same values
    assert a.program.execution_plan[1:] == b.program.execution_plan[1:]
    # The same instructions in the same order (legalize_graph's priority for scalar_tensor replayed)
    # and the same memory plan; what differs (docs/compat.md) is only `requires_grad` on some values.
    assert forward_a.chains == forward_b.chains
    assert [_grad_free(v) for v in forward_a.values] == [_grad_free(v) for v in forward_b.values]
    assert forward_a.values != forward_b.values, f"{variant}: the value tables are equal now: assert the files are"


def _grad_free(value: Any) -> Any:
    """`value` with a tensor's `requires_grad` cleared (the runtime does not read it)."""
    import msgspec

    from texir.serialize.pte.schema import Tensor

    if isinstance(value.val, Tensor):
        return msgspec.structs.replace(value, val=msgspec.structs.replace(value.val, requires_grad=False))
    return value


class CastAndClone(torch.nn.Module):
    """A memory-format clone XNNPACK takes (ExecuTorch's CloneConfig), a cast, an int32 + int64 add
    that RemoveMixedTypeOperators casts, and a constant subgraph (arange * 2) to fold."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = self.linear(x).transpose(1, 2).contiguous()
        return a.reshape(2, -1) * 2, y.to(torch.int32) + y + torch.arange(8) * 2


@pytest.fixture(scope="module")
def cast_and_clone() -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    example = (torch.randn(2, 3, 8), torch.randint(0, 4, (2, 3, 8)))
    return torch.export.export(CastAndClone(), example, strict=True)


def _lowered(ep: torch.export.ExportedProgram, skip_dim_order: bool, fold: bool) -> bytes:
    """ExecuTorch's script (XNNPACK), with optimum's two options as given."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower

    f = io.BytesIO()
    to_edge_transform_and_lower(
        ep, partitioner=[XnnpackPartitioner()], compile_config=EdgeCompileConfig(_skip_dim_order=skip_dim_order),
    ).to_executorch(ExecutorchBackendConfig(do_quant_fusion_and_const_prop=fold)).write_to_file(f)
    return f.getvalue()


@pytest.mark.parametrize(("skip_dim_order", "fold"), [(True, False), (False, True), (True, True)])
def test_optimums_options_give_executorchs_file(
    cast_and_clone: torch.export.ExportedProgram, skip_dim_order: bool, fold: bool
) -> None:
    want = _lowered(cast_and_clone, skip_dim_order, fold)
    with texir.compat.installed():
        got = _lowered(cast_and_clone, skip_dim_order, fold)
    assert got == want
    kernels = _kernels(loads(got), "forward")
    assert ("aten::_to_copy.out" in kernels) == skip_dim_order  # the mixed-dtype cast: ATen's, or
    assert ("dim_order_ops::_to_dim_order_copy.out" in kernels) != skip_dim_order  # the dim-order op
    assert ("aten::arange.start_out" in kernels) != fold  # folded into a constant


def test_skip_dim_order_is_a_lowering_option(cast_and_clone: torch.export.ExportedProgram) -> None:
    """`texir.lower(skip_dim_order=True)` leaves ExecuTorch's dim-order ops out of the to_edge form;
    the default keeps them."""
    def targets(skip: bool) -> set[str]:
        edge = texir.lower(cast_and_clone, [], skip_dim_order=skip).edge
        return {n.target for n in edge.graph.nodes if isinstance(n, CallFunction)}

    default, skipped = targets(False), targets(True)
    assert "dim_order_ops::_to_dim_order_copy.default" in default and "aten::_to_copy.default" not in default
    assert "aten::_to_copy.default" in skipped and "aten::clone.default" in skipped
    assert not any(t.startswith("dim_order_ops::") for t in skipped)


def test_install_reaches_names_imported_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A module that ran `from executorch.exir import to_edge_transform_and_lower` before install()
    (optimum's recipe module, once anything imported it) gets texir's entry point, and ExecuTorch's
    back after; one that imported the entry point while installed gets ExecuTorch's back too."""
    import types

    import executorch.exir

    original = executorch.exir.to_edge_transform_and_lower
    before = types.ModuleType("user_script_before")
    before.to_edge_transform_and_lower = original  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, before.__name__, before)
    with texir.compat.installed():
        assert before.to_edge_transform_and_lower.__texir_facade__ is texir.compat.to_edge_transform_and_lower
        during = types.ModuleType("user_script_during")
        during.to_edge_transform_and_lower = executorch.exir.to_edge_transform_and_lower  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, during.__name__, during)
    assert before.to_edge_transform_and_lower is original
    assert during.to_edge_transform_and_lower is original
