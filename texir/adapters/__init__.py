"""The only layer that converts between torch objects and the texir IR."""

from texir.adapters.constant_methods import constant_method, constant_methods
from texir.adapters.fx_export import to_exported_program
from texir.adapters.fx_import import from_exported_program
from texir.adapters.weights import Weights, attach_weights, weightless

__all__ = [
    "Weights", "attach_weights", "constant_method", "constant_methods", "from_exported_program", "to_exported_program",
    "weightless",
]
