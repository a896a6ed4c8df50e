"""texir's layers are one-way: every import in texir/ (module level, inside functions, under
TYPE_CHECKING, and `importlib.import_module("texir...")` calls) goes to the same layer or a lower one.

    base (errors, _io) < ir < serialize < lowering, edge < emit < backends < adapters < executorch
    < orchestrate < viz, cli, testing

Below the adapters (ir, serialize, lowering, edge, emit, backends) nothing imports torch, wherever
the import stands (tests/test_torch_free.py runs them without it); only texir/executorch may import
executorch; texir/ir imports neither flatbuffers nor sympy.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "texir"

# Longest prefix wins. Same rank: may import each other.
LAYERS: dict[str, int] = {
    "texir": 0,  # the package itself: texir/__init__.py, errors.py, _io.py
    "texir.errors": 0,
    "texir._io": 0,
    "texir.ir": 1,
    "texir.serialize": 2,
    "texir.lowering": 3,  # a texir Program partitioned and delegated (lower_decomposed); no torch
    "texir.edge": 3,
    "texir.emit": 4,
    "texir.backends": 5,  # texir's own backends (demo, reference, native XNNPACK): pure
    "texir.adapters": 6,  # torch <-> IR, decomposition
    "texir.models": 6,  # the demo model: a torch module
    "texir.executorch": 7,  # the ExecuTorch bridge: its partitioners, backends, runtime, ETRecord
    "texir.orchestrate": 8,  # `lower` from an ExportedProgram: decompose, then lowering
    "texir.viz": 9,
    "texir.cli": 9,
    "texir.testing": 9,
}
NAMES = {0: "base", 1: "ir", 2: "serialize", 3: "lowering/edge", 4: "emit", 5: "backends", 6: "adapters",
         7: "executorch", 8: "orchestrate", 9: "viz/cli/testing"}


def layer_of(module: str) -> int:
    best = ""
    for prefix in LAYERS:
        if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
            best = prefix
    if not best:
        raise KeyError(module)
    return LAYERS[best]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, package: str | None = None) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import in the file, wherever it stands."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    if package is None:
        package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield node.lineno, target
            for alias in node.names:  # `from texir import lowering` imports texir.lowering
                if target.startswith("texir"):
                    yield node.lineno, f"{target}.{alias.name}"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Attribute, ast.Name))
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def _texir_module_exists(name: str) -> bool:
    rel = Path(*name.split("."))
    return (ROOT.parent / rel).with_suffix(".py").exists() or (ROOT.parent / rel / "__init__.py").exists()


SOURCES = sorted(ROOT.rglob("*.py"))


def test_every_module_has_a_layer() -> None:
    for path in SOURCES:
        layer_of(module_name(path))


def test_imports_never_go_up_a_layer() -> None:
    problems = []
    for path in SOURCES:
        here = module_name(path)
        mine = layer_of(here)
        for line, target in imports(path):
            if not target.startswith("texir") or not _texir_module_exists(target):
                continue  # `from texir.ir import Node` yields texir.ir.Node too: only modules count
            theirs = layer_of(target)
            if theirs > mine:
                problems.append(
                    f"{path.relative_to(ROOT.parent)}:{line}: {here} ({NAMES[mine]}) imports {target} ({NAMES[theirs]})"
                )
    assert not problems, "imports that run up a layer:\n" + "\n".join(problems)


def test_third_party_boundaries() -> None:
    problems = []
    for path in SOURCES:
        here = module_name(path)
        for line, target in imports(path):
            top = target.split(".")[0]
            if top == "executorch" and not here.startswith("texir.executorch"):
                problems.append(f"{path.relative_to(ROOT.parent)}:{line}: imports {target} (only texir.executorch may)")
            if top in ("torch", "flatbuffers", "sympy") and here.startswith("texir.ir"):
                problems.append(f"{path.relative_to(ROOT.parent)}:{line}: the IR layer imports {target}")
            if top == "torch" and layer_of(here) < LAYERS["texir.adapters"]:
                problems.append(f"{path.relative_to(ROOT.parent)}:{line}: {here} ({NAMES[layer_of(here)]}, below the adapters) imports {target}")
    assert not problems, "\n".join(problems)


def test_modules_stay_small() -> None:
    sizes = {str(p.relative_to(ROOT.parent)): len(p.read_text(encoding="utf-8").splitlines()) for p in SOURCES}
    big = {k: v for k, v in sizes.items() if v > 610}
    assert not big, f"modules over ~600 lines (split them): {big}"


@pytest.mark.parametrize(
    ("source", "bad"),
    [
        ("def f():\n    from texir.lowering import to_backend\n", "texir.lowering"),
        ("import importlib\nimportlib.import_module('texir.emit')\n", "texir.emit"),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from texir.cli import main\n", "texir.cli"),
    ],
)
def test_the_walker_sees_hidden_imports(tmp_path: Path, source: str, bad: str) -> None:
    path = tmp_path / "probe.py"
    path.write_text(source, encoding="utf-8")
    found = [t for _, t in imports(path, package="texir.serialize")]
    assert any(t == bad or t.startswith(bad + ".") for t in found), found
