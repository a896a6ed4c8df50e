"""`texir lower`'s outputs as one unit: every path checked before any lowering, all files written to
temporary files and renamed together, nothing left behind by an error or a SIGINT at any point
(texir.cli.paths.Outputs, texir.cli.interrupts)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from texir.cli import interrupts
from texir.cli.main import main
from texir.cli.paths import Outputs, OutputError
from texir.errors import TexirError

MODEL = "texir.models:conv_relu_tan"
OLD = b"the previous file"


def _argv(d: Path) -> list[str]:
    return ["lower", MODEL, "--partitioner", "xnnpack", "-o", str(d / "m.pte"), "--external-data",
            "--etrecord", str(d / "m.etrecord"), "--snapshot", str(d / "m.json")]


@pytest.fixture
def labels() -> Iterator[list[str]]:
    seen: list[str] = []
    interrupts.set_checkpoint_hook(lambda n, label: seen.append(label))
    yield seen
    interrupts.set_checkpoint_hook(None)


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_sigint_at_every_checkpoint_leaves_nothing_written(
    tmp_path: Path, labels: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    full = tmp_path / "full"
    full.mkdir()
    assert main(_argv(full)) == 0
    assert sorted(_files(full)) == ["m.etrecord", "m.json", "m.ptd", "m.pte"]
    err = capsys.readouterr().err
    assert [line.split()[1] for line in err.splitlines() if line.startswith("wrote ")] == [
        str(full / n) for n in ("m.json", "m.ptd", "m.pte", "m.etrecord")]
    points = list(labels)
    assert len(points) >= 20, points
    assert sum(label.startswith("renaming ") for label in points) == 4
    assert points[-1] == "committed", points  # the one checkpoint after every file is in place
    written = _files(full)
    for mode in ("", ":swallow"):  # a plain SIGINT, and one swallowed as in a weakref callback
        for n in range(1, len(points) + 1):
            d = tmp_path / f"run{n}{mode.replace(':', '_')}"
            d.mkdir()
            (d / "m.pte").write_bytes(OLD)  # a file from before: an interrupted command keeps it
            monkeypatch.setenv(interrupts.TEST_ENV, f"{n}{mode}")
            code = main(_argv(d))
            err = capsys.readouterr().err
            if points[n - 1] == "committed":  # the build is done: Ctrl-C no longer fails it
                assert code == 0, (n, mode, err)
                assert "interrupted" not in err
                assert {k: len(v) for k, v in _files(d).items()} == {k: len(v) for k, v in written.items()}
                continue
            assert code == 130, (n, mode, points[n - 1], err)
            assert err.strip().splitlines()[-1] == "texir lower: interrupted", (n, points[n - 1])
            assert _files(d) == {"m.pte": OLD}, (n, mode, points[n - 1])
    monkeypatch.delenv(interrupts.TEST_ENV)


def test_sigint_in_a_fresh_process_exits_130(tmp_path: Path) -> None:
    env = dict(os.environ, TEXIR_PROGRESS="0", **{interrupts.TEST_ENV: "4"})
    done = subprocess.run([sys.executable, "-m", "texir.cli.main", *_argv(tmp_path)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "texir lower: interrupted" and "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []
    # importing ExecuTorch's XNNPACK partitioner (torchao with it) printed nothing of theirs
    assert done.stderr.strip().splitlines() == ["texir lower: interrupted"], done.stderr


def test_sigint_after_the_outputs_are_in_place_exits_0_in_a_fresh_process(tmp_path: Path) -> None:
    """A Ctrl-C after the command's files are committed, as the program ends (main has returned,
    the interpreter is about to tear down): the build is done, and the exit status says so."""
    env = dict(os.environ, TEXIR_PROGRESS="0", **{interrupts.TEST_ENV: "exiting"})
    done = subprocess.run([sys.executable, "-m", "texir.cli.main", *_argv(tmp_path)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "interrupted" not in done.stderr and "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.etrecord", "m.json", "m.ptd", "m.pte"]


def test_third_party_noise_is_quiet_only_inside_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    from texir.cli.main import _QUIET_LOGGERS, _quiet_third_parties

    loggers = [logging.getLogger(name) for name in _QUIET_LOGGERS]
    before = [logger.level for logger in loggers]
    with _quiet_third_parties():
        for logger in loggers:
            logger.warning("noise")
    assert capsys.readouterr().err == ""
    assert [logger.level for logger in loggers] == before  # the user's process keeps its settings


@pytest.mark.parametrize("flag", ["--etrecord", "-o", "--snapshot"])
def test_an_unwritable_output_is_refused_before_lowering(
    flag: str, tmp_path: Path, labels: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    unwritable = Path("/sys/texir-test.out")  # sysfs takes no new files, even from root
    argv = {"--etrecord": ["-o", str(tmp_path / "m.pte"), "--etrecord", str(unwritable)],
            "-o": ["-o", str(unwritable)], "--snapshot": ["--snapshot", str(unwritable)]}[flag]
    assert main(["lower", MODEL, "--partitioner", "xnnpack", *argv]) == 2
    err = capsys.readouterr().err
    assert f"{flag} {unwritable}: cannot create a file in /sys" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert labels == [] and list(tmp_path.iterdir()) == []  # no phase started: nothing was lowered


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing" / "m.pte", "the directory {d}/missing does not exist"),
        (lambda d: d, "is a directory"),
    ],
)
def test_bad_output_paths_are_one_line(make: object, message: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert callable(make)
    assert main(["lower", MODEL, "-o", str(make(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert message.format(d=tmp_path) in err and len(err.strip().splitlines()) == 1


def test_two_programs_in_one_directory_keep_their_own_weights(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lower", MODEL, "--partitioner", "xnnpack", "--external-data", "-o", str(tmp_path / "a.pte")]) == 0
    assert main(["lower", "texir.models:conv_relu_tan", "--external-data", "-o", str(tmp_path / "b.pte")]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ptd", "a.pte", "b.ptd", "b.pte"]
    from executorch.runtime import Runtime

    import torch

    from texir.models import conv_relu_tan

    module, args = conv_relu_tan()
    with torch.no_grad():
        expected = module(*args)
    for name in ("a", "b"):
        program = Runtime.get().load_program(tmp_path / f"{name}.pte", data_path=str(tmp_path / f"{name}.ptd"))
        (got,) = program.load_method("forward").execute(list(args))
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_a_failing_writer_leaves_nothing_and_its_error_is_the_one_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "a.bin", tmp_path / "b.bin"

    def fail(tmp: Path) -> None:
        tmp.write_bytes(b"partial")
        raise TexirError("the real error")

    real_unlink = os.unlink

    def unlink(path: str | os.PathLike[str]) -> None:
        if str(path).endswith(".tmp"):
            raise OSError(30, "Read-only file system")  # cleanup fails too: it must not hide the error
        real_unlink(path)

    with pytest.raises(TexirError, match="the real error"):
        with Outputs() as outputs:
            outputs.add("-o", first)
            outputs.add("--etrecord", second)
            outputs.write(first, lambda tmp: tmp.write_bytes(b"first"))
            monkeypatch.setattr(os, "unlink", unlink)
            outputs.write(second, fail)
    monkeypatch.undo()
    assert not first.exists() and not second.exists()
    for leftover in tmp_path.iterdir():  # the cleanup could not remove them; a real one does
        leftover.unlink()
    with Outputs() as outputs:
        outputs.add("-o", first)
        outputs.write(first, lambda tmp: tmp.write_bytes(b"first"))
        assert not first.exists()
        assert outputs.commit() == [first]
    assert first.read_bytes() == b"first" and [p.name for p in tmp_path.iterdir()] == ["a.bin"]


def test_a_rename_that_fails_undoes_the_others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = tmp_path / "a.bin", tmp_path / "b.bin"
    first.write_bytes(OLD)
    real_replace = os.replace

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if str(dst) == str(second):
            raise OSError(28, "No space left on device", str(second))
        real_replace(src, dst)

    with pytest.raises(OutputError, match=f"cannot write {second}: No space left on device"):
        with Outputs() as outputs:
            outputs.add("-o", first)
            outputs.add("--snapshot", second)
            outputs.write(first, lambda tmp: tmp.write_bytes(b"new"))
            outputs.write(second, lambda tmp: tmp.write_bytes(b"new"))
            monkeypatch.setattr(os, "replace", replace)
            outputs.commit()
    assert _files(tmp_path) == {"a.bin": OLD}


def test_an_error_after_a_swallowed_ctrl_c_exits_as_interrupted(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import contextlib
    import signal

    import texir.cli.cmd_lower as cmd_lower

    def run(args: object) -> int:
        with contextlib.suppress(KeyboardInterrupt):  # lands where it is swallowed
            signal.raise_signal(signal.SIGINT)
        raise TexirError("a worker process died")  # what --jobs workers killed by the same Ctrl-C give

    monkeypatch.setattr(cmd_lower, "run", run)
    assert main(["lower", MODEL]) == 130
    assert capsys.readouterr().err.strip() == "texir lower: interrupted"

    def finishes(args: object) -> int:
        with contextlib.suppress(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        return 0

    monkeypatch.setattr(cmd_lower, "run", finishes)
    assert main(["lower", MODEL]) == 130  # not 0: the interrupt was noticed after all


def test_a_swallowed_ctrl_c_does_not_stop_code_that_runs_after_the_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The SIGINT a command swallowed is that command's: a checkpoint reached later, outside any
    command (library code in the same process, e.g. the next test), does not raise."""
    import contextlib
    import signal

    import texir.cli.cmd_lower as cmd_lower

    def finishes(args: object) -> int:
        with contextlib.suppress(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        return 0

    monkeypatch.setattr(cmd_lower, "run", finishes)
    assert main(["lower", MODEL]) == 130
    capsys.readouterr()
    interrupts.checkpoint("library code after the command")  # must not raise KeyboardInterrupt
