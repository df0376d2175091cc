"""Times gloo's all_reduce, reduce_scatter_tensor and all_gather_into_tensor on localhost ranks.

FSDP reduce-scatters gradients and all-gathers parameters; DDP allreduces. The simulator prices a
reduce-scatter and an all-gather as the two halves of a ring allreduce; this measures whether the
library does them so. Each round runs the three collectives of each size in a fresh seeded order
(interleaved, since this machine's speed drifts), and the table gives the median over rounds with
the range, and each collective's median over the allreduce's of the same size. One torch thread
per rank; the payload is `size` MB of fp32 on every rank (the reduce-scatter's input, the
all-gather's output).

Run: `target/pyenv/bin/python tools/gloo_collectives.py --ranks 2 --sizes 4 16 40 --rounds 5`.
"""

import argparse
import os
import random
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

COLLECTIVES = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor")


def timed(collective, elements, world, repeats):
    """Seconds per call of `collective` on `elements` fp32 elements, after a warm-up call."""
    full = torch.ones(elements)
    shard = torch.ones(elements // world)
    call = {
        "all_reduce": lambda: dist.all_reduce(full),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(shard, full),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(full, shard),
    }[collective]
    call()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - start) / repeats


def rank_main(rank, world, port, sizes, rounds, repeats, seed, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    runs = [(size, collective) for size in sizes for collective in COLLECTIVES]
    for r in range(rounds):
        # Every rank draws the same order: the collectives must match.
        for size, collective in random.Random(seed * 1000 + r).sample(runs, len(runs)):
            elements = int(size * 2**20) // 4 // world * world
            seconds = timed(collective, elements, world, repeats)
            if rank == 0:
                results.append((size, collective, seconds))
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--sizes", type=float, nargs="+", default=[4.0, 16.0, 40.0], help="MB per rank")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="calls timed together in a round")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.ranks < 2 or args.rounds < 1 or args.repeats < 1 or min(args.sizes) <= 0:
        parser.error("--ranks at least 2, --rounds and --repeats at least 1, --sizes above 0")
    with mp.Manager() as manager:
        results = manager.list()
        mp.spawn(rank_main, nprocs=args.ranks,
                 args=(args.ranks, free_port(), args.sizes, args.rounds, args.repeats, args.seed, results))
        results = list(results)
    print(f"gloo on localhost, {args.ranks} ranks, median (min-max) ms over {args.rounds} interleaved rounds")
    print(f"{'MB':>6} {'collective':<24} {'ms':>8} {'range':>17} {'/ allreduce':>12}")
    for size in args.sizes:
        times = {c: [s * 1e3 for z, c2, s in results if z == size and c2 == c] for c in COLLECTIVES}
        allreduce = statistics.median(times["all_reduce"])
        for collective in COLLECTIVES:
            ms = times[collective]
            median = statistics.median(ms)
            print(f"{size:>6g} {collective:<24} {median:>8.1f} {min(ms):>8.1f}-{max(ms):<8.1f} {median / allreduce:>12.2f}")


if __name__ == "__main__":
    main()
