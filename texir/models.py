"""Built-in demo models, usable as MODEL specs (``texir.models:conv_relu_tan``)."""

from __future__ import annotations

import torch
from torch import nn


class _ConvStack(nn.Module):
    """Two conv+relu blocks (3 -> 16 -> 32 channels, 3x3, padding 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels=3, out_channels=16, kernel_size=3, stride=1, padding=1)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(in_channels=16, out_channels=32, kernel_size=3, stride=1, padding=1)
        self.relu2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden: torch.Tensor = self.relu1(self.conv1(x))
        out: torch.Tensor = self.relu2(self.conv2(hidden))
        return out


class ConvReLUTan(nn.Module):
    """ExecuTorch's delegate-mapping demo model: conv, relu, conv, relu, then tan.

    Attribute names follow ExecuTorch's test model (``conv_layer.conv1`` ...) so parameter names
    and node names match between the two pipelines.
    """

    def __init__(self) -> None:
        super().__init__()
        self.conv_layer = _ConvStack()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tan(self.conv_layer(x))


def conv_relu_tan(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The ConvReLUTan model (eval mode, deterministic weights) and one 4x3x64x64 input."""
    generator = torch.Generator().manual_seed(seed)
    model = ConvReLUTan().eval()
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.rand(param.shape, generator=generator) * 0.2 - 0.1)
    example = torch.randn(4, 3, 64, 64, generator=generator)
    return model, (example,)
