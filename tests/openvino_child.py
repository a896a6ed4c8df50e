"""Run in a fresh interpreter by tests/test_executorch_more_backends.py: lower the named models, in
order, with OpenVINO's partitioner on one side (`texir`, or ExecuTorch's own `executorch`), write each
`.pte` to OUT_DIR/<model>.pte and print each delegate's backend id and the digests of its blob, compile
specs and named data as one JSON line.

OpenVINO's blob is its compiled model, whose node names come from counters global to the process;
two sides in two fresh processes that lower the same models in the same order start from the same
counters, so their blobs can be compared byte for byte."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch

from tests.delegates_of import Delegate, executorch_delegates, texir_delegates
from texir.emit import emit
from texir.executorch import executorch_partitioner
from texir.executorch.names import openvino_partitioner
from texir.orchestrate import lower
from texir.serialize.pte.codec import dumps


def _export(name: str) -> torch.export.ExportedProgram:
    if name in ("resnet18", "mobilenet_v2"):
        from tests.real_models import real_export

        return real_export(name)[0]
    from tests.zoo import zoo_model

    module, args = zoo_model(name).build()
    return torch.export.export(module, args, strict=False)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


Delegates = list[dict[str, Any]]


def _as_json(delegates: list[Delegate]) -> Delegates:
    return [
        {
            "backend": backend,
            "blob": _digest(blob),
            "specs": [[key, _digest(value)] for key, value in specs],
            "named_data": [[key, _digest(data)] for key, data in named],
        }
        for backend, blob, specs, named in delegates
    ]


def texir_side(ep: torch.export.ExportedProgram) -> tuple[Delegates, bytes]:
    program = lower(ep, [executorch_partitioner(openvino_partitioner())], cache=None).program
    return _as_json(texir_delegates(program)), dumps(emit(program))


def executorch_side(ep: torch.export.ExportedProgram) -> tuple[Delegates, bytes]:
    from executorch.exir import to_edge_transform_and_lower

    manager = to_edge_transform_and_lower(ep, partitioner=[openvino_partitioner()])
    return _as_json(executorch_delegates(manager.exported_program().graph_module)), bytes(manager.to_executorch().buffer)


def main(side: str, out_dir: str, names: list[str]) -> None:
    lower_one = {"texir": texir_side, "executorch": executorch_side}[side]
    report = {}
    for name in names:
        report[name], pte = lower_one(_export(name))
        Path(out_dir, f"{name}.pte").write_bytes(pte)
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
