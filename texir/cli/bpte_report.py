"""`texir inspect` of a `.bpte`: its program (as for a `.pte`) and its cases, one case in full on request."""

from __future__ import annotations

import struct
from typing import Any

from texir.cli.pte_report import format_report, inspect_pte
from texir.errors import UsageError
from texir.serialize import bpte
from texir.serialize.bpte.check import dtype_name

__all__ = ["format_bpte_report", "inspect_bpte"]

JsonDict = dict[str, Any]

_ELEMENT_FORMAT: dict[bpte.ScalarType, str] = {
    bpte.ScalarType.BYTE: "B", bpte.ScalarType.CHAR: "b", bpte.ScalarType.SHORT: "h",
    bpte.ScalarType.INT: "i", bpte.ScalarType.LONG: "q",
    bpte.ScalarType.FLOAT: "f", bpte.ScalarType.DOUBLE: "d", bpte.ScalarType.BOOL: "?",
}
"""memoryview formats of the dtypes whose elements `--case` prints (others: bytes only)."""
_SHOWN = 16
"""Elements of a tensor `--case` prints (the first ones, in memory order)."""


def _value(v: bpte.Value, *, elements: bool) -> JsonDict:
    val = v.val
    if isinstance(val, bpte.Tensor):
        out: JsonDict = {"kind": "Tensor", "dtype": dtype_name(val.scalar_type), "shape": list(val.sizes),
                         "nbytes": val.data.nbytes, "sha256": val.data.digest()[:16]}
        if tuple(val.dim_order) != tuple(range(len(val.sizes))):
            out["dim_order"] = list(val.dim_order)
        fmt = _ELEMENT_FORMAT.get(val.scalar_type)
        if elements and fmt is not None:
            numel = val.data.nbytes // struct.calcsize(fmt)
            items = struct.unpack_from(f"<{min(numel, _SHOWN)}{fmt}", val.data.view(), 0)
            out["elements"] = [x if isinstance(x, bool | int) else f"{x:.7g}" for x in items]
            out["numel"] = numel
        return out
    if isinstance(val, bpte.Int):
        return {"kind": "Int", "value": val.int_val}
    if isinstance(val, bpte.Bool):
        return {"kind": "Bool", "value": val.bool_val}
    return {"kind": "Double", "value": repr(val.double_val)}


def _select(bundle: bpte.BundledProgram, spec: str) -> tuple[str, int]:
    """`--case [METHOD:]K` -> (method, case index), or a one-line UsageError."""
    method, sep, index = spec.rpartition(":")
    names = [s.method_name for s in bundle.method_test_suites]
    if not sep:
        if len(names) != 1:
            raise UsageError(f"--case {spec}: the file has cases for {', '.join(names) or 'no method'}; write METHOD:K")
        method = names[0]
    try:
        k = int(index)
    except ValueError:
        raise UsageError(f"--case {spec}: K must be a case number, as in --case forward:0") from None
    suites = {s.method_name: s for s in bundle.method_test_suites}
    if method not in suites:
        raise UsageError(f"--case {spec}: no cases for method {method!r}; the file has cases for {', '.join(names) or 'none'}")
    count = len(suites[method].test_cases)
    if not 0 <= k < count:
        span = f"0..{count - 1}" if count else "none"
        raise UsageError(f"--case {spec}: method {method!r} has {count} cases ({span}); case {k} is out of range")
    return method, k


def inspect_bpte(data: bytes, *, brief: bool = False, case: str | None = None) -> JsonDict:
    """The report `texir inspect --json` prints for a `.bpte` (deterministic, JSON-serialisable)."""
    bundle = bpte.loads(data)
    chosen = _select(bundle, case) if case is not None else None
    methods = []
    for suite in bundle.method_test_suites:
        cases = []
        for k, c in enumerate(suite.test_cases):
            full = chosen == (suite.method_name, k)
            cases.append({"index": k, "inputs": [_value(v, elements=full) for v in c.inputs],
                          "expected_outputs": [_value(v, elements=full) for v in c.expected_outputs]})
        methods.append({"method": suite.method_name, "cases": cases})
    report: JsonDict = {
        "file": {"size": len(data), "identifier": "BP08", "version": bundle.version},
        "program": inspect_pte(bundle.program.tobytes(), brief=brief),
        "cases": methods,
    }
    if chosen is not None:
        report["case"] = {"method": chosen[0], "index": chosen[1]}
    return report


def _fmt(v: JsonDict) -> str:
    if v["kind"] == "Tensor":
        return f"{v['dtype']}[{', '.join(str(d) for d in v['shape'])}]"
    return f"{v['kind']} {v['value']}"


def _fmt_full(v: JsonDict) -> str:
    if v["kind"] != "Tensor":
        return _fmt(v)
    text = f"{_fmt(v)} {v['nbytes']} bytes sha256:{v['sha256']}"
    if "elements" in v:
        more = ", ..." if v["numel"] > len(v["elements"]) else ""
        text += f" [{', '.join(str(x) for x in v['elements'])}{more}]"
    return text


def format_bpte_report(r: JsonDict) -> str:
    """The text view of `inspect_bpte`'s report: the program's view, then the cases."""
    lines = [f"bundled program: {r['file']['size']} bytes, BP08, version {r['file']['version']}; "
             f"the program ({r['program']['file']['size']} bytes):", ""]
    lines.append(format_report(r["program"]).rstrip("\n"))
    lines.append("")
    total = sum(len(m["cases"]) for m in r["cases"])
    lines.append(f"cases ({total}):")
    chosen = r.get("case")
    for m in r["cases"]:
        for c in m["cases"]:
            ins = "; ".join(_fmt(v) for v in c["inputs"]) or "-"
            outs = "; ".join(_fmt(v) for v in c["expected_outputs"]) or "- (nothing to compare)"
            lines.append(f"  {m['method']}[{c['index']}]  inputs: {ins}  expected: {outs}")
            if chosen == {"method": m["method"], "index": c["index"]}:
                lines.extend(f"    input [{i}] {_fmt_full(v)}" for i, v in enumerate(c["inputs"]))
                lines.extend(f"    expected [{i}] {_fmt_full(v)}" for i, v in enumerate(c["expected_outputs"]))
    return "\n".join(lines) + "\n"
