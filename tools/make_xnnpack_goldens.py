"""Write tests/golden/xnnpack/: the native XNNPACK backend's torch-free goldens (issue 40).

Run from the repository root with torch available: `PYTHONPATH=. python tools/make_xnnpack_goldens.py`.
Each tiny model below is exported, lowered with `texir.lower(ep, [xnnpack.partitioner()])` (the native
backend registered), and each of its delegates becomes a case `<model>` (`<model>_<i>` when it has
several): the delegate's input program as text, its constants' bytes named by SHA-256, the blob as
`format_blob` text and the working graph after each pass (see tests/xnnpack_goldens.py). The bytes
written depend only on the models (fixed seeds), not on PYTHONHASHSEED; the directory is rewritten
whole.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from tests.xnnpack_goldens import (
    BLOB, CONSTANTS, PASS_TEXT, PROGRAM, XNNPACK_GOLDENS, blob_text, load_case, passes_text,
)
from texir.backends.xnnpack.backend import XnnpackNativeBackend
from texir.ir import format_program
from texir.ir.parser import payloads_of


class _Fn(nn.Module):
    def __init__(self, fn: Callable[..., torch.Tensor], *children: nn.Module) -> None:
        super().__init__()
        self.fn, self.children_ = fn, nn.ModuleList(children)

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return self.fn(self.children_, *xs)


def _r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def _bn(channels: int) -> nn.BatchNorm2d:
    """Batch norm with running statistics other than 0 and 1 (so that folding them changes the weights)."""
    bn = nn.BatchNorm2d(channels)
    bn.get_buffer("running_mean").uniform_(-1, 1)
    bn.get_buffer("running_var").uniform_(0.5, 2)
    return bn


def _models() -> dict[str, tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    """name -> (module, example inputs); the op family each covers is in its name."""
    torch.manual_seed(0)
    bn, bn2 = _bn(3), _bn(2)
    return {
        "linear_addmm": (_Fn(lambda m, x: m[0](x), nn.Linear(4, 3)), (_r(2, 4),)),
        "linear_no_bias_relu": (_Fn(lambda m, x: torch.relu(m[0](x)), nn.Linear(4, 3, bias=False)), (_r(2, 4),)),
        "conv2d_relu": (_Fn(lambda m, x: torch.relu(m[0](x)), nn.Conv2d(2, 3, 3, padding=1)), (_r(1, 2, 5, 5),)),
        "conv1d": (_Fn(lambda m, x: m[0](x), nn.Conv1d(2, 3, 3)), (_r(1, 2, 6),)),
        "conv_bn_fused": (_Fn(lambda m, x: m[1](m[0](x)), nn.Conv2d(2, 3, 3), bn), (_r(1, 2, 5, 5),)),
        "batch_norm_alone": (_Fn(lambda m, x: m[0](x) + 1.0, bn2), (_r(1, 2, 3, 3),)),
        "unary_sigmoid_abs": (_Fn(lambda m, x: torch.abs(torch.sigmoid(x))), (_r(2, 3),)),
        "binary_broadcast": (_Fn(lambda m, x, y: x * y - y), (_r(2, 3, 4), _r(4))),
        "pooling": (_Fn(lambda m, x: nn.functional.avg_pool2d(nn.functional.max_pool2d(x, 2), 2, ceil_mode=False)),
                    (_r(1, 2, 8, 8),)),
        "concat_six": (_Fn(lambda m, *xs: torch.cat(xs, dim=1)), tuple(_r(2, i + 1) for i in range(6))),
        "max_dim_amax": (_Fn(lambda m, x: torch.max(x, dim=3, keepdim=True)[0] + 1.0), (_r(1, 2, 3, 4),)),
        "clone": (_Fn(lambda m, x: torch.relu(x).clone() * 2.0), (_r(2, 3),)),
        "to_channels_last_conv": (
            _Fn(lambda m, x: m[0](x.to(memory_format=torch.channels_last)), nn.Conv2d(2, 2, 1)), (_r(1, 2, 3, 3),),
        ),
        "conv_add_conv": (
            _Fn(lambda m, x: m[1](m[0](x) + x), nn.Conv2d(2, 2, 1), nn.Conv2d(2, 2, 1)), (_r(1, 2, 3, 3),),
        ),
        "conv_copy_conv": (
            _Fn(lambda m, x: m[1](m[0](x).to(memory_format=torch.channels_last)),
                nn.Conv2d(2, 2, 1), nn.Conv2d(2, 2, 1)),
            (_r(1, 2, 3, 3),),
        ),
        "channels_last_conv": (
            _Fn(lambda m, x: m[0](x) + 1.0, nn.Conv2d(2, 2, 1)),
            (_r(1, 2, 3, 3).to(memory_format=torch.channels_last),),
        ),
    }


def _quantized() -> dict[str, tuple[torch.export.ExportedProgram, None]]:
    from tests.test_xnnpack_native_quant import quantized

    return {
        "int8_linear_relu_per_channel": (quantized("linear_relu_pc")[0], None),
        "int8_same_pad_conv_per_channel": (quantized("same_pad_conv_pc")[0], None),
    }


def _recipes() -> dict[str, torch.export.ExportedProgram]:
    """A two-linear MLP through texir's recipes as `texir lower --recipe` runs them: dynamic int8
    activations with per-channel int8 weights, and torchao's 8da4w (int4 weights in groups of 32)."""
    from texir.recipes import Recipe, export

    def mlp() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 8)).eval()

    args = (torch.randn(2, 64, generator=torch.Generator().manual_seed(1)),)
    return {
        "int8_dynamic_mlp": export(mlp(), args, Recipe(name="xnnpack-int8-dynamic")),
        "int4_8da4w_mlp": export(mlp(), args, Recipe(name="xnnpack-8da4w")),
    }


