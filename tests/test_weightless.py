"""Weightless export (`texir.adapters.weightless`, in `texir/adapters/weights.py`): torch traces fake parameters and the real ones
are attached by reference afterwards. The program is the one a plain export gives (same IR, same
`.pte` bytes), nothing is copied, the module gets its parameters back, and misuse is a typed error."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.real_models import export_static_cache_llama, static_cache_llama
from texir.adapters import from_exported_program
from texir.adapters.weights import attach_weights, weightless
from texir.backends.xnnpack import partitioner, registered
from texir.emit import emit
from texir.errors import ConversionError, UnsupportedError
from texir.orchestrate import lower
from texir.serialize import snapshot
from texir.serialize.pte.codec import dumps

PROMPT = [3, 7, 11, 5]
MAX_CACHE = 16


class Tied(torch.nn.Module):
    """A tied embedding/output projection, a buffer and a second linear."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(32, 8)
        self.mid = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 32, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.full((8,), 0.5))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.mid(self.embed(ids))) * self.scale)


def _export(model: torch.nn.Module) -> torch.export.ExportedProgram:
    return torch.export.export(model, (torch.tensor([[1, 2, 3]]),), strict=True)


def _llama() -> Any:
    return static_cache_llama(
        dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64),
        MAX_CACHE,
    )


def _pte(ep: torch.export.ExportedProgram) -> bytes:
    with registered():
        return dumps(emit(lower(ep, [partitioner()], cache=None).program))


@pytest.fixture(scope="module")
def tied() -> tuple[Tied, torch.export.ExportedProgram, torch.export.ExportedProgram]:
    torch.manual_seed(0)
    model = Tied().eval()
    plain = _export(model)
    with weightless(model) as weights:
        traced = _export(model)
    return model, plain, attach_weights(traced, weights)


def test_the_program_is_the_plain_exports(tied: tuple[Tied, Any, Any]) -> None:
    _, plain, attached = tied
    assert snapshot.dumps(from_exported_program(plain)) == snapshot.dumps(from_exported_program(attached))
    assert _pte(plain) == _pte(attached)
    args = (torch.tensor([[4, 5, 6]]),)
    assert torch.equal(plain.module()(*args), attached.module()(*args))


def test_weights_are_the_modules_own_and_restored(tied: tuple[Tied, Any, Any]) -> None:
    model, _, attached = tied
    params = dict(model.named_parameters(remove_duplicate=False))
    assert not any(isinstance(p, torch._subclasses.fake_tensor.FakeTensor) for p in params.values())
    assert model.head.weight is model.embed.weight  # still tied after the block
    for name, tensor in attached.state_dict.items():
        if name in params:
            assert tensor is params[name], name  # by reference: no copy
    assert attached.state_dict["scale"] is model.scale  # buffers are traced for real


def test_parameters_come_back_when_the_export_fails() -> None:
    model = Tied()
    before = dict(model.named_parameters())
    with pytest.raises(RuntimeError, match="boom"), weightless(model):
        assert isinstance(model.mid.weight, torch._subclasses.fake_tensor.FakeTensor)
        raise RuntimeError("boom")
    assert dict(model.named_parameters()) == before


def test_static_cache_llama_pte_is_byte_equal() -> None:
    """The transformers static-KV-cache Llama, exported strict with its cache buffers, as the LLM
    benchmark exports it."""
    exportable = _llama()
    plain = export_static_cache_llama(exportable, PROMPT, MAX_CACHE)
    with weightless(exportable) as weights:
        traced = export_static_cache_llama(exportable, PROMPT, MAX_CACHE)
    assert _pte(plain) == _pte(attach_weights(traced, weights))


def test_unattached_program_names_the_fix() -> None:
    model = Tied()
    with weightless(model):
        traced = _export(model)
    with pytest.raises(UnsupportedError, match="attach_weights"):
        from_exported_program(traced)


def test_weights_of_another_block() -> None:
    a, b = Tied(), Tied()
    with weightless(a):
        traced = _export(a)
    with weightless(b) as other:
        pass
    with pytest.raises(ConversionError, match=r"state_dict entry 'embed.weight'.*do not hold"):
        attach_weights(traced, other)


def test_a_parameter_changed_after_export() -> None:
    model = Tied()
    with weightless(model) as weights:
        traced = _export(model)
    model.mid.weight.data = torch.zeros(3, 3)  # the model changed after its export
    with pytest.raises(ConversionError, match=r"state_dict entry 'mid.weight'.*export again"):
        attach_weights(traced, weights)


def test_tensor_subclass_parameter_is_refused() -> None:
    # torchao takes seconds to import: only this test pays
    from torchao.quantization import quantize_
    from torchao.quantization.granularity import PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig

    model = torch.nn.Sequential(torch.nn.Linear(64, 32))
    quantize_(model, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32)))
    with pytest.raises(ConversionError, match=r"parameter '0.weight'.*tensor-subclass"), weightless(model):
        pass
    assert type(model[0].weight.data) is not torch.Tensor  # left as it was
