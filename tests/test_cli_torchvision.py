"""A user's torchvision model through `texir lower`, in a fresh interpreter: the torchvision wheel
beside the CPU torch cannot load its native ops, and texir's model loading makes it importable
(texir.adapters.torch_patches.make_torchvision_importable)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MODELS = """\
import torch
import torchvision.models as tvm


def mobilenet_v2():
    torch.manual_seed(0)
    model = tvm.mobilenet_v2(weights=None, num_classes=10, width_mult=0.25).eval()
    return model, (torch.rand(1, 3, 32, 32),)


def lraspp():
    torch.manual_seed(0)
    model = tvm.segmentation.lraspp_mobilenet_v3_large(weights=None, weights_backbone=None).eval()
    return model, (torch.rand(1, 3, 64, 64),)
"""


@pytest.mark.parametrize("model", [
    ["models.py:mobilenet_v2"],
    # LR-ASPP names its input `input`, like the builtin (issue 38), lowered as a user lowers it
    ["models.py:lraspp", "--partitioner", "xnnpack"],
], ids=["mobilenet_v2", "lraspp_xnnpack"])
def test_lower_a_torchvision_model_in_a_fresh_process(tmp_path: Path, model: list[str]) -> None:
    if not _installed("torchvision"):  # the [test] extra installs it; a plain install need not
        pytest.skip("torchvision is not installed")
    (tmp_path / "models.py").write_text(MODELS, encoding="utf-8")
    env = dict(os.environ, TEXIR_PROGRESS="0")
    done = subprocess.run(
        [sys.executable, "-m", "texir.cli.main", "lower", *model, "-o", "mb.pte", "--json"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "torchvision::nms" not in done.stderr and "Traceback" not in done.stderr
    assert json.loads(done.stdout)["pte"] == "mb.pte"
    data = (tmp_path / "mb.pte").read_bytes()
    assert data[4:8] == b"ET12"


def test_make_torchvision_importable_is_idempotent() -> None:
    from texir.adapters.torch_patches import make_torchvision_importable

    make_torchvision_importable()
    make_torchvision_importable()
    import torch

    if "torchvision" in sys.modules or _installed("torchvision"):
        import torchvision  # noqa: F401 - the import itself is what is tested

        assert hasattr(torch.ops.torchvision, "nms")


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _fresh(code: str, *, pth_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    root = str(Path(__file__).resolve().parents[1])
    prelude = f"import site; site.addsitedir({str(pth_dir)!r})\n" if pth_dir is not None else ""
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=root), timeout=300, check=False)


def test_torchvision_imports_after_import_texir_without_a_call() -> None:
    if not _installed("torchvision"):  # the [test] extra installs it; a plain install need not
        pytest.skip("torchvision is not installed")
    done = _fresh("import sys, texir\nassert 'torch' not in sys.modules  # arming the hook loads no torch\n"
                  "import torchvision.models as m\nprint(type(m.resnet18(weights=None)).__name__)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ResNet"


def test_the_venv_pth_makes_torchvision_import_first_thing(tmp_path: Path) -> None:
    if not _installed("torchvision"):
        pytest.skip("torchvision is not installed")
    from texir._torchvision import write_pth

    write_pth(tmp_path)  # what `make` writes into the .venv's site-packages
    done = _fresh("import torchvision\nprint(torchvision.__name__)", pth_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "torchvision" and "torchvision::nms" not in done.stderr
