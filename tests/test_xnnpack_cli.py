"""`texir lower MODEL --partitioner xnnpack` (texir's native XNNPACK) against `executorch:xnnpack`
(ExecuTorch's partitioner and backend through texir): the same .pte, run in ExecuTorch's runtime."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import torch

from tests.test_xnnpack_native import executorch_lowered
from tests.xnnpack_oracle import pte_view, run_pte
from tests.zoo import cached_export, zoo_model
from texir.cli.main import main


@pytest.fixture(scope="module")
def convnet_pt2(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("xnnpack_cli") / "convnet.pt2"
    torch.export.save(cached_export("convnet", decompose=False), path)
    return path


def test_native_cli_writes_executorchs_pte_and_it_runs(
    convnet_pt2: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from texir.backends.xnnpack import XnnpackNativeBackend
    from texir.emit import emit
    from texir.lowering import backend as registry
    from texir.serialize.pte.codec import dumps

    before = registry._REGISTRY.get("XnnpackBackend")
    native, theirs = tmp_path / "native.pte", tmp_path / "executorch.pte"
    assert main(["lower", str(convnet_pt2), "--partitioner", "xnnpack", "--no-cache", "-o", str(native)]) == 0
    assert "XnnpackBackend" in capsys.readouterr().out
    # the native backend was registered for that lowering only
    assert registry._REGISTRY.get("XnnpackBackend") is before
    assert not isinstance(before, XnnpackNativeBackend)
    assert main(["lower", str(convnet_pt2), "--partitioner", "executorch:xnnpack", "--no-cache", "-o", str(theirs)]) == 0
    capsys.readouterr()
    oracle = dumps(emit(executorch_lowered("convnet")))
    assert theirs.read_bytes() == oracle
    mine = pte_view(native.read_bytes())
    assert [d for d, _ in mine.delegates] == ["XnnpackBackend"]
    assert mine.delegates == pte_view(oracle).delegates and mine.named == pte_view(oracle).named
    assert native.read_bytes() == oracle
    module, args = zoo_model("convnet").build()
    with torch.no_grad():
        expected = module(*args)
    (got,) = run_pte(native.read_bytes(), args)[0]
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    # texir inspect shows the delegate's XNNPACK values and nodes
    assert main(["inspect", str(native)]) == 0
    text = capsys.readouterr().out
    assert "        XNNGraph version=0 externs=2" in text
    assert "FullyConnected(input1_id=%11, filter_id=%12, bias_id=%13, output_id=%14)  # dh=10" in text


_BLOCKED_CLI = """
import importlib.abc, sys

class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "executorch":
            raise ImportError(f"executorch is blocked in this test ({name})")
        return None

sys.meta_path.insert(0, _Block())
from texir.cli.main import main
code = main(["lower", sys.argv[1], "--partitioner", "xnnpack", "--no-cache", "-o", sys.argv[2]])
assert code == 0, code
assert not [m for m in sys.modules if m.split(".")[0] == "executorch"]
"""


def test_native_cli_needs_no_executorch(convnet_pt2: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """`--partitioner xnnpack` in an interpreter where importing executorch fails: the same .pte."""
    from texir.emit import emit
    from texir.serialize.pte.codec import dumps

    out = tmp_path / "convnet.pte"
    root = pathlib.Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    subprocess.run([sys.executable, "-c", _BLOCKED_CLI, str(convnet_pt2), str(out)], check=True, env=env, cwd=root)
    assert out.read_bytes() == dumps(emit(executorch_lowered("convnet")))


def test_backend_registered_restores_what_was_there() -> None:
    from texir.backends.xnnpack import XnnpackNativeBackend, registered
    from texir.lowering import backend as registry

    before = registry._REGISTRY.get("XnnpackBackend")
    with pytest.raises(RuntimeError, match="inside"):
        with registered() as backend:
            assert registry._REGISTRY["XnnpackBackend"] is backend
            assert isinstance(backend, XnnpackNativeBackend)
            raise RuntimeError("inside")
    assert registry._REGISTRY.get("XnnpackBackend") is before
