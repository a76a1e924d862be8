"""tardelli.utils: torch.utils' names (checkpoint)."""
from . import checkpoint  # noqa: F401
