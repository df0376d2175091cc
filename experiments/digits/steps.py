"""What the lab experiments' ranks share: timing training steps the way every run reports them."""

import time

import torch.distributed as dist


def step_times(optimizer, loss, warmup, iterations):
    """Wall-clock time of each measured step on this rank, after a barrier (ms): `warmup` steps,
    then `iterations` timed ones, each zeroing the gradients, running `loss(step)`'s backward and
    stepping `optimizer`."""
    times = []
    dist.barrier()
    start = time.perf_counter()
    for step in range(warmup + iterations):
        optimizer.zero_grad()
        loss(step).backward()
        optimizer.step()
        now = time.perf_counter()
        if step >= warmup:
            times.append((now - start) * 1e3)
        start = now
    return times
