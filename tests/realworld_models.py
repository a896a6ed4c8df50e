"""The real-world differential's models (tests/test_realworld_differential.py): the XNNPACK oracle's
REAL_MODELS (tests/real_models.py), more torchvision, transformers and timm architectures and a few
recurrent models, all built from small configs with seeded random weights (nothing is downloaded).
Each builder returns an eval-mode module and example positional args."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tests.real_models import REAL_MODELS, RealModel, _hf, _image, _seeded, _tv, ensure_torchvision_ops

__all__ = ["EXTRA_MODELS", "REALWORLD_MODELS"]

Builder = Callable[[], tuple[nn.Module, tuple[Any, ...]]]


def _tv_config(module: str, cls: str, size: int = 64, **kw: Any) -> Builder:
    """A torchvision architecture class (`torchvision.models.<module>.<cls>`) built from `kw`."""

    def build() -> tuple[nn.Module, tuple[Any, ...]]:
        ensure_torchvision_ops()
        import importlib

        make = getattr(importlib.import_module(f"torchvision.models.{module}"), cls)
        return _seeded(lambda: make(**kw)), _image(size)

    return build


def _resnext() -> tuple[nn.Module, tuple[Any, ...]]:
    ensure_torchvision_ops()
    from torchvision.models.resnet import Bottleneck, ResNet

    return _seeded(lambda: ResNet(Bottleneck, [1, 1, 1, 1], groups=4, width_per_group=8, num_classes=10)), _image()


def _deeplab() -> tuple[nn.Module, tuple[Any, ...]]:
    """DeepLabV3's ASPP head (atrous convolutions, image pooling upsampled bilinearly) on a narrow
    dilated MobileNetV3-Small."""
    ensure_torchvision_ops()
    from torchvision.models import mobilenet_v3_small
    from torchvision.models.segmentation.deeplabv3 import DeepLabHead

    class DeepLab(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone = mobilenet_v3_small(width_mult=0.5, dilated=True).features
            self.head = DeepLabHead(self.backbone[-1].out_channels, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.head(self.backbone(x))
            return nn.functional.interpolate(y, size=x.shape[-2:], mode="bilinear", align_corners=False)

    return _seeded(DeepLab), _image(32)


def _timm(name: str, size: int = 64, **kw: Any) -> Builder:
    """A timm architecture by name, `pretrained=False` (random weights, nothing downloaded)."""

    def build() -> tuple[nn.Module, tuple[Any, ...]]:
        ensure_torchvision_ops()
        import timm

        return _seeded(lambda: timm.create_model(name, pretrained=False, **kw)), _image(size)

    return build


class _KeywordSpotter(nn.Module):
    """Keyword spotting as phones run it: a 1-D convolution over audio features, a two-layer LSTM,
    a classifier on the last step."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(10, 16, 3, padding=1)
        self.lstm = nn.LSTM(16, 16, num_layers=2, batch_first=True)
        self.head = nn.Linear(16, 6)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv(features)).transpose(1, 2)
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


class _SpeechEnhancer(nn.Module):
    """A per-frame mask from a bidirectional GRU over spectrogram frames (noise suppression)."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(12, 8, bidirectional=True)
        self.mask = nn.Linear(16, 12)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(frames)
        return frames * torch.sigmoid(self.mask(out))


class _Tagger(nn.Module):
    """A sequence tagger: embeddings, an Elman RNN with its initial state, per-token logits."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.rnn = nn.RNN(8, 8, num_layers=2, batch_first=True)
        self.out = nn.Linear(8, 5)

    def forward(self, tokens: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(tokens), h0)
        return self.out(out)


def _recurrent(make: Callable[[], nn.Module], *shapes: tuple[int, ...], tokens: int = 0) -> Builder:
    def build() -> tuple[nn.Module, tuple[Any, ...]]:
        g = torch.Generator().manual_seed(3)
        args = [torch.randint(0, tokens, shapes[0], generator=g)] if tokens else []
        args += [torch.randn(*shape, generator=g) for shape in shapes[len(args):]]
        return _seeded(make), tuple(args)

    return build


_TINY = dict(vocab_size=100)
_DECODER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=32, **_TINY)
_ENCODER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                max_position_embeddings=32, **_TINY)
_NO_CACHE = {"use_cache": False}

