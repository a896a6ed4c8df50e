"""texir's layers are one-way: every import in texir/ (module level, inside functions, under
TYPE_CHECKING, and `importlib.import_module("texir...")` calls) goes to the same layer or a lower one.

    base (errors, _io) < ir < serialize < lowering, edge < emit < backends < adapters < executorch
    < orchestrate < viz, cli, testing, compat

Below the adapters (ir, serialize, lowering, edge, emit, backends) nothing imports torch, wherever
the import stands (tests/test_torch_free.py runs them without it); only texir/executorch and texir/compat may import
executorch; texir/ir imports neither flatbuffers nor sympy.

Imports stand at module level: one inside a function carries a comment saying why, on its line or
the line above (an optional extra, a slow import only some commands need). No module is over 500
lines.
No two texir modules import each other, directly or round a circle (TYPE_CHECKING imports included).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "texir"

# Longest prefix wins. Same rank: may import each other.
LAYERS: dict[str, int] = {
    "texir": 0,  # the package itself: texir/__init__.py, errors.py, _io.py
    "texir.errors": 0,
    "texir._io": 0,
    "texir._torchvision": 6,  # imports torch inside the hook only, when torchvision (which loads torch) imports
    "texir.ir": 1,
    "texir.serialize": 2,
    "texir.lowering": 3,  # a texir Program partitioned and delegated (lower_decomposed); no torch
    "texir.edge": 3,
    "texir.emit": 4,
    "texir.backends": 5,  # texir's own backends (demo, reference, native XNNPACK): pure
    "texir.adapters": 6,  # torch <-> IR, decomposition
    "texir.models": 6,  # the demo model: a torch module
    "texir.executorch": 7,  # the ExecuTorch bridge: its partitioners, backends, runtime, ETRecord
    "texir.orchestrate": 8,  # `texir.lower` from an ExportedProgram: decompose, then lowering
    "texir.recipes": 8,  # quantization recipes (pt2e, torchao) on an eager module, then `texir.lower`
    "texir.compat": 9,  # ExecuTorch's public lowering API over texir.lower (bridge-like: may import executorch)
    "texir.viz": 9,
    "texir.cli": 9,
    "texir.testing": 9,
}
EXECUTORCH_IMPORTERS = ("texir.executorch", "texir.compat")
"""The bridge, and the facade over texir.lower that speaks ExecuTorch's API (it needs orchestrate,
so it sits above it, with viz/cli)."""
LAZY_EXPORTS = {("texir", "texir.orchestrate"), ("texir", "texir._torchvision")}
"""(module, import) allowed to run up: `texir.lower` is `texir.orchestrate.lower`, imported on first use;
`import texir` arms texir._torchvision's import hook, which loads torch only when torchvision imports."""
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
            if theirs > mine and (here, target) not in LAZY_EXPORTS:
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
            if top == "executorch" and not here.startswith(EXECUTORCH_IMPORTERS):
                problems.append(
                    f"{path.relative_to(ROOT.parent)}:{line}: imports {target} (only {', '.join(EXECUTORCH_IMPORTERS)} may)"
                )
            if top in ("torch", "flatbuffers", "sympy") and here.startswith("texir.ir"):
                problems.append(f"{path.relative_to(ROOT.parent)}:{line}: the IR layer imports {target}")
            if top == "torch" and layer_of(here) < LAYERS["texir.adapters"]:
                problems.append(f"{path.relative_to(ROOT.parent)}:{line}: {here} ({NAMES[layer_of(here)]}, below the adapters) imports {target}")
    assert not problems, "\n".join(problems)


MAX_LINES = 500

# Files other branches were rewriting when these two gates went in (lowering/, executorch's
# partitioner, backend and edge_program, cli/cmd_lower, backends/xnnpack/): exempt from the gates
# below until those branches land. Empty it; never add to it.
NOT_YET_CHECKED: frozenset[str] = frozenset()


def test_modules_stay_small() -> None:
    sizes = {str(p.relative_to(ROOT.parent)): len(p.read_text(encoding="utf-8").splitlines()) for p in SOURCES}
    big = sorted(f"{k}: {v} lines" for k, v in sizes.items() if v > MAX_LINES and k not in NOT_YET_CHECKED)
    assert not big, f"modules over {MAX_LINES} lines (split them by concern):\n" + "\n".join(big)


