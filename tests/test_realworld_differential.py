"""texir against ExecuTorch 1.5.1's `to_edge` over real-world models (tests/realworld_models.py:
torchvision, transformers and timm architectures and recurrent models from small configs with random
weights).

For each: torch's export takes it; texir's decomposed edge program (`lower(ep, [])`) has the same
operator multiset as ExecuTorch's `to_edge(ep).exported_program()`, or the model is in
KNOWN_DIFFERENCES with the reason; texir converts what ExecuTorch converts; no .pte texir writes
aborts the runtime; where ExecuTorch's .pte runs and agrees with eager, texir's does too. The
comparison is tests/opinfo_diff.py's. `make test` runs the SAMPLE (three of the quickest models);
`make fuzz` (TEXIR_REALWORLD_ALL=1) runs them all."""

from __future__ import annotations

import collections
import json
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.opinfo_diff import Outcome, compare_exported, run_outcomes
from tests.realworld_models import REALWORLD_MODELS

SAMPLE = ("squeezenet1_1", "timm_test_resnet", "kws_lstm")
"""Three quick models (a few seconds each: torchvision, timm, an LSTM) for `make test`; the
transformers family is compared in full under `make fuzz`."""

TOLERANCE = 1e-3
"""Absolute and relative, against eager: deep float32 networks accumulate more rounding than one op."""

KNOWN_DIFFERENCES: dict[str, dict[str, str]] = json.loads(
    (Path(__file__).parent / "data" / "realworld_known_differences.json").read_text()
)["differences"]
"""Model name -> {"reason": why texir deliberately differs from ExecuTorch's `to_edge` there, and,
when texir's operators are those of ExecuTorch's other entry point instead, "same_ops_as":
"to_edge_transform_and_lower" (checked)}."""


def _outcome(name: str) -> Outcome:
    model = next(m for m in REALWORLD_MODELS if m.name == name)
    module, args = model.build()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ep = torch.export.export(module, args, strict=False)
    except Exception as exc:  # noqa: BLE001 - any export failure is reported as this model's
        return Outcome(name, "no-export", detail=f"{type(exc).__name__}: {exc}"[:300])
    return compare_exported(name, ep, tuple(args))


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    everything = os.environ.get("TEXIR_REALWORLD_ALL") == "1"
    names = [m.name for m in REALWORLD_MODELS] if everything else list(SAMPLE)
    outcomes = [_outcome(name) for name in names]
    return run_outcomes(outcomes, str(tmp_path_factory.mktemp("realworld")), tolerance=TOLERANCE)


def test_every_model_exports_and_both_pipelines_convert_it(report: dict[str, Any]) -> None:
    wrong = {k: (e["status"], e.get("detail", "")) for k, e in report.items()
             if e["status"] != "compared" and k not in KNOWN_DIFFERENCES}
    assert not wrong, wrong


def test_same_operators_as_executorch(report: dict[str, Any]) -> None:
    differ = {k: (e["only_texir"], e["only_executorch"]) for k, e in report.items()
              if "only_texir" in e and k not in KNOWN_DIFFERENCES}
    assert not differ, differ


def test_no_texir_pte_aborts_the_runtime(report: dict[str, Any]) -> None:
    aborted = [k for k, e in report.items() if e["texir_run"] == "abort"]
    assert not aborted, aborted


def test_texir_runs_where_executorch_runs(report: dict[str, Any]) -> None:
    behind = {k: (e["texir_run"], e.get("detail", "")) for k, e in report.items()
              if e["executorch_run"] == "agrees" and e["texir_run"] != "agrees" and k not in KNOWN_DIFFERENCES}
    assert not behind, behind


def test_known_differences_match_what_they_name(report: dict[str, Any]) -> None:
    """An entry saying texir's operators are `to_edge_transform_and_lower`'s is checked against it."""
    wrong = [k for k, known in KNOWN_DIFFERENCES.items() if k in report and "only_texir" in report[k]
             and known.get("same_ops_as") == "to_edge_transform_and_lower"
             and not report[k]["same_as_transform_and_lower"]]
    assert not wrong, wrong


def test_known_differences_still_differ(report: dict[str, Any]) -> None:
    """An entry whose model now matches ExecuTorch everywhere is stale: it would hide a regression."""
    stale = [k for k in KNOWN_DIFFERENCES if k in report and report[k]["status"] == "compared"
             and "only_texir" not in report[k] and report[k]["texir_run"] == report[k]["executorch_run"]]
    assert not stale, stale


def test_real_world_set_is_wide_enough() -> None:
    names = [m.name for m in REALWORLD_MODELS]
    assert len(set(names)) == len(names) >= 36
    families = collections.Counter(m.family for m in REALWORLD_MODELS)
    assert all(families[f] >= 8 for f in ("torchvision", "transformers", "timm")), families
    assert set(SAMPLE) <= set(names)


def test_known_differences_are_documented() -> None:
    names = {m.name for m in REALWORLD_MODELS}
    for name, known in KNOWN_DIFFERENCES.items():
        assert name in names, f"{name}: no such model in tests/realworld_models.py"
        assert len(known["reason"]) > 20, name
        assert known.get("same_ops_as") in (None, "to_edge_transform_and_lower"), name
