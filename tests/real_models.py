"""Real models for the XNNPACK oracle: torchvision and transformers architectures built from small
configs with seeded random weights (nothing is downloaded), pt2e int8 models quantized with
ExecuTorch's XNNPACKQuantizer (static and dynamic), and torchao's 8da4w (tensor-subclass weights).
Each builder returns an eval-mode module and example positional args."""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = [
    "REAL_MODELS", "QUANTIZED", "QUANTIZED_NATIVE", "RealModel", "ensure_torchvision_ops", "pattern_graphs_reused",
    "real_model",
]


def ensure_torchvision_ops() -> None:
    """torchvision importable beside the CPU torch (texir.adapters.torch_patches, which the CLI's
    model loading calls too)."""
    from texir.adapters.torch_patches import make_torchvision_importable

    make_torchvision_importable()


@dataclass(frozen=True)
class RealModel:
    name: str
    build: Callable[[], tuple[nn.Module, tuple[Any, ...]]]
    family: str
    """"torchvision", "transformers", "block" (a hand-written module), "pt2e" or "torchao"."""


def _seeded(make: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return make().eval()


def _image(size: int = 64) -> tuple[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return (torch.rand(1, 3, size, size, generator=g),)


def _tokens(vocab: int = 100, length: int = 8) -> tuple[torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    return (torch.randint(0, vocab, (1, length), generator=g),)


# ------------------------------------------------------------------------------------------------
# torchvision (1x3x64x64 images; the classifier heads keep their 1000 classes unless noted)


def _tv(name: str, size: int = 64, **kw: Any) -> Callable[[], tuple[nn.Module, tuple[Any, ...]]]:
    def build() -> tuple[nn.Module, tuple[Any, ...]]:
        ensure_torchvision_ops()
        import torchvision.models as tvm

        return _seeded(lambda: getattr(tvm, name)(weights=None, **kw)), _image(size)

    return build


def _vit() -> tuple[nn.Module, tuple[Any, ...]]:
    ensure_torchvision_ops()
    from torchvision.models.vision_transformer import VisionTransformer

    return _seeded(lambda: VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                             hidden_dim=32, mlp_dim=64, num_classes=10)), _image(32)


def _convnext() -> tuple[nn.Module, tuple[Any, ...]]:
    ensure_torchvision_ops()
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    blocks = [CNBlockConfig(16, 32, 1), CNBlockConfig(32, 64, 1), CNBlockConfig(64, None, 1)]
    return _seeded(lambda: ConvNeXt(blocks, num_classes=10)), _image()


def _resnet_basic() -> tuple[nn.Module, tuple[Any, ...]]:
    """torchvision's ResNet with one BasicBlock per stage (resnet18's blocks, a quarter of its depth)."""
    ensure_torchvision_ops()
    from torchvision.models.resnet import BasicBlock, ResNet

    return _seeded(lambda: ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10)), _image(32)


def _mobilenet_v3_blocks() -> tuple[nn.Module, tuple[Any, ...]]:
    """torchvision's MobileNetV3 with three of mobilenet_v3_small's bottlenecks: ReLU with
    squeeze-excitation, a residual one, hardswish with squeeze-excitation."""
    ensure_torchvision_ops()
    from torchvision.models.mobilenetv3 import InvertedResidualConfig, MobileNetV3

    blocks = [InvertedResidualConfig(16, 3, 16, 16, True, "RE", 2, 1, 1.0),
              InvertedResidualConfig(16, 3, 48, 16, False, "RE", 1, 1, 1.0),
              InvertedResidualConfig(16, 5, 64, 24, True, "HS", 2, 1, 1.0)]
    return _seeded(lambda: MobileNetV3(blocks, last_channel=64, num_classes=10)), _image(32)


def _lraspp() -> tuple[nn.Module, tuple[Any, ...]]:
    """torchvision's LR-ASPP built as a user builds it (`lraspp_mobilenet_v3_large`, random weights):
    its `forward(self, input)` names the input like the builtin (issue 38)."""
    ensure_torchvision_ops()
    from torchvision.models.segmentation import lraspp_mobilenet_v3_large

    return _seeded(lambda: lraspp_mobilenet_v3_large(weights=None, weights_backbone=None)), _image(64)


class _AttentionBlock(nn.Module):
    """Multi-head self-attention written out by hand, heads merged back with `reshape(b, t, -1)`
    after a transpose (a `view` of a non-contiguous value, so reshape copies first)."""

    def __init__(self, dim: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in self.qkv(x).chunk(3, -1))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.proj(a.transpose(1, 2).reshape(b, t, -1))  # type: ignore[no-any-return]


def _attention_block() -> tuple[nn.Module, tuple[Any, ...]]:
    return _seeded(_AttentionBlock), (torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(4)),)


