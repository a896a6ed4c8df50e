"""texir against ExecuTorch 1.5.1's `to_edge` over torch's operator database (OpInfo): every op
with float32 CPU samples that export, its first sample as a tiny module (`tests/opinfo_diff.py`).

For each: texir's decomposed edge program (`lower(ep, [])`) has the same operator multiset as
ExecuTorch's edge program, or the op is in KNOWN_DIFFERENCES with the reason; texir refuses
exactly what `to_edge` refuses; no .pte texir writes aborts the runtime; where ExecuTorch's .pte
runs and agrees with eager, texir's does too. `make test` runs a seeded sample of SAMPLE ops;
`make fuzz` (TEXIR_OPINFO_ALL=1) runs them all."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.opinfo_diff import cases, differential

SAMPLE = 16
SEED = 32

KNOWN_DIFFERENCES: dict[str, str] = json.loads(
    (Path(__file__).parent / "data" / "opinfo_known_differences.json").read_text()
)["differences"]
"""Op (OpInfo name) -> why texir deliberately differs from ExecuTorch there."""


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    everything = os.environ.get("TEXIR_OPINFO_ALL") == "1"
    selected = cases(1, sample=None if everything else SAMPLE, seed=SEED)
    assert selected, "torch's OpInfo database gave no float32 CPU samples"
    return differential(selected, str(tmp_path_factory.mktemp("opinfo")))


def _op(key: str) -> str:
    return key.split("#", 1)[0]


def test_texir_refuses_what_to_edge_refuses(report: dict[str, Any]) -> None:
    wrong = {k: e.get("detail", "") for k, e in report.items()
             if e["status"] in ("texir-only", "texir-refuses") and _op(k) not in KNOWN_DIFFERENCES}
    assert not wrong, wrong


def test_same_operators_as_executorch(report: dict[str, Any]) -> None:
    compared = {k: e for k, e in report.items() if e["status"] == "compared"}
    differ = {k: (e["only_texir"], e["only_executorch"]) for k, e in compared.items()
              if "only_texir" in e and _op(k) not in KNOWN_DIFFERENCES}
    assert not differ, differ


def test_no_texir_pte_aborts_the_runtime(report: dict[str, Any]) -> None:
    aborted = [k for k, e in report.items() if e["texir_run"] == "abort"]
    assert not aborted, aborted


def test_texir_runs_where_executorch_runs(report: dict[str, Any]) -> None:
    behind = {k: (e["texir_run"], e.get("detail", "")) for k, e in report.items()
              if e["executorch_run"] == "agrees" and e["texir_run"] != "agrees" and _op(k) not in KNOWN_DIFFERENCES}
    assert not behind, behind


def test_known_differences_are_documented() -> None:
    assert all(isinstance(reason, str) and len(reason) > 20 for reason in KNOWN_DIFFERENCES.values())
