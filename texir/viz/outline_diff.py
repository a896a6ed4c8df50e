"""Diff of outline texts: lines nested by indentation, as `texir.viz.pte_view` writes a `.pte`
program. Lines are matched by key (the text before " : ", ": ", " -> " or "="); index-numbered
tables ("[3] ...") are aligned by content, so one inserted entry is one addition. Programs are not
diffed here: `texir.viz.diff` compares them as structs."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable

__all__ = ["diff_outlines"]

Report = Callable[[str, str, str, "str | None", "str | None"], None]
"""report(scope, kind, key, a, b): one difference."""


class _Line:
    __slots__ = ("text", "children")

    def __init__(self, text: str) -> None:
        self.text = text
        self.children: list[_Line] = []


def _outline(text: str) -> list[_Line]:
    root = _Line("")
    stack: list[tuple[int, _Line]] = [(-1, root)]
    for raw in text.splitlines():
        if not raw.strip():
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        while stack[-1][0] >= indent:
            stack.pop()
        line = _Line(raw.strip())
        stack[-1][1].children.append(line)
        stack.append((indent, line))
    return root.children


def _key(text: str) -> str:
    if text.endswith(":"):
        return text
    m = re.match(r"^(\[[^\]]*\])", text)
    if m:
        return m.group(1)
    best = len(text)
    for sep in (" : ", ": ", " -> ", "="):
        pos = text.find(sep)
        if 0 < pos < best:
            best = pos
    return text[:best]


def _keyed(lines: list[_Line]) -> dict[str, _Line]:
    out: dict[str, _Line] = {}
    for line in lines:
        key = _key(line.text)
        unique, n = key, 1
        while unique in out:
            n += 1
            unique = f"{key} #{n}"
        out[unique] = line
    return out


def _summary(line: _Line) -> str:
    """A section's header plus its first line."""
    if line.children and not line.children[0].children:
        return f"{line.text} {line.children[0].text}"
    return line.text


def _join(scope: str, key: str) -> str:
    key = key.rstrip(":").removesuffix("()")
    return f"{scope} > {key}" if scope else key


_INDEX_RE = re.compile(r"^\[(\d+)\] ")


def _diff_indexed(scope: str, a: list[_Line], b: list[_Line], report: Report) -> None:
    ta = [_INDEX_RE.sub("", x.text) for x in a]
    tb = [_INDEX_RE.sub("", x.text) for x in b]
    matcher = difflib.SequenceMatcher(None, ta, tb, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        n = i2 - i1 if tag == "equal" else min(i2 - i1, j2 - j1)
        for k in range(n):
            la, lb = a[i1 + k], b[j1 + k]
            ka, kb = _key(la.text), _key(lb.text)
            if tag != "equal":
                report(scope, "changed", ka if ka == kb else f"{ka} -> {kb}", la.text, lb.text)
            if la.children or lb.children:
                _diff_level(_join(scope, kb), la.children, lb.children, report)
        if tag == "equal":
            continue
        for k in range(i1 + n, i2):
            report(scope, "removed", _key(a[k].text), _summary(a[k]), None)
        for k in range(j1 + n, j2):
            report(scope, "added", _key(b[k].text), None, _summary(b[k]))


def _diff_level(scope: str, a: list[_Line], b: list[_Line], report: Report) -> None:
    if (a or b) and all(_INDEX_RE.match(x.text) for x in (*a, *b)):
        _diff_indexed(scope, a, b, report)
        return
    ka, kb = _keyed(a), _keyed(b)
    nested: list[tuple[str, _Line, _Line]] = []
    for key in [*ka, *(k for k in kb if k not in ka)]:
        la, lb = ka.get(key), kb.get(key)
        if la is not None and lb is not None:
            if la.text != lb.text:
                report(scope, "changed", key, la.text, lb.text)
            if la.children or lb.children:
                nested.append((key, la, lb))
        elif la is not None:
            report(scope, "removed", key, _summary(la), None)
        elif lb is not None:
            report(scope, "added", key, None, _summary(lb))
    for key, la, lb in nested:  # this level's own lines first, then the sections below it
        _diff_level(_join(scope, key), la.children, lb.children, report)


def diff_outlines(a: str, b: str, report: Report) -> None:
    """Report every difference between outline texts `a` and `b`."""
    if a != b:
        _diff_level("", _outline(a), _outline(b), report)
