"""Lowering is deterministic: same plan and same bytes whatever PYTHONHASHSEED."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

_SCRIPT = """
import hashlib, torch
import tests.lowering_helpers as h
from tests.test_lowering_scenarios import Cond
from texir.lowering import OpSupportPartitioner, to_backend
from texir.serialize import snapshot
ops = {"aten::add.Tensor", "aten::mul.Tensor", "aten::sin.default"}
for module in (Cond(),):  # top-level and nested partitions
    program = h.export_program(module, (torch.ones(2, 4), torch.ones(2, 4)))
    partitioner = OpSupportPartitioner(h.TEST_BACKEND, ops, tag_constants=True)
    print(partitioner(program).tags)
    lowered = to_backend(program, partitioner)
    print(hashlib.sha256(snapshot.dumps(lowered, format="msgpack", include_data=True)).hexdigest())
"""


def _run(seed: str) -> str:
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONHASHSEED": seed}
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT], cwd=root, env=env, capture_output=True, text=True, timeout=300, check=True
    )
    return result.stdout


def test_same_bytes_across_hash_seeds() -> None:
    first = _run("1")
    second = _run("12345")
    assert first == second
    assert first.count("\n") == 2 and "true_graph_0/" in first


_MODEL = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))


def build():
    return Net(), (torch.rand(1, 3, 8, 8),)


def build_strict():
    from torch.export import export

    module, args = build()
    return export(module, args, strict=True)
'''


_TEXIR = Path(sys.executable).parent / "texir"  # the installed entry point, as a user runs it


def _texir(args: list[str], cwd: Path, seed: str) -> None:
    env = {**os.environ, "PYTHONHASHSEED": seed, "TEXIR_PROGRESS": "0"}
    subprocess.run(
        [str(_TEXIR), *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=300, check=True,
    )


def test_demo_outputs_are_byte_identical_across_runs(tmp_path: Path) -> None:
    """`texir demo` exports with strict=True, whose nn_module_stack keys are id()s: the snapshot
    and the delegated .pte must not change from run to run."""
    for run, seed in (("d1", "1"), ("d2", "999")):
        _texir(["demo", "--out-dir", str(tmp_path / run)], tmp_path, seed)
    for name in ("demo.pte", "demo.snapshot.json"):
        assert (tmp_path / "d1" / name).read_bytes() == (tmp_path / "d2" / name).read_bytes(), name


_COMMANDS = """
import json, sys
from texir.cli.main import main
for argv in json.loads(sys.argv[1]):
    if main(argv) != 0:
        sys.exit(f"texir {' '.join(argv)} failed")
"""


def _texir_commands(commands: list[list[str]], cwd: Path, seed: str) -> None:
    """Several `texir` commands in one interpreter (torch loads once), as `texir` would run each."""
    env = {**os.environ, "PYTHONHASHSEED": seed, "TEXIR_PROGRESS": "0"}
    subprocess.run(
        [sys.executable, "-c", _COMMANDS, json.dumps(commands)], cwd=cwd, env=env, capture_output=True,
        text=True, timeout=300, check=True,
    )


def test_same_model_file_in_two_directories_gives_the_same_bytes(tmp_path: Path) -> None:
    """Moving the model file (and the working directory) changes no byte: no machine paths in
    snapshots or delegate blobs; strict and non-strict export alike."""
    outputs: dict[str, list[bytes]] = {}
    functions = ("build", "build_strict")
    for where, seed in (("a/deeper", "7"), ("b", "31337")):
        home = tmp_path / where
        home.mkdir(parents=True)
        (home / "net.py").write_text(_MODEL, encoding="utf-8")
        commands = []
        for fn in functions:
            commands.append(["lower", f"net.py:{fn}", "--backend", "texir-reference", "--ops", "aten::relu.default",
                             "-o", f"{fn}.pte", "--snapshot", f"{fn}.json"])
            commands.append(["snapshot", f"net.py:{fn}", "-o", f"{fn}.plain.json"])
        _texir_commands(commands, home, seed)
        for fn in functions:
            outputs.setdefault(fn, []).append(
                b"\0".join((home / f"{fn}{ext}").read_bytes() for ext in (".pte", ".json", ".plain.json"))
            )
    for fn, (first, second) in outputs.items():
        assert first == second, fn
    assert b"net.py" not in outputs["build"][0]  # no stack trace kept a path to the model


def test_strict_export_converts_to_the_same_program_every_time() -> None:
    import torch

    from texir.adapters import from_exported_program
    from texir.models import conv_relu_tan
    from texir.serialize import snapshot

    snaps = set()
    for _ in range(2):
        module, args = conv_relu_tan()  # a new module object: new id()s in nn_module_stack
        ep = torch.export.export(module, args, strict=True)
        program = from_exported_program(ep, decompose=True)
        frames = {f.key for p in program.graph.entries() if p[2] for f in p[2].nn_module_stack}
        assert frames and not any(k.isdigit() for k in frames), frames
        snaps.add(snapshot.dumps(program, format="msgpack", include_data=True))
    assert len(snaps) == 1
