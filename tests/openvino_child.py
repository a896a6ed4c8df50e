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


def texir_side(ep: torch.export.ExportedProgram) -> tuple[Delegates, bytes]:
    from texir.emit import emit
    from texir.executorch import executorch_partitioner
    from texir.executorch.names import openvino_partitioner
    from texir.ir import GetAttr
    from texir.orchestrate import lower
    from texir.serialize.pte.codec import dumps

    program = lower(ep, [executorch_partitioner(openvino_partitioner())], cache=None).program
    modules = {m.name: m.module for m in program.lowered_modules}
    found = []
    for node in program.graph.nodes:
        module = modules.get(node.target) if isinstance(node, GetAttr) else None
        if module is not None:
            found.append({
                "backend": module.backend_id,
                "blob": _digest(bytes(module.processed_bytes)),
                "specs": [[c.key, _digest(bytes(c.value))] for c in module.compile_specs],
                "named_data": sorted(
                    [e.key, _digest(e.data.tobytes() if e.data is not None else b"")] for e in module.named_data
                ),
            })
    return found, dumps(emit(program))


def executorch_side(ep: torch.export.ExportedProgram) -> tuple[Delegates, bytes]:
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir.lowered_backend_module import LoweredBackendModule

    from texir.executorch.names import openvino_partitioner

    manager = to_edge_transform_and_lower(ep, partitioner=[openvino_partitioner()])
    gm = manager.exported_program().graph_module
    found = []
    for node in gm.graph.nodes:
        module = getattr(gm, str(node.target), None) if node.op == "get_attr" else None
        if isinstance(module, LoweredBackendModule):
            store = module.named_data_store_output
            found.append({
                "backend": module.backend_id,
                "blob": _digest(bytes(module.processed_bytes)),
                "specs": [[c.key, _digest(bytes(c.value))] for c in module.compile_specs],
                "named_data": sorted(
                    [k, _digest(bytes(store.buffers[e.buffer_index]))]
                    for k, e in (() if store is None else store.pte_data.items())
                ),
            })
    return found, bytes(manager.to_executorch().buffer)


def main(side: str, out_dir: str, names: list[str]) -> None:
    lower_one = {"texir": texir_side, "executorch": executorch_side}[side]
    report = {}
    for name in names:
        report[name], pte = lower_one(_export(name))
        Path(out_dir, f"{name}.pte").write_bytes(pte)
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