# ------------------------------------------------------------------------------------------------
# transformers (tiny configs; eager attention unless noted; the wrapper returns the main tensor output)


class _Output(nn.Module):
    """Calls a transformers model with one tensor under `input` (plus fixed keyword arguments) and
    returns one field of its output."""

    def __init__(self, model: nn.Module, field: str, input: str, call: dict[str, Any]) -> None:
        super().__init__()
        self.model, self.field, self.input, self.call = model, field, input, call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(**{self.input: x}, **self.call)
        return getattr(out, self.field)  # type: ignore[no-any-return]


def _hf(config_cls: str, model_cls: str, field: str, *, input: str = "input_ids",
        call: dict[str, Any] | None = None, attention: str = "eager", encoder: bool = False,
        **config: Any) -> Callable[[], tuple[nn.Module, tuple[Any, ...]]]:
    def build() -> tuple[nn.Module, tuple[Any, ...]]:
        ensure_torchvision_ops()
        import transformers

        cfg = getattr(transformers, config_cls)(**config)
        cfg._attn_implementation = attention

        def make() -> nn.Module:
            model: nn.Module = getattr(transformers, model_cls)(cfg)
            return model.get_encoder() if encoder else model  # type: ignore[operator]  # transformers' PreTrainedModel

        model = _seeded(make)
        wrapped = _Output(model, field, input, dict(call or {})).eval()
        if input == "pixel_values":
            args: tuple[torch.Tensor, ...] = _image(32)
        elif input == "input_features":  # log-mel frames: twice the encoder's positions
            args = (torch.randn(1, cfg.num_mel_bins, 2 * cfg.max_source_positions, generator=torch.Generator().manual_seed(5)),)
        else:
            args = _tokens()
        return wrapped, args

    return build


_TINY = dict(vocab_size=100)

REAL_MODELS: tuple[RealModel, ...] = (
    RealModel("resnet18", _tv("resnet18"), "torchvision"),
    RealModel("mobilenet_v2", _tv("mobilenet_v2"), "torchvision"),
    RealModel("mobilenet_v3_small", _tv("mobilenet_v3_small"), "torchvision"),
    RealModel("efficientnet_b0", _tv("efficientnet_b0"), "torchvision"),
    RealModel("squeezenet1_1", _tv("squeezenet1_1"), "torchvision"),
    RealModel("shufflenet_v2_x0_5", _tv("shufflenet_v2_x0_5"), "torchvision"),
    RealModel("mnasnet0_5", _tv("mnasnet0_5"), "torchvision"),
    RealModel("vit_tiny", _vit, "torchvision"),
    RealModel("convnext_tiny_config", _convnext, "torchvision"),
    RealModel("lraspp_mobilenet_v3_large", _lraspp, "torchvision"),
    RealModel("gpt2", _hf("GPT2Config", "GPT2LMHeadModel", "logits", call={"use_cache": False},
                          n_layer=2, n_embd=32, n_head=2, n_positions=32, **_TINY), "transformers"),
    RealModel("llama", _hf("LlamaConfig", "LlamaForCausalLM", "logits", call={"use_cache": False},
                           hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, max_position_embeddings=32, **_TINY), "transformers"),
    RealModel("bert", _hf("BertConfig", "BertModel", "last_hidden_state", hidden_size=32, num_hidden_layers=2,
                          num_attention_heads=2, intermediate_size=64, max_position_embeddings=32, **_TINY),
              "transformers"),
    RealModel("distilbert", _hf("DistilBertConfig", "DistilBertModel", "last_hidden_state", dim=32, n_layers=2,
                                n_heads=2, hidden_dim=64, max_position_embeddings=32, **_TINY), "transformers"),
    RealModel("hf_vit", _hf("ViTConfig", "ViTModel", "last_hidden_state", input="pixel_values", image_size=32,
                            patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64), "transformers"),
    # Phi-3's partial rotary embedding concatenates an empty slice; its rotary runs in a no-grad region
    RealModel("phi3", _hf("Phi3Config", "Phi3ForCausalLM", "logits", call={"use_cache": False}, hidden_size=32,
                          intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=32, pad_token_id=0, **_TINY), "transformers"),
    # With sdpa, `contiguous` after the attention's transpose is a copy only before decomposition
    RealModel("whisper_encoder", _hf("WhisperConfig", "WhisperModel", "last_hidden_state", input="input_features",
                                     attention="sdpa", encoder=True, d_model=32, encoder_layers=1,
                                     encoder_attention_heads=2, encoder_ffn_dim=64, decoder_layers=1,
                                     decoder_attention_heads=2, decoder_ffn_dim=64, num_mel_bins=16,
                                     max_source_positions=16, max_target_positions=16, pad_token_id=0,
                                     bos_token_id=1, eos_token_id=2, decoder_start_token_id=3, **_TINY),
              "transformers"),
    RealModel("attention_block", _attention_block, "block"),
)


