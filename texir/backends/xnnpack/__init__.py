"""texir's native XNNPACK backend: ExecuTorch 1.5.1's delegate blob (schema.fbs, XH00) from the typed IR.

`partitioner(**options)` is XnnpackPartitioner's float configs on the IR; `XnnpackNativeBackend`
compiles a partition; `registered()` makes it the backend behind `XnnpackBackend` for a `with`
block, `register()` for the rest of the process.
"""

from texir.backends.xnnpack.backend import BACKEND_ID, XnnpackNativeBackend, register, registered
from texir.backends.xnnpack.partitioner import partitioner

__all__ = ["BACKEND_ID", "XnnpackNativeBackend", "partitioner", "register", "registered"]
