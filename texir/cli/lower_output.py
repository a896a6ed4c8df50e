"""What `texir lower` prints: the lowering report (`texir.lowering.report.LowerReport`) as a table,
the nodes left undelegated and, with --explain, every node's fate; or all of it as JSON."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TextIO

import msgspec

from texir.lowering.report import LowerReport

__all__ = ["explain_rows", "phase_line", "print_json", "print_report"]


def explain_rows(report: LowerReport) -> list[dict[str, str]]:
    """One entry per operator node: delegated (to which backend, as which module), or not and why."""
    rows: list[dict[str, str]] = []
    for d in report.delegates:
        for name, target in zip(d.nodes, d.targets):
            key = f"{d.graph}/{name}" if d.graph else name
            rows.append({
                "node": key, "target": target or "?", "status": "delegated",
                "reason": f"delegated to {d.backend} as {d.tag} ({d.module})",
            })
    for t in report.turned_down:
        rows.append({
            "node": t.node, "target": t.target, "status": "decomposed",
            "reason": f"kept from decomposition, but {t.partitioner}'s node filter turned it down: decomposed",
        })
    for u in report.undelegated:
        rows.append({"node": u.node, "target": u.target, "status": "not delegated",
                     "reason": f"{u.detail} ({u.reason})"})
    return rows


def _table(out: TextIO, table: Sequence[Sequence[str]]) -> None:
    """Rows of cells, left-aligned in columns two spaces apart (the first row is the header)."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() + "\n")


def print_report(out: TextIO, report: LowerReport, explained: Sequence[dict[str, str]] | None) -> None:
    """The delegates in call order, then what stayed undelegated (grouped by op), then --explain."""
    if not report.delegates:
        out.write("no delegates (nothing delegated)\n")
    else:
        header = ("module", "backend", "tag", "nodes", "inputs", "outputs", "consumed", "blob bytes",
                  "named data", "cache", "seconds")
        rows = [header] + [
            (
                d.module, d.backend, f"{d.graph}/{d.tag}" if d.graph else d.tag, str(len(d.nodes)),
                str(len(d.inputs)), str(len(d.outputs)), str(len(d.consumed)), f"{d.blob_bytes:,}",
                f"{d.named_data} ({d.named_data_bytes:,} B)" if d.named_data else "0",
                "hit" if d.cache_hit else "miss", f"{d.seconds:.2f}",
            )
            for d in report.delegates
        ]
        _table(out, rows)
    if report.undelegated:
        by_op: dict[tuple[str, str], list[str]] = {}
        for u in report.undelegated:
            by_op.setdefault((u.target, u.reason), []).append(u.node)
        n = len(report.undelegated)
        out.write(f"\nnot delegated: {n} node{'s' if n != 1 else ''} (the runtime's kernels run them; "
                  "reason: turned_down by a partitioner that supports the op, or no_partitioner supports it; "
                  "--explain says why)\n")
        _table(out, [("op", "nodes", "reason", "names")] + [
            (op, str(len(names)), reason, ", ".join(names[:4]) + (", ..." if len(names) > 4 else ""))
            for (op, reason), names in by_op.items()
        ])
    elif report.delegates:
        out.write("\nnot delegated: none\n")
    if report.turned_down:
        out.write(f"\ndecomposed after the partitioner's node filter turned them down: "
                  f"{', '.join(f'{t.node} ({t.target})' for t in report.turned_down)}\n")
    for r in report.retraced:
        out.write(f"\ntorch's whole-program retrace ({r.step}): {r.reason}\n")
    if report.phases:
        out.write("\n" + phase_line(report) + "\n")
    if explained is not None:
        out.write("\n")
        for e in explained:
            out.write(f"{e['node']} ({e['target']}): {e['status']}: {e['reason']}\n")


def phase_line(report: LowerReport) -> str:
    """The report's phases on one line: 'seconds: import 0.41, decompose 1.20, ..., total 3.10'."""
    return "seconds: " + ", ".join(f"{p.name} {p.seconds:.2f}" for p in report.phases)


def print_json(out: TextIO, report: LowerReport, explained: Sequence[dict[str, str]] | None,
               written: Sequence[tuple[str, str, int]]) -> None:
    """The report as JSON (its fields at the top level), with --explain's rows and the files written
    ({"path", "kind", "bytes"})."""
    payload: dict[str, Any] = msgspec.to_builtins(report)
    if explained is not None:
        payload["explain"] = list(explained)
    payload["written"] = [{"path": p, "kind": k, "bytes": b} for p, k, b in written]
    pte = [p for p, k, _ in written if k == ".pte"]
    if pte:
        payload["pte"] = pte[0]
    out.write(msgspec.json.encode(payload).decode() + "\n")
