"""texir's own backends: pure functions of a frozen sub-program (no torch, no executorch).

Importing this package registers the demo ("BackendWithDelegateMappingDemo") and reference
("texir-reference") backends under their ids; `texir.backends.xnnpack` is imported on its own.
"""

from texir.backends import demo as demo
from texir.backends import reference as reference

__all__ = ["demo", "reference"]