def main() -> None:
    exported = {name: torch.export.export(m.eval(), args, strict=False) for name, (m, args) in _models().items()}
    exported.update({name: ep for name, (ep, _) in _quantized().items()})
    exported.update(_recipes())
    # written next to the goldens and moved in place once whole: a failing model leaves them as they were
    work = XNNPACK_GOLDENS.with_name("xnnpack.partial")
    if work.exists():
        shutil.rmtree(work)
    try:
        _write(work, exported)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    if XNNPACK_GOLDENS.exists():
        shutil.rmtree(XNNPACK_GOLDENS)
    work.rename(XNNPACK_GOLDENS)


def _write(work: Path, exported: dict[str, torch.export.ExportedProgram]) -> None:
    from texir.backends.xnnpack import partitioner, registered
    from texir.orchestrate import lower

    with registered():
        for name, ep in exported.items():
            modules = [m.module for m in lower(ep, [partitioner()], cache=None).program.lowered_modules]
            if not modules:
                raise SystemExit(f"{name}: the native partitioner delegated nothing")
            for i, module in enumerate(modules):
                case = work / (name if len(modules) == 1 else f"{name}_{i}")
                (case / CONSTANTS).mkdir(parents=True)
                program = module.original_program
                (case / PROGRAM).write_text(format_program(program), encoding="utf-8")
                for sha, data in sorted(payloads_of(program).items()):
                    (case / CONSTANTS / f"{sha}.bin").write_bytes(bytes(data.view()))
                # the golden is what the backend makes of the text: check it is what lowering made
                parsed = load_case(case)
                if XnnpackNativeBackend().preprocess(parsed, ()).processed_bytes != module.processed_bytes:
                    raise SystemExit(f"{case.name}: the blob from the parsed text differs from the lowered one")
                (case / BLOB).write_text(blob_text(parsed), encoding="utf-8")
                (case / PASS_TEXT).write_text(passes_text(parsed), encoding="utf-8")
                print(case.name, sum(f.stat().st_size for f in case.rglob("*") if f.is_file()), "bytes")


if __name__ == "__main__":
    main()