# ------------------------------------------------------------------------------------------------
# pt2e int8: XNNPACKQuantizer (symmetric, per-channel weights), calibrated on the example input


_PATTERNS: dict[Any, Any] = {}


@contextlib.contextmanager
def pattern_graphs_reused() -> Iterator[None]:
    """XNNPACKQuantizer strict-exports its conv-bn pattern graphs again on every prepare_pt2e (12
    exports, most of a small model's quantization time). A graph depends only on the pattern (its
    function and closure values) and the example inputs' shapes, so the process reuses it."""
    from executorch.backends.xnnpack.quantizer import xnnpack_quantizer_utils as utils  # executorch: on use

    original = utils._get_aten_graph_module_for_pattern

    def reused(pattern: Any, example_inputs: tuple[Any, ...], is_cuda: bool = False, **kwargs: Any) -> Any:
        fn = getattr(pattern, "fn", None)
        if fn is None or kwargs:
            return original(pattern, example_inputs, is_cuda, **kwargs)
        key = (fn.__code__, tuple(c.cell_contents for c in fn.__closure__ or ()),
               tuple(tuple(x.shape) for x in example_inputs), is_cuda)
        if key not in _PATTERNS:
            _PATTERNS[key] = original(pattern, example_inputs, is_cuda)
        return copy.deepcopy(_PATTERNS[key])  # the matcher edits the pattern's output node

    utils._get_aten_graph_module_for_pattern = reused
    try:
        yield
    finally:
        utils._get_aten_graph_module_for_pattern = original


def _quantized(
    make: Callable[[], tuple[nn.Module, tuple[Any, ...]]], *, dynamic: bool = False
) -> Callable[[], tuple[nn.Module, tuple[Any, ...]]]:
    def build() -> tuple[nn.Module, tuple[Any, ...]]:
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        module, args = make()
        quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=dynamic))
        captured = torch.export.export(module, args, strict=False).module()
        with pattern_graphs_reused():
            prepared = prepare_pt2e(captured, quantizer)  # type: ignore[arg-type]  # a GraphModule from export
        prepared(*args)
        return convert_pt2e(prepared), args

    return build


def _int8_dynamic_int4_weights() -> tuple[nn.Module, tuple[Any, ...]]:
    """torchao's 8da4w, the quantization ExecuTorch's LLM recipes use: int4 weights in groups of 32
    held as tensor-subclass parameters (IntxUnpackedToInt8Tensor), int8 dynamic activations."""
    from torchao.quantization import quantize_
    from torchao.quantization.granularity import PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig

    module = _seeded(lambda: nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32)))
    quantize_(module, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32)))
    return module, (torch.randn(2, 64, generator=torch.Generator().manual_seed(3)),)


