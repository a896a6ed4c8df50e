"""Every code block in README.md and docs/*.md runs, so examples cannot rot (issue #41).

The rules, per Markdown file:
- ```python blocks run in order in one namespace (a later block may use what an earlier one made),
  in a fresh working directory shared by the file's blocks.
- ```console / ```sh / ```shell / ```bash blocks: each line starting with `$ ` is a command (a line
  ending in `\\` continues it); the lines in between are the output shown and are not compared.
  `texir ...` commands run (in the same directory as the file's Python blocks) and must exit 0, or
  the status a trailing `# -> exit N` names. `make TARGET` must name a Makefile target, and
  `pytest`/`python -m pytest` (the test files they name must exist), `python tools/...` (the script
  must exist) and `git` commands are checked, not run: they would run this suite inside itself, take
  minutes, or change the checkout. Any other command fails the test (teach it here first).
- Any other fence (```text, plain ```) is output or a picture: it must hold no command line, so a
  command cannot hide in a block that is not run."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import texir.backends  # noqa: F401 - registers texir's demo and reference backends before any page
from texir.lowering import backend as backend_registry

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
SHELL = {"console", "sh", "shell", "bash"}
_FENCE = re.compile(r"^```([A-Za-z]*)\s*$")
_COMMANDISH = re.compile(r"^\s*(\$ |(texir|make|python|pip|\.venv/bin/\S+|pytest|git) )")


def _blocks(page: Path) -> list[tuple[str, int, str]]:
    """(language, first line number, text) of each fenced block of `page`."""
    blocks: list[tuple[str, int, str]] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opened = _FENCE.match(lines[i])
        if opened is None:
            i += 1
            continue
        start, body = i + 1, []
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        assert i < len(lines), f"{page.name}:{start}: a code block is never closed"
        blocks.append((opened.group(1).lower(), start + 1, "\n".join(body) + "\n"))
        i += 1
    return blocks


def _commands(text: str) -> list[str]:
    """The `$ ` commands of a console block, continuation lines joined."""
    commands: list[str] = []
    pending: str | None = None
    for line in text.splitlines():
        if pending is not None:
            pending += " " + line.strip()
        elif line.startswith("$ "):
            pending = line[2:].strip()
        else:
            continue
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        commands.append(pending)
        pending = None
    return commands


def _expected_status(command: str) -> tuple[str, int]:
    body, _, comment = command.partition("#")
    wanted = re.match(r"\s*->\s*exit\s+(\d+)", comment)
    return body.strip(), int(wanted.group(1)) if wanted else 0


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return {m.group(1) for m in re.finditer(r"^([A-Za-z][\w-]*):", text, re.MULTILINE)}


def _run_shell(page: Path, line: int, command: str, cwd: Path) -> None:
    body, status = _expected_status(command)
    argv = shlex.split(body)
    while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", argv[0]):  # VAR=value before the command
        argv = argv[1:]
    where = f"{page.name}:{line}: `{body}`"
    if argv[0] in {"python", ".venv/bin/python"} and argv[1:3] == ["-m", "pytest"]:
        argv = ["pytest", *argv[3:]]
    elif argv[0] in {"python", ".venv/bin/python"} and argv[1].startswith("tools/"):
        assert (ROOT / argv[1]).is_file(), f"{where}: {argv[1]} does not exist"
        return
    if argv[0] == "texir":
        env = {**os.environ, "TEXIR_PROGRESS": "0"}
        done = subprocess.run([sys.executable, "-m", "texir.cli.main", *argv[1:]], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == status, f"{where} exited {done.returncode}, not {status}:\n{done.stderr[-3000:]}"
    elif argv[0] == "make":
        assert set(argv[1:]) <= _make_targets(), f"{where}: no such Makefile target"
    elif argv[0] in {"pytest", ".venv/bin/pytest"}:
        for before, arg in zip(argv, argv[1:]):
            if arg.startswith("tests/"):
                assert (ROOT / arg.split("::")[0]).exists(), f"{where}: {arg} does not exist"
            if before == "--pyargs":
                assert importlib.util.find_spec(arg) is not None, f"{where}: no module {arg}"
    elif argv[0] == "git":
        assert argv[1] in {"diff", "status", "log", "clone"}, f"{where}: a git command the docs test does not know"
    else:
        pytest.fail(f"{where}: the docs test does not know how to run `{argv[0]}` (teach tests/test_docs.py)")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_code_block_runs(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TEXIR_PROGRESS", "0")
    # A page registers backends as a user's script would: the registry is given back afterwards
    # (texir.backends is imported above: had a page imported it first, the backends its import
    # registers would go with that page's registry, and later pages would find none)
    monkeypatch.setattr(backend_registry, "_REGISTRY", dict(backend_registry._REGISTRY))
    monkeypatch.setattr(backend_registry, "_IMPLICIT", set(backend_registry._IMPLICIT))
    scope: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    for language, line, text in _blocks(page):
        if language == "python":
            code = compile("\n" * (line - 1) + text, str(page), "exec")
            exec(code, scope)  # noqa: S102  (the page's own example, the point of this test)
        elif language in SHELL:
            commands = _commands(text)
            assert commands, f"{page.name}:{line}: a {language} block with no `$ ` command"
            for command in commands:
                _run_shell(page, line, command, tmp_path)
        else:
            for offset, row in enumerate(text.splitlines()):
                assert not _COMMANDISH.match(row), (
                    f"{page.name}:{line + offset}: a command in a ```{language} block, which does not run; "
                    "put it in a ```console block as `$ command`")


def test_pages_link_to_pages_that_exist() -> None:
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            assert (page.parent / target).resolve().exists(), f"{page.name} links to missing {target}"
