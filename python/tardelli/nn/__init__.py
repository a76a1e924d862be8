"""tardelli.nn: modules, parameters, initializers and functional ops with torch.nn's names."""
from . import functional, init, utils
from .modules import (GELU, Dropout, Embedding, Identity, LayerNorm, Linear, Module, ModuleDict,
                      ModuleList, ReLU, RMSNorm, Sequential, SiLU, Tanh)
from .parameter import Parameter

__all__ = ["functional", "init", "utils", "Parameter", "Module", "Identity", "Linear",
           "Embedding", "LayerNorm", "RMSNorm", "Dropout", "GELU", "SiLU", "ReLU", "Tanh",
           "ModuleList", "ModuleDict", "Sequential"]
