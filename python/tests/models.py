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


def factory(batch_size, device):
    """What `python -m syncopate.capture --module models:factory` calls: the tiny model on
    `device` and the loss of one seeded batch of `batch_size` samples."""
    model = tiny().to(device)
    x, y = batch(0, 0, size=batch_size)
    x, y = x.to(device), y.to(device)
    return model, lambda: torch.nn.functional.cross_entropy(model(x), y)


def failing_factory(batch_size, device):
    """A factory whose model cannot be built."""
    raise RuntimeError(f"no model for batch {batch_size} on {device}")


def module_only(batch_size, device):
    """A factory that forgets the loss function."""
    return tiny().to(device)
