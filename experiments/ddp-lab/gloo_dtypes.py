"""Times gloo's allreduce of fp32, fp16 and bf16 tensors of the same element count, two ranks.

    target/pyenv/bin/python experiments/ddp-lab/gloo_dtypes.py

Two processes on this machine's loopback, one torch thread each (as the lab's ranks), allreduce
1, 4 and 10 Mi elements of each type, 7 times each after a barrier; prints rank 0's median in ms
and per element. Over loopback the bytes cost little, so what shows is gloo's own work per
element: DDP's fp16 hook sends half the bytes of the fp32 bucket, and the model prices its
allreduce as half the bytes of an fp32 one.
"""

import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = (1 << 20, 4 << 20, 10 << 20)
TYPES = (torch.float32, torch.float16, torch.bfloat16)
REPEATS = 7


def rank_main(rank, world):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ.setdefault("MASTER_PORT", "29531")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    for n in SIZES:
        for dtype in TYPES:
            x = torch.ones(n, dtype=dtype)
            times = []
            for _ in range(REPEATS):
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(x)
                times.append(time.perf_counter() - start)
            if rank == 0:
                median = statistics.median(times)
                print(f"{n:>9} elements  {str(dtype):15} {median * 1e3:8.2f} ms  {median / n * 1e9:5.2f} ns an element",
                      flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(rank_main, args=(2,), nprocs=2)
