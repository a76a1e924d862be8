"""tardelli.optim: optimizers and learning-rate schedules with torch.optim's names."""
from . import lr_scheduler
from .adamw import AdamW
from .optimizer import Optimizer
from .sgd import SGD

__all__ = ["Optimizer", "AdamW", "SGD", "lr_scheduler"]
