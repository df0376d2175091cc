"""Measures syncopate.torch's own costs per gradient hook and per collective call, for profiles/frameworks/syncopate-torch.json.

    target/pyenv/bin/python profiles/tools/measure_syncopate_torch.py [--tensors 256] [--iterations 30] [--repeats 3]

Two gloo ranks on this machine train a model of many small parameters (so that their bytes cost
nothing) under a Horovod plan without compression, run by syncopate.torch's DistributedOptimizer.
The optimizer's hook (`_gradient`) and each stream thread's collective (`Executor._run`, less the
wait for the exchange itself) are timed with perf_counter around each call, and a small torch op
(`torch.mul(..., out=...)` of 64 floats) alone, and a launch decision's broadcast of one int64
from rank 0, on rank 0, after warm-up. Prints the medians over
the repeats of each repeat's median, and their spread, as JSON.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[2]


class Tiny(torch.nn.Module):
    """`tensors` parameters of 64 floats, each used once: a backward of as many gradients."""

    def __init__(self, tensors):
        super().__init__()
        self.weights = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(64)) for _ in range(tensors))

    def forward(self, x):
        return sum((w * x).sum() for w in self.weights)


def plan_for(tensors, directory):
    """A Horovod plan of the tiny model for 2 ranks, made by `syncopate simulate --save-plan`."""
    from syncopate.torch import model_profile

    torch.manual_seed(0)
    module = Tiny(tensors)
    x = torch.randn(64)
    profile = model_profile(module, lambda: module(x), name="tiny", batch_size=1, iterations=2, warmup=1)
    profile_path = directory / "tiny.json"
    profile_path.write_text(json.dumps(profile))
    plan = directory / "plan.json"
    binary = os.environ.get("SYNCOPATE_BIN", str(REPO / "target" / "release" / "syncopate"))
    subprocess.run([binary, "simulate", "--model", str(profile_path), "--cluster", "v100-10gbe", "--nodes", "1",
                    "--gpus-per-node", "2", "--strategy", "horovod", "--compressor", "none", "--save-plan", str(plan)],
                   check=True, capture_output=True)
    return plan


def timed(function, record, before=lambda: None):
    """`function`, with `before()` ahead of each call and `record(seconds)` after it."""

    def wrapper(*args, **kwargs):
        before()
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            record(time.perf_counter() - start)

    return wrapper


class Timings:
    """Each hook's and each collective call's time, the call's without its wait for the exchange
    (perf_counter around the calls; a thread's waits are kept apart per thread)."""

    def __init__(self):
        self.hooks, self.calls = [], []
        self.waiting = threading.local()

    def hook(self, function):
        return timed(function, self.hooks.append)

    def call(self, function):
        def reset():
            self.waiting.seconds = 0.0

        return timed(function, lambda seconds: self.calls.append(seconds - self.waiting.seconds), reset)

    def wait(self, function):
        def add(seconds):
            self.waiting.seconds += seconds

        return timed(function, add)


def rank_main(rank, port, plan, tensors, iterations, queue):
    from syncopate.torch import DistributedOptimizer, executor, exchange
    from syncopate.torch import optimizer as optimizer_module

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    timings = Timings()
    optimizer_module.DistributedOptimizer._gradient = timings.hook(optimizer_module.DistributedOptimizer._gradient)
    executor.Executor._run = timings.call(executor.Executor._run)
    exchange.Allreduce.finish = timings.wait(exchange.Allreduce.finish)
    torch.manual_seed(0)
    module = Tiny(tensors)
    x = torch.randn(64)
    optimizer = DistributedOptimizer(torch.optim.SGD(module.parameters(), lr=0.01), module, str(plan), timeout_s=60)
    for k in range(iterations + 5):
        if k == 5:
            timings.hooks.clear()
            timings.calls.clear()
        optimizer.zero_grad()
        module(x).backward()
        optimizer.step()
    optimizer.close()
    # A launch decision as rank 0 sends it when the plan's order is not fixed: one int64
    # broadcast (Link.broadcast_int).
    word = torch.zeros(1, dtype=torch.int64)
    rounds = []
    for _ in range(220):
        start = time.perf_counter()
        dist.broadcast(word, src=0)
        rounds.append(time.perf_counter() - start)
    decision_us = statistics.median(rounds[20:]) * 1e6
    # One small torch op from Python, as the hook's copy and the call's scaling launch it.
    a, b = torch.randn(64), torch.empty(64)
    for _ in range(1000):
        torch.mul(a, 0.5, out=b)
    start = time.perf_counter()
    for _ in range(10000):
        torch.mul(a, 0.5, out=b)
    op_us = (time.perf_counter() - start) / 10000 * 1e6
    queue.put((rank, {"hook_us": statistics.median(timings.hooks) * 1e6,
                      "call_us": statistics.median(timings.calls) * 1e6, "op_us": op_us,
                      "decision_us": decision_us,
                      "hooks": len(timings.hooks), "calls": len(timings.calls)}))
    dist.destroy_process_group()


def one_repeat(plan, tensors, iterations, port):
    context = mp.get_context("spawn")
    queue = context.Queue()
    ranks = [context.Process(target=rank_main, args=(r, port, plan, tensors, iterations, queue)) for r in range(2)]
    for p in ranks:
        p.start()
    results = dict(queue.get(timeout=300) for _ in ranks)
    for p in ranks:
        p.join(timeout=30)
    return results[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=256)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    opts = parser.parse_args()
    if opts.tensors < 1 or opts.iterations < 1 or opts.repeats < 1:
        sys.exit("--tensors, --iterations and --repeats must be at least 1")
    with tempfile.TemporaryDirectory() as scratch:
        plan = plan_for(opts.tensors, Path(scratch))
        repeats = [one_repeat(plan, opts.tensors, opts.iterations, 29600 + r) for r in range(opts.repeats)]
    summary = {}
    for key in ("hook_us", "call_us", "op_us", "decision_us"):
        values = [r[key] for r in repeats]
        summary[key] = {"median": round(statistics.median(values), 2), "min": round(min(values), 2),
                        "max": round(max(values), 2)}
    summary["hooks_per_repeat"] = repeats[0]["hooks"]
    summary["calls_per_repeat"] = repeats[0]["calls"]
    summary["torch"] = torch.__version__
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