def _zoo(name: str) -> Callable[[], tuple[nn.Module, tuple[Any, ...]]]:
    def build() -> tuple[nn.Module, tuple[Any, ...]]:
        from tests.zoo import zoo_model

        return zoo_model(name).build()

    return build


QUANTIZED: tuple[RealModel, ...] = (
    RealModel("q_mlp", _quantized(_zoo("mlp")), "pt2e"),
    RealModel("q_convnet", _quantized(_zoo("convnet")), "pt2e"),
    RealModel("q_resnet_tiny", _quantized(_zoo("resnet_tiny")), "pt2e"),
    RealModel("q_mobilenet_v2", _quantized(_tv("mobilenet_v2")), "pt2e"),
    RealModel("q_mlp_dynamic", _quantized(_zoo("mlp"), dynamic=True), "pt2e"),
    RealModel("q_mlp_8da4w", _int8_dynamic_int4_weights, "torchao"),
)


QUANTIZED_NATIVE: tuple[RealModel, ...] = (
    RealModel("q_squeezenet1_1", _quantized(_tv("squeezenet1_1", 32, num_classes=10)), "pt2e"),
    RealModel("q_mobilenet_v3_blocks", _quantized(_mobilenet_v3_blocks), "pt2e"),
    RealModel("q_resnet_basic", _quantized(_resnet_basic), "pt2e"),
)
"""torchvision architectures quantized with XNNPACK's quantizer on 32x32 images (concatenation and
ceil-mode max pools; hardswish and squeeze-excitation; residual add-relu and strided shortcuts),
compared native vs ExecuTorch only (tests/xnnpack_conformance.py's NATIVE_ONLY)."""


def real_model(name: str) -> RealModel:
    for m in (*REAL_MODELS, *QUANTIZED, *QUANTIZED_NATIVE):
        if m.name == name:
            return m
    raise KeyError(name)


@functools.lru_cache(maxsize=None)
def real_export(name: str) -> tuple[torch.export.ExportedProgram, tuple[Any, ...]]:
    """The model exported (not decomposed), with its example args. Callers must not mutate it."""
    module, args = real_model(name).build()
    return torch.export.export(module, args, strict=False), args


def zoo_or_real_export(name: str) -> torch.export.ExportedProgram:
    """A zoo model's shared export (`tests.zoo.cached_export`), else a real model's (not decomposed)."""
    from tests.zoo import ZOO, cached_export

    if any(m.name == name for m in ZOO):
        return cached_export(name, decompose=False)
    ensure_torchvision_ops()
    return real_export(name)[0]


# ------------------------------------------------------------------------------------------------
# A Llama-architecture decoder with transformers' static KV cache, as transformers exports it for
# ExecuTorch (tests/test_llm_path.py with a tiny config; benchmarks/bench_llm.py with a 1B one)


def static_cache_llama(config: dict[str, Any], max_cache: int) -> Any:
    """`TorchExportableModuleForDecoderOnlyLM` over a randomly initialised LlamaForCausalLM."""
    ensure_torchvision_ops()
    import transformers
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    cfg = transformers.LlamaConfig(**config)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.generation_config.use_cache = True
    model.generation_config.cache_implementation = "static"
    return TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=max_cache).eval()


def export_static_cache_llama(exportable: Any, prompt: list[int], max_cache: int) -> torch.export.ExportedProgram:
    """Exported with a dynamic sequence length (prefill and decode in one method). Strict: with
    non-strict export torch 2.13 lifts the cache tensors a second time as constants aliasing the
    buffers, and run_decompositions then fails (in ExecuTorch's pipeline too)."""
    seq = torch.export.Dim("seq", min=1, max=max_cache - 1)
    ep: torch.export.ExportedProgram = exportable.export(
        input_ids=torch.tensor([prompt]), cache_position=torch.arange(len(prompt)), strict=True,
        dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}},
    )
    return ep
