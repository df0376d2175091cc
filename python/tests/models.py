"""The tiny model the tests train: a few layers of different sizes, and seeded batches per rank."""

import torch


def tiny():
    """Linear and 1-D convolution layers: matrices (for PowerSGD), vectors and a bias-free layer."""
    return torch.nn.Sequential(
        torch.nn.Unflatten(1, (2, 8)),
        torch.nn.Conv1d(2, 6, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(48, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 24, bias=False),
        torch.nn.Tanh(),
        torch.nn.Linear(24, 4),
    )


def batch(rank, iteration, size=8):
    """Rank `rank`'s batch of iteration `iteration`: inputs of 16 features, 4 classes."""
    generator = torch.Generator().manual_seed(1000 * iteration + rank)
    x = torch.randn(size, 16, generator=generator)
    y = torch.randint(0, 4, (size,), generator=generator)
    return x, y
