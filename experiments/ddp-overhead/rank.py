"""One rank of the DDP experiments (ddp-overhead, ddp-lab); prints measured iteration times.

The same model and batches are trained by PyTorch DDP (its bucket size, with its fp16 or PowerSGD
comm hook) or by syncopate.torch.DistributedOptimizer under the equivalent plan; the measured
iteration times are printed as one JSON line.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "digits"))
from steps import step_times  # noqa: E402

WIDTH = 1024


def model(layers, norm):
    """A perceptron of `layers` hidden layers of width 1024 (4.2 M parameters each), each followed
    by a LayerNorm when `norm` (two small tensors per layer, as the normalization layers of real
    networks give DDP's buckets), and a 10-way head."""
    torch.manual_seed(0)
    modules = []
    for _ in range(layers):
        modules += [torch.nn.Linear(WIDTH, WIDTH), *([torch.nn.LayerNorm(WIDTH)] if norm else []), torch.nn.ReLU()]
    return torch.nn.Sequential(*modules, torch.nn.Linear(WIDTH, 10))


def model_name(layers, norm):
    """The profile's model name: mlp-1024 is ddp-overhead's 4 layers without normalization."""
    return "mlp-1024" if (layers, norm) == (4, False) else f"mlp{'-ln' if norm else ''}-{layers}x{WIDTH}"


def batch(rank, step, size):
    generator = torch.Generator().manual_seed(rank * 100_003 + step)
    x = torch.randn(size, WIDTH, generator=generator)
    return x, torch.randint(0, 10, (size,), generator=generator)


def ddp(net, compressor, bucket_mb):
    """DDP with the comm hook that does what `compressor` does; `bucket_mb` is bucket_cap_mb, None
    for DDP's default (a first bucket of 1 MiB, then 25 MiB; PyTorch 2.15 caps the first bucket
    like the others when a cap is given)."""
    wrapped = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=bucket_mb)
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


def iteration_times(net, optimizer, rank, warmup, iterations, size):
    """Wall-clock time of each measured step on this rank, after a barrier (ms)."""
    def loss(step):
        x, y = batch(rank, step, size)
        return F.cross_entropy(net(x), y)

    return step_times(optimizer, loss, warmup, iterations)


def record_profile(args):
    """The model's profile (syncopate.torch.model_profile) written to args.profile by rank 0; with
    WORLD_SIZE > 1 every rank records at once and the profile keeps their skew."""
    from syncopate.torch import model_profile

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    net = model(args.layers, args.norm)
    x, y = batch(0, 0, args.batch)
    profile = model_profile(net, lambda: F.cross_entropy(net(x), y), name=model_name(args.layers, args.norm),
                            batch_size=args.batch, device=args.profile_device, iterations=args.iterations,
                            warmup=args.warmup, rank_skew=world > 1)
    if world > 1:
        profile["description"] += f"; {world} ranks computing at once on this machine, one torch thread each"
    if int(os.environ.get("RANK", "0")) == 0:
        with open(args.profile, "w") as f:
            json.dump(profile, f, indent=1)
    if world > 1:
        leave()


def leave():
    """Every rank done, then the process group torn down."""
    dist.barrier()
    # Gloo's worker threads release the last collectives a moment after they complete and need the
    # interpreter to do so (syncopate.torch's Link.settle does this for its own; DDP's are not its).
    time.sleep(0.1)
    dist.destroy_process_group()


def main(argv):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--engine", choices=["ddp", "syncopate"], help="who synchronizes the gradients")
    p.add_argument("--compressor", default="none")
    p.add_argument("--plan", help="the plan (syncopate engine)")
    p.add_argument("--bucket-mb", type=float, help="DDP's bucket_cap_mb (ddp engine; default: DDP's own)")
    p.add_argument("--layers", type=int, default=4, help="hidden layers of width 1024")
    p.add_argument("--norm", action="store_true", help="a LayerNorm after each hidden layer")
    p.add_argument("--batch", type=int, default=64, help="samples per rank and iteration")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--compute-iterations", type=int, default=0,
                   help="ddp engine: then time this many steps without communication (DDP's no_sync)")
    p.add_argument("--profile", metavar="OUT",
                   help="record the model's profile to OUT and exit: on one process, or on every rank of a "
                        "torchrun world at once (the compute each rank gets when they share the cores)")
    p.add_argument("--profile-device", default="host-2core", help="the device profile the recorded timings belong to")
    args = p.parse_args(argv)
    if args.compute_iterations < 0:
        p.error(f"--compute-iterations: {args.compute_iterations} is negative")
    for name in ("layers", "batch", "iterations"):
        if getattr(args, name) < 1:
            p.error(f"--{name}: {getattr(args, name)} is not a positive integer")
    if args.bucket_mb is not None and not args.bucket_mb > 0:
        p.error(f"--bucket-mb: {args.bucket_mb} is not a positive number")
    torch.set_num_threads(1)
    if args.profile:
        record_profile(args)
        return
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    net = model(args.layers, args.norm)
    net, optimizer = ddp(net, args.compressor, args.bucket_mb) if args.engine == "ddp" else wrapper(net, args.plan)
    times = iteration_times(net, optimizer, rank, args.warmup, args.iterations, args.batch)
    result = {"engine": args.engine, "compressor": args.compressor, "iteration_ms": statistics.median(times),
              "times_ms": times}
    if args.engine == "syncopate":
        optimizer.flush()
    elif args.compute_iterations:
        # The same steps without DDP's communication (no_sync), right after the measured ones and
        # on every rank at once: the compute each rank got during this run on this shared machine.
        with net.no_sync():
            compute = iteration_times(net, optimizer, rank, 1, args.compute_iterations, args.batch)
        result["compute_ms"] = statistics.median(compute)
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)
    leave()


if __name__ == "__main__":
    main(sys.argv[1:])
