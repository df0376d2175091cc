"""A collective sweep over torch.distributed (gloo on CPU), launched and waited as the wrapper does.

It includes the wrapper's parameter-server push-pull, and is written as the CSV that
`syncopate collective --compare/--fit-out` reads.

Run one process per rank with torchrun's variables set (`syncopate lab run -- python -m
syncopate.torch.sweep --out sweep.csv`, or torchrun). Each size is timed `--iterations` times
back to back after a barrier (the ranks start together), each call launched asynchronously and
waited for as `syncopate.torch`'s exchanges do; a row is the median over `--rounds` rounds of
the slowest rank's mean time per call, the time a collective in training takes.
`--gathers tensor` times allgather as FSDP2 calls it (one `all_gather_into_tensor`) instead of
the wrapper's two calls; `reduce-scatter` is FSDP2's `reduce_scatter_tensor` with `ReduceOp.AVG`
(torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, fp32 gradients). `allreduce-fp16`
allreduces a float16 buffer of the same bytes, as DDP's `fp16_compress_hook` does: beside the
`allreduce` rows, `syncopate collective --fit-out` turns it into the library's cost of float16
sums (`fp16_sum_ns_per_element`).
`--beside-compute` times the same calls while every rank also computes on a thread of its own
(a rank's backward pass beside its communication): `syncopate collective --beside-compute`
turns the two sweeps into the cluster's `contention.collective_slowdown_with_compute` and its
delays of a collective beside compute. Each of its rows also says how much the calls slow that
compute (`compute_slowdown`: the ranks' mean of the compute thread's rate alone, over half a
second before the size, divided by its rate during the size's calls, warm-up and barriers
included), which the same command makes the cluster's `contention.compute_slowdown_with_collective`.
"""

import argparse
import concurrent.futures
import contextlib
import csv
import datetime
import os
import statistics
import sys
import threading
import time
import weakref

import torch
import torch.distributed as dist

from syncopate.errors import SyncopateError
from syncopate.torch import exchange
from syncopate.torch.link import Link

OPS = ("allreduce", "allgather", "reduce-scatter", "push-pull", "push-pull-all", "allreduce-fp16")
# What a sweep times unless told: the collectives syncopate.torch runs.
DEFAULT_OPS = ("allreduce", "allgather", "push-pull", "push-pull-all")
GATHERS = ("wrapper", "tensor")
# The sizes `syncopate lab up`'s MPI sweep uses, so that the two fits see the same messages.
DEFAULT_SIZES = "4K,16K,64K,256K,1M,4M,16M"
# A push-pull's server link carries every peer's payload, (ranks - 1) times an allreduce's
# bytes: its per-message cost shows at sizes up to 1 MiB, and larger ones take minutes on a
# slow lab.
DEFAULT_PUSH_PULL_SIZES = "4K,16K,64K,256K,1M"
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
# The largest size a sweep accepts: a fp32 buffer of a quarter of a GiB per rank.
MAX_BYTES = 256 << 20
# float16's smallest normal value, where an fp16 allreduce round starts, and its largest.
FP16_START, FP16_MAX = 2.0 ** -14, 65504.0


def parse_sizes(flag, text):
    """`flag`'s `4K,1M,…` as byte counts: whole fp32 elements, at most MAX_BYTES."""
    sizes = []
    for item in text.split(","):
        item = item.strip().upper()
        number, unit = (item[:-1], item[-1]) if item[-1:] in UNITS else (item, "")
        try:
            size = int(number) * UNITS[unit]
        except ValueError:
            raise SyncopateError(f"{flag}: {item!r} is not a size (a whole number with K, M or G)") from None
        if size <= 0 or size % 4 or size > MAX_BYTES:
            raise SyncopateError(f"{flag}: {item!r} must be a positive multiple of 4 bytes up to {MAX_BYTES >> 20}M")
        sizes.append(size)
    return sizes


def positive(flag, text):
    try:
        value = int(text)
    except ValueError:
        raise SyncopateError(f"{flag}: {text!r} is not a whole number") from None
    if value <= 0:
        raise SyncopateError(f"{flag}: {value} must be at least 1")
    return value


