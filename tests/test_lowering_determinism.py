"""Lowering is deterministic: same plan and same bytes whatever PYTHONHASHSEED."""

from __future__ import annotations

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