EXTRA_MODELS: tuple[RealModel, ...] = (
    # torchvision
    RealModel("regnet_y_400mf", _tv("regnet_y_400mf"), "torchvision"),
    RealModel("mobilenet_v3_large", _tv("mobilenet_v3_large"), "torchvision"),
    RealModel("densenet_config", _tv_config("densenet", "DenseNet", growth_rate=8, block_config=(2, 2, 2, 2),
                                            num_init_features=16, num_classes=10), "torchvision"),
    RealModel("googlenet", _tv("googlenet", aux_logits=False, init_weights=False), "torchvision"),
    RealModel("inception_v3", _tv_config("inception", "Inception3", size=80, aux_logits=False,
                                         init_weights=False, num_classes=10), "torchvision"),
    RealModel("resnext_config", _resnext, "torchvision"),
    RealModel("swin_config", _tv_config("swin_transformer", "SwinTransformer", size=32, patch_size=[4, 4],
                                        embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=[4, 4],
                                        num_classes=10), "torchvision"),
    RealModel("maxvit_config", _tv_config("maxvit", "MaxVit", input_size=(64, 64), stem_channels=16,
                                          partition_size=4, block_channels=[16, 32], block_layers=[1, 1],
                                          head_dim=8, stochastic_depth_prob=0.0, num_classes=10), "torchvision"),
    RealModel("deeplabv3_head", _deeplab, "torchvision"),
    # transformers
    RealModel("t5_encoder", _hf("T5Config", "T5EncoderModel", "last_hidden_state", d_model=32, d_kv=8, d_ff=64,
                                num_layers=2, num_heads=4, **_TINY), "transformers"),
    RealModel("roberta", _hf("RobertaConfig", "RobertaModel", "last_hidden_state", pad_token_id=1, **_ENCODER),
              "transformers"),
    RealModel("albert", _hf("AlbertConfig", "AlbertModel", "last_hidden_state", embedding_size=16, **_ENCODER),
              "transformers"),
    RealModel("electra", _hf("ElectraConfig", "ElectraModel", "last_hidden_state", embedding_size=16, **_ENCODER),
              "transformers"),
    RealModel("mistral", _hf("MistralConfig", "MistralForCausalLM", "logits", call=_NO_CACHE, **_DECODER),
              "transformers"),
    RealModel("qwen2", _hf("Qwen2Config", "Qwen2ForCausalLM", "logits", call=_NO_CACHE, **_DECODER), "transformers"),
    RealModel("qwen3", _hf("Qwen3Config", "Qwen3ForCausalLM", "logits", call=_NO_CACHE, head_dim=8, **_DECODER),
              "transformers"),
    RealModel("gemma", _hf("GemmaConfig", "GemmaForCausalLM", "logits", call=_NO_CACHE, head_dim=8, **_DECODER),
              "transformers"),
    RealModel("clip_vision", _hf("CLIPVisionConfig", "CLIPVisionModel", "last_hidden_state", input="pixel_values",
                                 image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=2, intermediate_size=64), "transformers"),
    RealModel("hf_convnext", _hf("ConvNextConfig", "ConvNextModel", "last_hidden_state", input="pixel_values",
                                 hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1]), "transformers"),
    RealModel("opt", _hf("OPTConfig", "OPTForCausalLM", "logits", call=_NO_CACHE, hidden_size=32, ffn_dim=64,
                         num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=32,
                         word_embed_proj_dim=32, **_TINY), "transformers"),
    # timm (its test_* architectures are tiny variants of the families' real structure)
    RealModel("timm_convnextv2_atto", _timm("convnextv2_atto"), "timm"),
    RealModel("timm_mobilevit_xxs", _timm("mobilevit_xxs"), "timm"),
    RealModel("timm_efficientvit_b0", _timm("efficientvit_b0"), "timm"),
    RealModel("timm_mobilenetv4_conv_small", _timm("mobilenetv4_conv_small"), "timm"),
    RealModel("timm_ghostnet_050", _timm("ghostnet_050"), "timm"),
    RealModel("timm_lcnet_050", _timm("lcnet_050"), "timm"),
    RealModel("timm_repvit_m0_9", _timm("repvit_m0_9"), "timm"),
    RealModel("timm_edgenext_xx_small", _timm("edgenext_xx_small"), "timm"),
    RealModel("timm_levit_128s", _timm("levit_128s", size=64, img_size=64), "timm"),
    RealModel("timm_deit_tiny", _timm("deit_tiny_patch16_224", size=32, img_size=32), "timm"),
    RealModel("timm_mixer_s16", _timm("mixer_s16_224", size=32, img_size=32), "timm"),
    RealModel("timm_test_vit", _timm("test_vit", img_size=64, dynamic_img_size=False), "timm"),
    RealModel("timm_test_convnext", _timm("test_convnext"), "timm"),
    RealModel("timm_test_efficientnet", _timm("test_efficientnet"), "timm"),
    RealModel("timm_test_byobnet", _timm("test_byobnet"), "timm"),
    RealModel("timm_test_resnet", _timm("test_resnet"), "timm"),
    RealModel("timm_test_nfnet", _timm("test_nfnet"), "timm"),
    RealModel("timm_test_mambaout", _timm("test_mambaout"), "timm"),
    RealModel("timm_test_coatnet", _timm("test_coatnet", size=160), "timm"),
    # recurrent (speech and text models on phones; the variants of torch.nn's modules themselves are
    # tests/recurrent_models.py's)
    RealModel("kws_lstm", _recurrent(_KeywordSpotter, (1, 10, 6)), "recurrent"),
    RealModel("speech_gru", _recurrent(_SpeechEnhancer, (4, 1, 12)), "recurrent"),
    RealModel("rnn_tagger", _recurrent(_Tagger, (1, 5), (2, 1, 8), tokens=50), "recurrent"),
)

REALWORLD_MODELS: tuple[RealModel, ...] = (*REAL_MODELS, *EXTRA_MODELS)
