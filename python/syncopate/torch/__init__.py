"""syncopate.torch: run a plan's Schedule in PyTorch training, and record a model profile.

DistributedOptimizer runs a plan's lowered Schedule inside PyTorch training; model_profile records a
model profile from a torch module.
"""

from syncopate.torch.optimizer import DistributedOptimizer
from syncopate.torch.profile import model_profile

__all__ = ["DistributedOptimizer", "model_profile"]
