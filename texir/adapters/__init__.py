"""The only layer that converts between torch objects and the texir IR."""

from texir.adapters.fx import from_exported_program, to_exported_program

__all__ = ["from_exported_program", "to_exported_program"]
