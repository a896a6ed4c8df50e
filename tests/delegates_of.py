"""The delegates of a lowered program as plain data, on both sides of a comparison: texir's
`Program` and the graph module of ExecuTorch's own lowering (`to_edge_transform_and_lower`).

Each delegate is (backend id, blob, compile specs as (key, value), named data as sorted (key, bytes)),
in the order the program's graph reads the lowered modules."""

from __future__ import annotations

from typing import Any

from texir.ir import GetAttr, Program

Delegate = tuple[str, bytes, tuple[tuple[str, bytes], ...], tuple[tuple[str, bytes], ...]]


def texir_delegates(program: Program) -> list[Delegate]:
    modules = {m.name: m.module for m in program.lowered_modules}
    found = []
    for node in program.graph.nodes:
        module = modules.get(node.target) if isinstance(node, GetAttr) else None
        if module is not None:
            named = tuple(sorted((e.key, e.data.tobytes() if e.data is not None else b"") for e in module.named_data))
            specs = tuple((c.key, bytes(c.value)) for c in module.compile_specs)
            found.append((module.backend_id, bytes(module.processed_bytes), specs, named))
    return found


def executorch_delegates(graph_module: Any) -> list[Delegate]:
    """`graph_module`: ExecuTorch's lowered `exported_program().graph_module`."""
    # executorch is an optional extra: imported where a test already needs it
    from executorch.exir.lowered_backend_module import LoweredBackendModule

    found = []
    for node in graph_module.graph.nodes:
        module = getattr(graph_module, str(node.target), None) if node.op == "get_attr" else None
        if isinstance(module, LoweredBackendModule):
            store = module.named_data_store_output
            named = () if store is None else tuple(
                sorted((k, bytes(store.buffers[e.buffer_index])) for k, e in store.pte_data.items())
            )
            specs = tuple((c.key, bytes(c.value)) for c in module.compile_specs)
            found.append((module.backend_id, bytes(module.processed_bytes), specs, named))
    return found
