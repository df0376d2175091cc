"""syncopate.torch: run a plan's lowered Schedule inside PyTorch training (DistributedOptimizer) and record a model profile from a torch module (model_profile)."""

from syncopate.torch.optimizer import DistributedOptimizer
from syncopate.torch.profile import model_profile

__all__ = ["DistributedOptimizer", "model_profile"]
