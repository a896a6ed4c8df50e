"""ExecuTorch's own partitioners and backends on texir programs (the optional `executorch` extra).

The only package of texir that imports executorch, and only inside its functions: importing it is
cheap and works without the extra; calling it without the extra raises `ExecutorchUnavailableError`.
It calls partitioners' `partition()` / `ops_to_not_decompose()` and backends' `preprocess()`; it
never runs ExecuTorch's `to_edge`, `to_backend`, emitter or serializer.

    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from texir.executorch import executorch_partitioner
    import texir
    program = texir.lower(exported_program, [executorch_partitioner(XnnpackPartitioner())]).program
"""

from __future__ import annotations

from texir.executorch.backend import (
    ExecutorchBackend,
    executorch_backend_class,
    register_executorch_backend,
)
from texir.executorch.deps import ExecutorchUnavailableError, require_executorch
from texir.executorch.edge_program import edge_target, to_edge_exported_program, to_executorch_exported_program
from texir.executorch.etrecord import EtrecordError, write_etrecord
from texir.executorch.names import PARTITIONERS, as_executorch_partitioner, partitioner_by_name
from texir.executorch.runtime import (
    CaseResult,
    LoadedMethod,
    RuntimeRunError,
    load_method,
    run_pte,
    verify_bpte,
)
from texir.executorch.partitioner import ExecutorchPartitioner, PartitionerModifiedGraphError, executorch_partitioner
from texir.executorch.reimport import from_executorch_lowered, import_executorch_program

__all__ = [
    "PARTITIONERS",
    "CaseResult",
    "RuntimeRunError",
    "as_executorch_partitioner",
    "ExecutorchBackend",
    "ExecutorchPartitioner",
    "ExecutorchUnavailableError",
    "LoadedMethod",
    "PartitionerModifiedGraphError",
    "EtrecordError",
    "edge_target",
    "executorch_backend_class",
    "executorch_partitioner",
    "from_executorch_lowered",
    "import_executorch_program",
    "load_method",
    "partitioner_by_name",
    "register_executorch_backend",
    "run_pte",
    "require_executorch",
    "to_edge_exported_program",
    "to_executorch_exported_program",
    "verify_bpte",
    "write_etrecord",
]
