"""MODEL specs (texir.cli.model_spec) and the `texir snapshot` / `texir show` commands."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from texir.ir.canonical import drop_stack_traces
from texir.cli.model_spec import ExportRecipe, load_model, load_program, load_value
from texir.cli.main import main
from texir.errors import ModelSpecError
from texir.ir import LoweredBackendModule, format_program, verify
from texir.serialize import snapshot

REPO = Path(__file__).resolve().parent.parent

MODEL_SOURCE = textwrap.dedent(
    """
    import torch
    from helper_mod import HIDDEN  # a neighbour module: the file's directory is importable

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, HIDDEN)
            self.register_buffer("scale", torch.full((HIDDEN,), 2.0))

        def forward(self, x):
            return torch.relu(self.lin(x)) * self.scale

    class Branchy(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent: torch.export cannot trace this
                return x
            return -x

    def build():
        torch.manual_seed(0)
        return M().eval(), (torch.randn(2, 3),)

    def build_list_args():
        torch.manual_seed(0)
        return M().eval(), [torch.randn(2, 3)]

    def build_dict():
        torch.manual_seed(0)
        return {"module": M().eval(), "args": (torch.randn(2, 3),)}

    def build_dynamic():
        torch.manual_seed(0)
        return M().eval(), (torch.randn(4, 3),), ({0: torch.export.Dim("batch", min=2, max=16)},)

    def build_ep():
        return torch.export.export(*build())

    class Factory:
        @staticmethod
        def make():
            return build()

    def raises():
        raise RuntimeError("weights not found\\nsecond line")

    def wrong_type():
        return 42

    def bare_tensor_args():
        return M(), torch.randn(2, 3)

    def bad_dict():
        return {"module": "not a module", "args": (1,), "extra": 1}

    def not_exportable():
        return Branchy(), (torch.randn(2, 3),)

    value = 3
    """
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("models")
    (directory / "helper_mod.py").write_text("HIDDEN = 4\n")
    (directory / "mymodel.py").write_text(MODEL_SOURCE)
    (directory / "broken.py").write_text("import torch\n1 / 0\n")
    (directory / "exits.py").write_text("import sys\nsys.exit(3)\n")
    return directory


@pytest.fixture(scope="module")
def spec(model_dir: Path) -> str:
    return f"{model_dir / 'mymodel.py'}:build"


# --------------------------------------------------------------------------------------------------
# load_model / load_program


def test_all_callable_return_forms_export_the_same_program(model_dir: Path, spec: str) -> None:
    base = load_model(spec)
    assert isinstance(base, torch.export.ExportedProgram)
    x = torch.randn(2, 3)
    expected = base.module()(x)
    for name in ("build_list_args", "build_dict", "build_ep", "Factory.make"):
        ep = load_model(f"{model_dir / 'mymodel.py'}:{name}")
        assert torch.equal(ep.module()(x), expected), name
    dynamic = load_model(f"{model_dir / 'mymodel.py'}:build_dynamic")
    assert dynamic.module()(torch.randn(7, 3)).shape == (7, 4)
    program = load_program(spec)
    verify(program)
    assert [s.target for s in program.state] == ["lin.bias", "lin.weight", "scale"]


def test_package_module_spec_and_builtin_demo_model() -> None:
    program = load_program("texir.models:conv_relu_tan", decompose=True)
    verify(program)
    assert "aten::convolution.default" in format_program(program)


def test_pt2_file(tmp_path: Path, spec: str) -> None:
    ep = load_model(spec)
    path = tmp_path / "model.pt2"
    torch.export.save(ep, str(path))
    loaded = load_model(str(path))
    x = torch.randn(2, 3)
    assert torch.equal(loaded.module()(x), ep.module()(x))
    assert format_program(load_program(str(path))) == format_program(load_program(spec))
    (tmp_path / "junk.pt2").write_bytes(b"not a zip")
    with pytest.raises(ModelSpecError, match="torch.export.load"):
        load_model(str(tmp_path / "junk.pt2"))


def test_snapshot_files_are_programs_too(tmp_path: Path, spec: str) -> None:
    program = load_program(spec)
    for name in ("p.json", "p.msgpack"):
        snapshot.dump(program, tmp_path / name, include_data=True, include_stack_traces=True)
        assert load_program(str(tmp_path / name)) == program
    module = LoweredBackendModule(backend_id="b", processed_bytes=b"", compile_specs=(), original_program=program)
    snapshot.dump(module, tmp_path / "m.json")
    assert isinstance(load_value(str(tmp_path / "m.json")), LoweredBackendModule)
    with pytest.raises(ModelSpecError, match="lowered backend module"):
        load_program(str(tmp_path / "m.json"))
    with pytest.raises(ModelSpecError, match="is a snapshot, not a model"):
        load_model(str(tmp_path / "p.json"))


@pytest.mark.parametrize(
    ("attr_or_spec", "pattern"),
    [
        ("{dir}/nope.py:build", r"MODEL file '.*nope\.py' does not exist"),
        ("{dir}/mymodel.py:missing", r"has no attribute 'missing' \(it defines: .*build"),
        ("{dir}/mymodel.py:raises", r"calling .*:raises\(\) failed: RuntimeError: weights not found$"),
        ("{dir}/mymodel.py:wrong_type", r"returned int; return \(nn.Module, example_inputs\)"),
        ("{dir}/mymodel.py:bare_tensor_args", r"args: .*tuple of positional arguments, got Tensor .*\(x,\)"),
        ("{dir}/mymodel.py:bad_dict", r"module: .*expected a torch.nn.Module.*extra: Extra inputs"),
        ("{dir}/mymodel.py:not_exportable", r"torch.export.export failed for .*not_exportable: \w+"),
        ("{dir}/mymodel.py:value", r"is an int, not a callable"),
        ("{dir}/broken.py:build", r"running '.*broken\.py' failed: ZeroDivisionError: division by zero"),
        ("{dir}/exits.py:build", r"running '.*exits\.py' failed: SystemExit: 3"),
        ("no_such_package_xyz.models:build", r"no module named 'no_such_package_xyz'"),
        ("just-a-name", r"is not FILE.py:CALLABLE, PACKAGE.MODULE:CALLABLE or FILE.pt2"),
        ("", r"MODEL is empty"),
        ("{dir}/missing.pt2", r"does not exist"),
    ],
)
def test_bad_specs_give_one_clear_line(model_dir: Path, attr_or_spec: str, pattern: str) -> None:
    with pytest.raises(ModelSpecError, match=pattern) as info:
        load_model(attr_or_spec.format(dir=model_dir))
    assert "\n" not in str(info.value)


def test_export_recipe_validates_and_defaults() -> None:
    recipe = ExportRecipe(module=torch.nn.ReLU(), args=[torch.ones(1)])
    assert isinstance(recipe.args, tuple) and recipe.kwargs == {} and recipe.strict is False


# --------------------------------------------------------------------------------------------------
# The CLI, in process


def test_snapshot_to_file_then_show_it(tmp_path: Path, spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m.json"
    assert main(["snapshot", spec, "-o", str(out)]) == 0
    program = snapshot.loads(out.read_bytes())
    assert program == snapshot.strip_data(drop_stack_traces(load_program(spec)))
    assert all(e.value.data is None for e in program.state)
    capsys.readouterr()

    packed = tmp_path / "m.msgpack"  # format follows the suffix
    assert main(["snapshot", spec, "--include-data", "-o", str(packed)]) == 0
    assert snapshot.detect_format(packed.read_bytes()) == "msgpack"
    assert snapshot.loads(packed.read_bytes()) == drop_stack_traces(load_program(spec))

    assert main(["show", spec]) == 0
    from_model = capsys.readouterr().out
    assert main(["show", str(packed)]) == 0
    from_snapshot = capsys.readouterr().out
    assert from_model == from_snapshot == format_program(load_program(spec)).rstrip("\n") + "\n"
    assert "aten::linear.default" in from_model

    assert main(["show", str(packed), "--canonical"]) == 0
    assert "%0 " in capsys.readouterr().out
    assert main(["show", spec, "--decompose", "-o", str(tmp_path / "m.txt")]) == 0
    assert "aten::addmm.default" in (tmp_path / "m.txt").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json", "m.msgpack", "m.txt"]


def test_snapshot_to_stdout_is_binary_safe(tmp_path: Path, spec: str, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    packed = tmp_path / "m.msgpack"
    assert main(["snapshot", spec, "--include-data", "-o", str(packed)]) == 0
    capsysbinary.readouterr()
    # Snapshot in, msgpack out on stdout: the same bytes as the file.
    assert main(["snapshot", str(packed), "--format", "msgpack", "--include-data"]) == 0
    assert capsysbinary.readouterr().out == packed.read_bytes()
    assert main(["snapshot", str(packed)]) == 0
    assert capsysbinary.readouterr().out == snapshot.dumps(snapshot.loads(packed.read_bytes()))


def test_errors_are_one_line_exit_2_and_leave_no_file(
    tmp_path: Path, model_dir: Path, spec: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["show", f"{model_dir / 'mymodel.py'}:missing"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("texir show: error: ") and "missing" in lines[0]

    target = tmp_path / "no_dir" / "m.json"
    assert main(["snapshot", spec, "-o", str(target)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("texir snapshot: error: cannot write")
    assert not target.parent.exists()

    (tmp_path / "corrupt.json").write_bytes(b'{"format": "texir-snapshot", "schema_version": [1, 0], "program": {"graph": 1}}')
    assert main(["show", str(tmp_path / "corrupt.json")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "$.program.graph" in err[0]


def test_show_a_lowered_module_snapshot_and_msgpack_never_goes_to_a_terminal(
    tmp_path: Path, spec: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    program = load_program(spec)
    module = LoweredBackendModule(backend_id="MyBackend", processed_bytes=b"\x01\x02", compile_specs=(),
                                  original_program=program)
    snapshot.dump(module, tmp_path / "m.mpk")
    assert main(["show", str(tmp_path / "m.mpk")]) == 0
    text = capsys.readouterr().out
    assert "MyBackend" in text and "aten::linear.default" in text

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(["snapshot", str(tmp_path / "m.mpk"), "--format", "msgpack"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "refusing to write binary msgpack to a terminal" in captured.err


@pytest.mark.parametrize("command", ["snapshot", "show"])
def test_help_has_examples(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert "examples:" in text and f"texir {command} " in text and "MODEL" in text


# --------------------------------------------------------------------------------------------------
# The installed console script, once, in a fresh process


def test_console_script_in_a_subprocess(tmp_path: Path, spec: str) -> None:
    env = dict(os.environ, TEXIR_PROGRESS="0")
    cli = [sys.executable, "-m", "texir.cli.main"]
    out = tmp_path / "m.json"
    good = subprocess.run([*cli, "snapshot", spec, "-o", str(out)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    assert good.returncode == 0, good.stderr
    assert good.stdout == "" and snapshot.loads(out.read_bytes()) == snapshot.strip_data(drop_stack_traces(load_program(spec)))
    bad = subprocess.run([*cli, "snapshot", "nowhere/model.py:build"], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=300)
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert bad.stderr.splitlines() == [
        "texir snapshot: error: MODEL file 'nowhere/model.py' does not exist (in 'nowhere/model.py:build')"
    ]
