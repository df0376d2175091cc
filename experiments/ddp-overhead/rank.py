"""One rank of the DDP-overhead experiment: the same model and batches trained by PyTorch DDP (with its fp16 or PowerSGD comm hook) or by syncopate.torch.DistributedOptimizer under the equivalent plan; prints the measured iteration times as one JSON line."""

import argparse
import json
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

WIDTH = 1024
BATCH = 64


def model():
    """A 5-layer perceptron, 4.2 M parameters (16.8 MB of fp32 gradients)."""
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, 10))


def batch(rank, step):
    generator = torch.Generator().manual_seed(rank * 100_003 + step)
    x = torch.randn(BATCH, WIDTH, generator=generator)
    return x, torch.randint(0, 10, (BATCH,), generator=generator)


def ddp(net, compressor):
    """DDP with the comm hook that does what `compressor` does (default buckets: 1 MiB, then 25 MiB)."""
    wrapped = torch.nn.parallel.DistributedDataParallel(net)
    if compressor == "fp16":
        wrapped.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif compressor == "powersgd:4":
        # Rank 4 from the second iteration on (the hook's earliest), error feedback and warm start
        # as powersgd:4 with memory residual; 1-D tensors travel raw in both.
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=4, start_powerSGD_iter=2,
                                            min_compression_rate=0, use_error_feedback=True, warm_start=True)
        wrapped.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif compressor != "none":
        raise SystemExit(f"--compressor {compressor}: DDP runs none, fp16 or powersgd:4")
    return wrapped, torch.optim.SGD(net.parameters(), lr=0.01)


def wrapper(net, plan):
    from syncopate.torch import DistributedOptimizer

    return net, DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.01), net, plan)


def iteration_times(net, optimizer, rank, warmup, iterations):
    """Wall-clock time of each measured step on this rank, after a barrier (ms)."""
    times = []
    dist.barrier()
    start = time.perf_counter()
    for step in range(warmup + iterations):
        x, y = batch(rank, step)
        optimizer.zero_grad()
        F.cross_entropy(net(x), y).backward()
        optimizer.step()
        now = time.perf_counter()
        if step >= warmup:
            times.append((now - start) * 1e3)
        start = now
    return times


def main(argv):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--engine", choices=["ddp", "syncopate"], help="who synchronizes the gradients")
    p.add_argument("--compressor", default="none")
    p.add_argument("--plan", help="the plan (syncopate engine)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--profile", metavar="OUT", help="record the model's profile to OUT on one process and exit")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.profile:
        from syncopate.torch import model_profile

        net = model()
        x, y = batch(0, 0)
        profile = model_profile(net, lambda: F.cross_entropy(net(x), y), name="mlp-1024", batch_size=BATCH,
                                iterations=20, warmup=5)
        with open(args.profile, "w") as f:
            json.dump(profile, f, indent=1)
        return
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    net, optimizer = ddp(model(), args.compressor) if args.engine == "ddp" else wrapper(model(), args.plan)
    times = iteration_times(net, optimizer, rank, args.warmup, args.iterations)
    if args.engine == "syncopate":
        optimizer.flush()
    if rank == 0:
        print("RESULT " + json.dumps({"engine": args.engine, "compressor": args.compressor,
                                      "iteration_ms": statistics.median(times), "times_ms": times}), flush=True)
    dist.barrier()
    # Gloo's worker threads release the last collectives a moment after they complete and need the
    # interpreter to do so (syncopate.torch's Link.settle does this for its own; DDP's are not its).
    time.sleep(0.1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
