"""What each rank of the training tests runs.

That is the tiny model trained under a plan, and the single-process reference it must match.
"""

import torch
import torch.nn.functional as F

import models
from syncopate.torch import DistributedOptimizer
from syncopate.torch.momentum import param_groups


def train(rank, world, plan, iterations=3, check=0, seed=0, trace=None, lr=0.1, device="cpu"):
    """Trains models.tiny() on this rank's batches on `device`; returns its parameters, losses and checks."""
    torch.manual_seed(0)
    # The reference is float32 on the CPU: no TF32 on a GPU either.
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    model = models.tiny().to(device)
    # Momentum 0.9 but for the parameters a DGC memory corrects (its correction is their momentum).
    optimizer = DistributedOptimizer(torch.optim.SGD(param_groups(model, plan, 0.9, lr=lr)), model, plan,
                                     seed=seed, check=check, timeout_s=30)
    losses = []
    for k in range(iterations):
        optimizer.zero_grad()
        x, y = (t.to(device) for t in models.batch(rank, k))
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    optimizer.flush()
    if trace is not None:
        optimizer.write_trace(trace)
    optimizer.close()
    checks = optimizer.check.reports if optimizer.check else []
    # Plain lists: tensors would travel between processes through shared memory the rank frees on exit.
    return {"params": [p.detach().cpu().flatten().tolist() for p in model.parameters()], "losses": losses,
            "checks": checks}


def train_each(rank, world, plans, **options):
    """`train` for every plan in turn, in one process group."""
    return [train(rank, world, plan, **options) for plan in plans]


def reference(world, iterations=3, lr=0.1):
    """The same training in one process with the ranks' gradients averaged exactly."""
    torch.manual_seed(0)
    model = models.tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for k in range(iterations):
        optimizer.zero_grad()
        loss = sum(F.cross_entropy(model(x), y) for x, y in (models.batch(r, k) for r in range(world))) / world
        loss.backward()
        optimizer.step()
    return [p.detach().flatten().tolist() for p in model.parameters()]
