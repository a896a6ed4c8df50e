"""texir's native XNNPACK backend: ExecuTorch 1.5.1's delegate blob (schema.fbs, XH00) from the typed IR.

`partitioner(**options)` is XnnpackPartitioner's float configs on the IR; `XnnpackNativeBackend`
compiles a partition; `register()` makes it the backend behind ExecuTorch's id `XnnpackBackend`.
"""

from texir.backends.xnnpack.backend import BACKEND_ID, XnnpackNativeBackend, register
from texir.backends.xnnpack.partitioner import partitioner

__all__ = ["BACKEND_ID", "XnnpackNativeBackend", "partitioner", "register"]