def _comments(source: str) -> dict[int, str]:
    """line -> the text of the comment on it (without the '#')."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return {tok.start[0]: tok.string.lstrip("#").strip() for tok in tokens if tok.type == tokenize.COMMENT}


_MARKERS = re.compile(r"noqa(:\s*[A-Z]+[0-9]+(\s*,\s*[A-Z]+[0-9]+)*)?|type:\s*ignore(\[[^\]]*\])?|pragma:[^#]*")


def _gives_a_reason(comment: str | None) -> bool:
    """A comment of a few words once linter markers (`noqa`, `type: ignore[...]`, `pragma: ...`) are
    dropped: `# noqa: F401` alone says nothing about why the import is where it is."""
    if comment is None:
        return False
    words = re.findall(r"[A-Za-z][A-Za-z'-]*", _MARKERS.sub(" ", comment))
    return len(words) >= 3


def unexplained_local_imports(path: Path) -> Iterator[int]:
    """Lines of imports inside a function with no reason given. The reason is a comment on the import's
    own lines or on the line directly above it; imports that follow each other share the comment above
    the first of them."""
    source = path.read_text(encoding="utf-8")
    comments = _comments(source)

    def explained(stmt: ast.stmt, first_of_run: ast.stmt) -> bool:
        own = range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)
        return any(_gives_a_reason(comments.get(line)) for line in own) or _gives_a_reason(
            comments.get(first_of_run.lineno - 1)
        )

    def visit(node: ast.AST, in_function: bool) -> Iterator[int]:
        for field in ("body", "orelse", "finalbody"):
            statements = getattr(node, field, None)
            if not isinstance(statements, list):
                continue
            run_start: ast.stmt | None = None
            for child in statements:
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    run_start = run_start or child
                    if in_function and not explained(child, run_start):
                        yield child.lineno
                else:
                    run_start = None
                    yield from visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))
        for part in [*getattr(node, "handlers", ()), *getattr(node, "cases", ())]:  # except/case bodies
            yield from visit(part, in_function)

    yield from visit(ast.parse(source, filename=str(path)), False)


def test_function_local_imports_say_why() -> None:
    problems = [
        f"{path.relative_to(ROOT.parent)}:{line}"
        for path in SOURCES
        if str(path.relative_to(ROOT.parent)) not in NOT_YET_CHECKED
        for line in unexplained_local_imports(path)
    ]
    assert not problems, (
        "imports inside a function with no comment saying why (move them to module level, or say why on the"
        " import's line or the line above: `# torch loads in ~2 s: only the commands that need it pay`):\n"
        + "\n".join(problems)
    )


def test_the_exemptions_name_existing_files() -> None:
    assert all((ROOT.parent / name).is_file() for name in NOT_YET_CHECKED), sorted(NOT_YET_CHECKED)


@pytest.mark.parametrize(
    ("source", "unexplained"),
    [
        ("import os\ndef f():\n    import json\n", [3]),
        ("def f():\n    import json  # noqa: F401\n", [2]),  # a linter marker is no reason
        ("def f():\n    import json  # why\n", [2]),  # nor is one word
        ("def f():\n    import json  # type: ignore[import-untyped]\n", [2]),
        ("def f():\n    # torch loads in seconds: only this command pays\n    import torch\n", []),
        ("def f():\n    import torch  # loads in seconds, imported on use\n", []),
        ("def f():\n    import x  # noqa: F401  (registers the kernels on import)\n", []),
        # a comment above a run of imports covers the run; a blank line does not end it
        ("def f():\n    # optional extra: imported on use\n    import a\n\n    from b import c\n    x = 1\n"
         "    import d\n", [7]),
        ("def f():\n    # a comment two lines above\n    x = 1\n    import json\n", [4]),
        ("class C:\n    def m(self):\n        if self:\n            import json\n", [4]),
        ("def f():\n    try:\n        import json\n    except ImportError:\n        import simplejson\n", [3, 5]),
        ("def f():\n    def g():\n        from a import (\n            b,  # the reason can sit on any of its lines\n"
         "        )\n", []),
        ("import os\nif os:\n    import json\n", []),  # module level, not in a function
    ],
)
def test_the_local_import_check(tmp_path: Path, source: str, unexplained: list[int]) -> None:
    path = tmp_path / "probe.py"
    path.write_text(source, encoding="utf-8")
    assert list(unexplained_local_imports(path)) == unexplained


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


def _import_graph() -> dict[str, set[str]]:
    """texir module -> the texir modules it imports, wherever the import stands (TYPE_CHECKING too).
    An import of an enclosing package is left out: Python runs a package before its modules anyway."""
    graph: dict[str, set[str]] = {}
    for path in SOURCES:
        here = module_name(path)
        graph[here] = {
            target
            for _, target in imports(path)
            if target.startswith("texir") and _texir_module_exists(target)
            and target != here and not here.startswith(target + ".")
        }
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle in the graph (its modules, first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target):], target]
            if target not in state and (found := visit(target)) is not None:
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)) is not None:
            return found
    return None


def test_find_cycle_finds_a_circle() -> None:
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_circle_in_texir() -> None:
    cycle = _find_cycle(_import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or ())


def test_records_are_msgspec_or_pydantic() -> None:
    """texir's records are msgspec Structs and its user-facing options pydantic models: no third
    record library (`dataclasses.replace` on torch's own dataclasses is fine)."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for dec in node.decorator_list:
                    target = dec.func if isinstance(dec, ast.Call) else dec
                    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
                    if name == "dataclass":
                        found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {node.name}")
    assert not found, f"dataclass records (make them msgspec Structs or pydantic models): {found}"