def calls(op, link, size, gathers="wrapper"):
    """One launch-and-wait of `op` on a per-rank buffer of `size` bytes. Allgather gathers the
    total `size` (nccl-tests' convention: each rank sends size / world) the way
    `syncopate.torch`'s exchange gathers payloads (`gathers` "wrapper": their sizes first, then
    the payloads) or FSDP2 gathers a unit's parameters ("tensor": one call into one tensor).
    Reduce-scatter reduces a `size`-byte fp32 input to each rank's size / world. A
    push-pull sends every rank's `size` bytes to rank 0 and rank 0's back, with the messages of
    `syncopate.torch`'s parameter server (its codecs' work left out); `push-pull-all` makes one
    to every rank at once, each on a thread and process group of its own, as the wrapper's
    communication streams do."""
    if op == "push-pull":
        payload = torch.ones(size, dtype=torch.uint8)
        return lambda: push_pull(link, payload, 0)
    if op == "push-pull-all":
        links, pool = servers(link)
        payloads = [torch.ones(size, dtype=torch.uint8) for _ in links]

        def at_once():
            rounds = [pool.submit(push_pull, server_link, payload, server)
                      for server, (server_link, payload) in enumerate(zip(links, payloads))]
            # Every round ends (or fails) before the first failure is raised: none is left
            # waiting on its peers while the sweep moves on.
            concurrent.futures.wait(rounds)
            for done in rounds:
                done.result()

        return at_once
    if op == "allreduce":
        buffer = torch.ones(size // 4, dtype=torch.float32)
        return lambda: link.wait(link.start(dist.all_reduce, buffer, async_op=True), "sweep allreduce")
    if op == "allreduce-fp16":
        # Each call sums in place and multiplies the values by the world size; from float16's
        # smallest normal value they stay normal numbers for a round's calls (`fp16_rounds_fit`),
        # and gloo's float16 sums of infinities take a shorter path than those of numbers.
        buffer = torch.empty(size // 2, dtype=torch.float16)

        def allreduce_fp16():
            link.wait(link.start(dist.all_reduce, buffer, async_op=True), "sweep allreduce-fp16")

        allreduce_fp16.reset = lambda: buffer.fill_(FP16_START)
        allreduce_fp16.reset()
        return allreduce_fp16
    if op == "reduce-scatter":
        elements = max(size // 4 // link.world, 1)
        full, reduced = torch.ones(elements * link.world), torch.empty(elements)
        return lambda: link.wait(link.start(dist.reduce_scatter_tensor, reduced, full, op=dist.ReduceOp.AVG,
                                            async_op=True), "sweep reduce-scatter")
    shard = max(size // link.world, 1)
    mine = torch.ones(shard, dtype=torch.uint8)
    if gathers == "tensor":
        into = torch.empty(shard * link.world, dtype=torch.uint8)
        return lambda: link.wait(link.start(dist.all_gather_into_tensor, into, mine, async_op=True),
                                 "sweep allgather")
    gathered = [torch.empty(shard, dtype=torch.uint8) for _ in range(link.world)]

    def allgather():
        link.gather_lengths(shard, "sweep allgather")
        link.wait(link.start(dist.all_gather, gathered, mine, async_op=True), "sweep allgather")

    return allgather


def push_pull(link, payload, server):
    """One push-pull of `payload` to `server`, which serves the first payload back."""
    exchange.PushPullMessages(link, payload, server, "sweep push-pull").finish(lambda pushed: pushed[0])


# Per link, the process groups and the threads of the rounds at once, one per server, made
# once (every rank makes the groups in the same order) and kept, as the wrapper keeps its
# communication streams' threads: starting threads for every call would time their start.
SERVERS = weakref.WeakKeyDictionary()


def servers(link):
    if link not in SERVERS:
        pool = concurrent.futures.ThreadPoolExecutor(link.world, thread_name_prefix="syncopate-sweep-server")
        SERVERS[link] = ([link.new_group() for _ in range(link.world)], pool)
    return SERVERS[link]


def release_servers():
    """Ends the rounds-at-once threads (idle after a sweep; after a failure, not waited for)."""
    for _, pool in list(SERVERS.values()):
        pool.shutdown(wait=False, cancel_futures=True)
    SERVERS.clear()


def slowest(link, value):
    """The largest of every rank's `value`."""
    tensor = torch.tensor([value], dtype=torch.float64)
    link.wait(link.start(dist.all_reduce, tensor, op=dist.ReduceOp.MAX, async_op=True), "sweep times")
    return float(tensor.item())


def fp16_rounds_fit(world, iterations):
    """Whether a round of `iterations` fp16 allreduces over `world` ranks, from FP16_START, keeps
    its values below float16's largest (each call multiplies them by `world`)."""
    return FP16_START * float(world) ** (iterations + 1) <= FP16_MAX


def measure(link, op, size, iterations, rounds, gathers="wrapper"):
    """Median over rounds of the slowest rank's mean µs per call; a call that keeps state
    (`reset`) starts every round from it, untimed."""
    call = calls(op, link, size, gathers)
    call()  # connections and buffers warmed outside the timing
    reset = getattr(call, "reset", lambda: None)
    times = []
    for _ in range(rounds):
        reset()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iterations):
            call()
        times.append(slowest(link, (time.perf_counter() - start) / iterations * 1e6))
    return statistics.median(times)


class Computing:
    """A thread that multiplies matrices until the block ends, as a rank's compute does beside
    its collectives (torch releases the interpreter while it multiplies), counting them."""

    def __enter__(self):
        self.done = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="syncopate-sweep-compute", daemon=True)
        self.thread.start()
        return self

    def _run(self):
        a, b = torch.randn(128, 128), torch.randn(128, 128)
        while not self.stop.is_set():
            torch.mm(a, b)
            self.done += 1

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def sweep(link, ops, sizes, iterations, rounds, gathers="wrapper", computing=None):
    """Rows (op, ranks, size in bytes, µs) for every op and its sizes (`sizes[op]`), on every
    rank alike; beside `computing`, each row also has the compute's slowdown (`compute_slowdown`)."""
    rows = []
    for op in ops:
        for size in sizes[op]:
            if computing is None:
                rows.append((op, link.world, size, measure(link, op, size, iterations, rounds, gathers)))
                continue
            alone = compute_rate(computing, lambda: time.sleep(ALONE_S))
            during = []
            rate = compute_rate(computing, lambda: during.append(measure(link, op, size, iterations, rounds, gathers)))
            # A compute thread that got no core at all, alone or during the calls, measured no
            # slowdown: not a number, which the ranks' mean keeps and `syncopate collective`
            # skips (it refuses a sweep none of whose allreduces measured one).
            slowdown = alone / rate if alone > 0 and rate > 0 else float("nan")
            rows.append((op, link.world, size, during[0], ranks_mean(link, slowdown)))
    return rows


# How long each size's compute alone is timed, before the size, beside a sweep.
ALONE_S = 0.5


def compute_rate(computing, work):
    """The multiplications per second `computing` did during `work`, from a barrier on."""
    dist.barrier()
    done, start = computing.done, time.perf_counter()
    work()
    return (computing.done - done) / (time.perf_counter() - start)


def ranks_mean(link, value):
    """The mean of every rank's `value`."""
    tensor = torch.tensor([value], dtype=torch.float64)
    link.wait(link.start(dist.all_reduce, tensor, async_op=True), "sweep compute rates")
    return float(tensor.item()) / link.world


def write_csv(path, rows):
    beside = any(len(row) > 4 for row in rows)
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["op", "gpus", "size_bytes", "time_us", *(["compute_slowdown"] if beside else [])])
        for op, world, size, t, *slowdown in rows:
            out.writerow([op, world, size, f"{t:.1f}", *(f"{s:.3f}" for s in slowdown)])


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m syncopate.torch.sweep", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="CSV to write (rank 0): op,gpus,size_bytes,time_us (and compute_slowdown with --beside-compute)")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help=f"per-rank buffer sizes (default {DEFAULT_SIZES})")
    p.add_argument("--push-pull-sizes", default=DEFAULT_PUSH_PULL_SIZES,
                   help=f"per-rank payload sizes of the push-pull (default {DEFAULT_PUSH_PULL_SIZES})")
    p.add_argument("--ops", default=",".join(DEFAULT_OPS),
                   help=f"collectives to time, of {', '.join(OPS)} (default {','.join(DEFAULT_OPS)})")
    p.add_argument("--gathers", default="wrapper", choices=GATHERS,
                   help="allgather as syncopate.torch calls it (wrapper: sizes, then payloads) or as FSDP2 does "
                        "(tensor: one all_gather_into_tensor)")
    p.add_argument("--iterations", default="10", help="calls per round (default 10)")
    p.add_argument("--rounds", default="5", help="rounds per size; the median is kept (default 5)")
    p.add_argument("--timeout-s", default="120", help="how long one call may wait for its peers (default 120)")
    p.add_argument("--beside-compute", action="store_true",
                   help="time every call while each rank also computes on a thread of its own")
    args = p.parse_args(argv)
    try:
        collective_sizes = parse_sizes("--sizes", args.sizes)
        push_pull_sizes = parse_sizes("--push-pull-sizes", args.push_pull_sizes)
        sizes = {"allreduce": collective_sizes, "allgather": collective_sizes, "reduce-scatter": collective_sizes,
                 "allreduce-fp16": collective_sizes,
                 "push-pull": push_pull_sizes,
                 "push-pull-all": push_pull_sizes}
        ops = [op.strip() for op in args.ops.split(",")]
        unknown = [op for op in ops if op not in OPS]
        if unknown:
            raise SyncopateError(f"--ops: unknown collective {unknown[0]!r}; known: {', '.join(OPS)}")
        iterations = positive("--iterations", args.iterations)
        rounds = positive("--rounds", args.rounds)
        timeout_s = positive("--timeout-s", args.timeout_s)
        missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
        if missing:
            raise SyncopateError(f"{', '.join(missing)} not set: run under torchrun or `syncopate lab run`")
        world = positive("WORLD_SIZE", os.environ["WORLD_SIZE"])
        if "allreduce-fp16" in ops and not fp16_rounds_fit(world, iterations):
            raise SyncopateError(f"--iterations: {iterations} fp16 allreduces over {world} ranks overflow float16 "
                                 "within a round (each multiplies the values by the world size): time fewer per round")
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
        link = Link(dist.get_rank(), dist.get_world_size(), timeout_s)
        try:
            with Computing() if args.beside_compute else contextlib.nullcontext() as computing:
                rows = sweep(link, ops, sizes, iterations, rounds, args.gathers, computing)
        finally:
            release_servers()
        if link.rank == 0:
            write_csv(args.out, rows)
        dist.barrier()
        dist.destroy_process_group()
    except (SyncopateError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
