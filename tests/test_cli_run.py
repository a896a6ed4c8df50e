"""`texir run FILE.pte|FILE.bpte`: outputs, latency and closeness to eager in ExecuTorch's runtime,
with and without a `.ptd`, a bundled program's own cases, and one typed line (exit 2) per mistake."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from texir.cli.main import main

pytest.importorskip("executorch", reason="the executorch test extra (pip install -e '.[test]')")

MODEL_SOURCE = '''
import torch

class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(4, 8), torch.nn.Linear(8, 3)

    def forward(self, x):
        return torch.tanh(self.fc2(torch.relu(self.fc1(x))))

def build():
    torch.manual_seed(0)
    return Tiny().eval(), (torch.randn(2, 4),)
'''


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("run")
    (d / "tiny.py").write_text(MODEL_SOURCE)
    model = f"{d / 'tiny.py'}:build"
    out = {"model": Path(model), "dir": d}
    for name, extra in (("plain", []), ("xnn", ["--partitioner", "xnnpack"]),
                        ("ext", ["--partitioner", "xnnpack", "--external-data"]),
                        ("ref", ["--backend", "texir-reference", "--whole"])):
        out[name] = d / f"{name}.pte"
        assert main(["lower", model, *extra, "--no-cache", "-o", str(out[name])]) == 0
    out["ptd"] = d / "ext.ptd"
    out["bpte"] = d / "tiny.bpte"
    assert main(["bundle", model, "--partitioner", "xnnpack", "--cases", "1", "--no-cache", "-o", str(out["bpte"])]) == 0
    return out


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, object]:
    capsys.readouterr()
    assert main(argv) == 0
    value: dict[str, object] = json.loads(capsys.readouterr().out)
    return value


@pytest.mark.parametrize("name", ["plain", "xnn"])
def test_run_matches_eager_on_random_and_given_inputs(
    name: str, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    model = str(files["model"])
    report = _json(capsys, ["run", str(files[name]), "--compare", model, "--repeat", "3", "--json"])
    (row,) = report["outputs"]  # type: ignore[misc]  # JSON: a list of one row
    assert row["shape"] == [2, 3] and row["dtype"] == "float32"
    assert -1.0 <= row["min"] <= row["mean"] <= row["max"] <= 1.0  # tanh's range
    assert row["max_abs_diff"] < 1e-4 and report["runs"] == 3 and report["median_ms"] > 0
    # --inputs: a saved tuple; the summary is of these inputs' outputs, equal to eager's
    x = torch.full((2, 4), 0.5)
    torch.save((x,), files["dir"] / "in.pt")
    report = _json(capsys, ["run", str(files[name]), "--inputs", str(files["dir"] / "in.pt"), "--compare", model, "--json"])
    (row,) = report["outputs"]  # type: ignore[misc]
    assert row["max_abs_diff"] < 1e-4
    assert main(["run", str(files[name]), "--compare", model]) == 0
    text = capsys.readouterr().out
    assert "output 0: float32[2, 3]" in text and "max |diff| vs eager" in text and "latency: median" in text


def test_run_with_a_ptd_and_without_it(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    report = _json(capsys, ["run", str(files["ext"]), "--data", str(files["ptd"]), "--compare", str(files["model"]), "--json"])
    (row,) = report["outputs"]  # type: ignore[misc]
    assert row["max_abs_diff"] < 1e-4
    # Without the .ptd ExecuTorch 1.5.1's XNNPACK delegate would crash the process: refused first.
    assert main(["run", str(files["ext"])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "weights outside the .pte" in err and "--data FILE.ptd" in err
    assert main(["run", str(files["ext"]), "--data", str(files["xnn"])]) == 2
    assert "not a .ptd file" in capsys.readouterr().err
    assert main(["run", str(files["ptd"])]) == 2
    assert f"--data {files['ptd']}" in capsys.readouterr().err


def test_load_method_without_its_ptd_is_refused_not_a_crash(files: dict[str, Path]) -> None:
    """From Python too: ExecuTorch 1.5.1's XNNPACK delegate would crash the process, so load_method
    refuses a .pte whose weights live in a .ptd when it is given none (path or bytes)."""
    from texir.executorch.runtime import RuntimeRunError, load_method

    for source in (files["ext"], str(files["ext"]), files["ext"].read_bytes()):
        with pytest.raises(RuntimeRunError, match="weights outside the .pte .*data_path="):
            load_method(source)
    method = load_method(files["ext"], data_path=files["ptd"])
    assert len(method.execute([torch.zeros(2, 4)])) == 1
    load_method(files["xnn"])  # its weights are inside: no .ptd needed


def test_run_checks_a_bpte_s_own_cases(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["run", str(files["bpte"])]) == 0
    out = capsys.readouterr().out
    assert "forward[0]: ok" in out and "forward[1]: ok" in out and "2 of 2 cases pass" in out
    assert main(["run", str(files["bpte"]), "--data", str(files["ptd"])]) == 2
    assert "a .bpte runs its own cases" in capsys.readouterr().err


def test_run_mistakes_are_one_typed_line(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    bad = files["dir"] / "bad.pte"
    bad.write_bytes(files["plain"].read_bytes()[:100])
    wrong_inputs = files["dir"] / "wrong.pt"
    torch.save((torch.zeros(3, 3),), wrong_inputs)
    cases = [
        (["run", str(files["ref"])], "delegates to texir-reference, which this ExecuTorch runtime does not have"),
        (["run", str(files["plain"]), "--method", "nope"], "has no such method; it has forward"),
        (["run", str(files["dir"] / "missing.pte")], "does not exist"),
        (["run", str(bad)], "is not a .pte ExecuTorch can load"),
        (["run", str(files["plain"]), "--inputs", str(wrong_inputs)], "input 0 has shape [3, 3]"),
        (["run", str(files["plain"]), "--compare", "no/such/model.py:build"], "MODEL file 'no/such/model.py' does not exist"),
        (["run", str(files["plain"]), "--repeat", "0"], "--repeat 0"),
    ]
    capsys.readouterr()
    for argv, needle in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("texir run: error: ") and err.count("\n") == 1 and needle in err, (argv, err)


def _texir(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "texir.cli.main", *argv], capture_output=True, text=True, env=env,
                          timeout=300, check=False)


def test_runtime_noise_is_off_unless_verbose(files: dict[str, Path]) -> None:
    quiet = _texir("run", str(files["xnn"]))
    assert quiet.returncode == 0, quiet.stderr
    assert "cpuinfo_utils" not in quiet.stderr and "_C_mxfp8" not in quiet.stderr and "register_constant" not in quiet.stderr
    assert quiet.stderr == ""
    loud = _texir("-v", "run", str(files["xnn"]))
    assert loud.returncode == 0 and "output 0: float32[2, 3]" in loud.stdout
    assert "_C_mxfp8" in loud.stderr or "cpuinfo_utils" in loud.stderr  # what -v shows on this install


@pytest.mark.parametrize("model", ["no_such_file.py:build", "no_such_package.models:build", "missing.pt2"])
def test_a_typo_d_model_is_reported_before_torch_loads(model: str, tmp_path: Path) -> None:
    code = ("import sys\nfrom texir.cli.main import main\n"
            f"code = main(['lower', {model!r}])\nprint(code, 'torch' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300, check=False)
    assert done.stdout.split() == ["2", "False"], done.stderr
    assert done.stderr.startswith("texir lower: error: ") and done.stderr.count("\n") == 1
    assert ("does not exist" in done.stderr) or ("no module named 'no_such_package'" in done.stderr)
