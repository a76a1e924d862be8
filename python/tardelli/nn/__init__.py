"""tardelli.nn: functional ops (modules live in the model layer)."""
from . import functional

__all__ = ["functional"]
