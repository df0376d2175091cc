"""ddp-lab's timeline: DDP iterations bucket by bucket, measured on the labs beside the prediction.

    sudo target/pyenv/bin/python experiments/ddp-lab/timeline.py            # about 6 min
    target/pyenv/bin/python experiments/ddp-lab/timeline.py --report-only   # the table from timeline.csv

run.py compares whole iterations; this script shows where inside one the prediction parts from the
run. For each configuration (lab, hook, bucket size) rank 0 of a real DDP run records, in every
step after warm-up, when each bucket's comm hook is called (its gradients are ready), when the
hook's future completes (the bucket is reduced, and decoded for fp16), when the backward pass has
produced its last gradient and when the optimizer step ends, each from the step's start (forward);
the medians over the steps stand beside the same events in the simulator's trace of that
configuration (`syncopate simulate --trace`), predicted from the lab's committed gloo fit and a
profile recorded on this machine just before the runs (its speed drifts within the hour). The
hook is DDP's own (`allreduce_hook` for none, `fp16_compress_hook`), called through a wrapper
that takes the times.

Beside it, how much gloo's allreduces slow a rank's compute on each lab: every rank multiplies
128 x 128 matrices on a thread of its own, for one second alone and then during back-to-back
allreduces of 4 MiB (float32, and float16 as the fp16 hook sends), five rounds; the ratio of the
two rates, against the factor the lab's cluster file gives the simulator
(`contention.compute_slowdown_with_collective`).

Needs what run.py needs (root, the release CLI built with `--features mpi`, the package in
target/pyenv). Writes timeline.csv and the `timeline` block of README.md.
"""

import argparse
import csv
import json
import pathlib
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "experiments" / "digits"))
sys.path.insert(0, str(REPO / "experiments" / "ddp-overhead"))
sys.path.insert(0, str(HERE))
from run import DEVICE, LABS, record_profile  # noqa: E402
from runner import on_labs, lab_key, lab_result, sh, splice_readme, write_csv  # noqa: E402

# The configurations whose buckets overlap the backward pass, and the steps timed.
CONFIGS = [("none", 1), ("fp16", 1), ("none", 5), ("fp16", 5)]
WARMUP, STEPS = 3, 12
# The allreduces beside which compute is timed: dtype, bytes, calls per round.
BESIDE = [("float32", 4 << 20, 16), ("float16", 4 << 20, 16)]
SCRATCH = REPO / "target" / "ddp-lab" / "timeline"


def rank_main(hook_name, bucket_mb):
    """One rank: DDP under `hook_name` with `bucket_mb` buckets; rank 0 prints the median time of
    each event from the step's start (ms)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from rank import batch, model

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    net = model(10, True)
    ddp = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=bucket_mb)
    inner = {"none": default_hooks.allreduce_hook, "fp16": default_hooks.fp16_compress_hook}[hook_name]
    events = {}

    def mark(name):
        events[name] = time.perf_counter()

    def hook(state, bucket):
        index = bucket.index()
        mark(f"ready {index}")
        future = inner(state, bucket)

        def done(f):
            mark(f"done {index}")
            return f.value()

        return future.then(done)

    ddp.register_comm_hook(None, hook)
    # The first layer's gradients are the backward pass's last.
    for p in net[0].parameters():
        p.register_post_accumulate_grad_hook(lambda _: mark("backward"))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    steps = []
    for step in range(WARMUP + STEPS):
        x, y = batch(rank, step, 256)
        dist.barrier()
        events.clear()
        start = time.perf_counter()
        F.cross_entropy(ddp(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        mark("step")
        if step >= WARMUP:
            steps.append({name: (t - start) * 1e3 for name, t in events.items()})
    if rank == 0:
        print("RESULT " + json.dumps({name: statistics.median(s[name] for s in steps) for name in steps[-1]}),
              flush=True)
    dist.barrier()
    time.sleep(0.1)
    dist.destroy_process_group()


def slowdown_main(dtype_name, size, calls):
    """One rank: its compute rate alone over its rate during `calls` allreduces of `size` bytes of
    `dtype_name` (the sweep's compute thread), the median of 5 rounds; rank 0 prints every
    rank's."""
    import torch
    import torch.distributed as dist
    from syncopate.torch.sweep import FP16_START, Computing, compute_rate

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    dtype = getattr(torch, dtype_name)
    buffer = torch.empty(size * 8 // torch.finfo(dtype).bits, dtype=dtype)

    def allreduces():
        for _ in range(calls):
            # From float16's smallest normal value before each call, the sums stay numbers.
            buffer.fill_(FP16_START)
            dist.all_reduce(buffer)

    ratios = []
    with Computing() as computing:
        for _ in range(5):
            alone, during = compute_rate(computing, lambda: time.sleep(1.0)), compute_rate(computing, allreduces)
            ratios.append(alone / during if alone > 0 and during > 0 else float("nan"))
    mine = torch.tensor([statistics.median(ratios)])
    every = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"ratios": [float(r) for r in every]}), flush=True)
    dist.barrier()
    time.sleep(0.1)
    dist.destroy_process_group()


def predicted_events(opts, nodes, gbps, hook, bucket, profile):
    """The same events in the simulator's trace of the configuration (`profile` names its device
    relative to this folder): a bucket is done when its decode (fp16) or allreduce ends, the
    backward pass when its last step does and the step when the optimizer does, from the start of
    the iteration's first step; the median over the trace's iterations after the first (each
    draws its ranks' skew). (When a bucket is ready the run records and the table leaves out:
    the trace names no bucket's gradients.)"""
    trace = SCRATCH / f"trace-{lab_key(nodes, gbps)}-{hook}-{bucket}.json"
    compressor, codecs = ("fp16", "pytorch-ddp") if hook == "fp16" else ("none", "native")
    sh([opts.syncopate, "simulate", "--model", profile, "--cluster",
        HERE / "clusters" / f"lab-{lab_key(nodes, gbps)}-gloo.json", "--nodes", nodes, "--gpus-per-node", 1,
        "--strategy", "ddp", "--bucket-mb", bucket, "--first-bucket-mb", bucket, "--compressor", compressor,
        "--framework", "pytorch-ddp", "--codecs", codecs, "--trace", trace, "--trace-ranks", 1],
       f"simulate {nodes} nodes {hook} {bucket} MB", 300, cwd=HERE)
    iterations = {}
    for e in json.loads(trace.read_text())["traceEvents"]:
        if e.get("ph") == "X" and "iteration" in e.get("args", {}):
            iterations.setdefault(e["args"]["iteration"], []).append(e)
    per_iteration = []
    for index in sorted(iterations)[1:]:
        tasks = iterations[index]
        origin = min(e["ts"] for e in tasks)
        events = {}
        for e in tasks:
            end = (e["ts"] + e["dur"] - origin) / 1e3
            words = e["name"].split()
            # A decode ends after its allreduce: the later of the two is when the bucket is done.
            key = {"bwd": "backward", "optimizer": "step"}.get(words[0])
            if words[0] in ("allreduce", "decode"):
                key = f"done {words[1][1:].split('.')[0]}"
            if key:
                events[key] = max(events.get(key, 0.0), end)
        per_iteration.append(events)
    if not per_iteration:
        raise RuntimeError(f"{trace}: no whole iteration after the first")
    return {name: statistics.median(events[name] for events in per_iteration) for name in per_iteration[-1]}


def measure(opts):
    """Each lab's profile recorded, then every configuration run once on it and predicted; then
    compute timed beside each lab's allreduces."""
    rows, beside = [], []
    for name, nodes, gbps in LABS:
        profile = SCRATCH / f"mlp-w{nodes}.json"
        sh(record_profile(opts)(nodes, profile), f"recording the profile at {nodes} ranks", 600)
        for hook, bucket in CONFIGS:
            what = f"{nodes} nodes {hook} {bucket} MB"
            measured = lab_result(opts.syncopate, name, 120, ["env", "OMP_NUM_THREADS=1", opts.python, __file__,
                                                              "--rank", hook, str(bucket)], what)
            if measured is None:
                raise RuntimeError(f"{what}: the run hung")
            predicted = predicted_events(opts, nodes, gbps, hook, bucket, profile)
            buckets = {e for e in measured if e.startswith("done ")}
            if buckets != {e for e in predicted if e.startswith("done ")}:
                raise RuntimeError(f"{what}: the run's buckets ({len(buckets)}) are not the plan's "
                                   f"({sorted(e for e in predicted if e.startswith('done '))})")
            print(f"{what}: step {measured['step']:.1f} ms measured, {predicted['step']:.1f} predicted", flush=True)
            for event in sorted(measured, key=measured.get):
                rows.append({"nodes": nodes, "hook": hook, "bucket_mb": bucket, "event": event,
                             "measured_ms": round(measured[event], 1),
                             "predicted_ms": round(predicted[event], 1) if event in predicted else ""})
        cluster = json.loads((HERE / "clusters" / f"lab-{lab_key(nodes, gbps)}-gloo.json").read_text())
        for dtype, size, calls in BESIDE:
            what = f"{nodes} nodes: compute beside {size} B {dtype} allreduces"
            measured = lab_result(opts.syncopate, name, 300, ["env", "OMP_NUM_THREADS=1", opts.python, __file__,
                                                              "--slowdown", dtype, str(size), str(calls)], what)
            if measured is None:
                raise RuntimeError(f"{what}: the run hung")
            beside.append({"nodes": nodes, "dtype": dtype, "size_bytes": size,
                           "slowdown_median": round(statistics.median(measured["ratios"]), 3),
                           "slowdown_min": round(min(measured["ratios"]), 3),
                           "slowdown_max": round(max(measured["ratios"]), 3),
                           "cluster_file": round(cluster["contention"]["compute_slowdown_with_collective"], 3)})
    write_csv(HERE / "timeline.csv", rows)
    write_csv(HERE / "compute-beside-gloo.csv", beside)


def report():
    """The `timeline` block of README.md from timeline.csv: per configuration, when the backward
    pass ends, how far the predicted end of each bucket lies from the measured one, and when the
    last bucket is done and the step ends (timeline.csv has every event)."""
    configs = {}
    for r in csv.DictReader(open(HERE / "timeline.csv")):
        configs.setdefault((r["nodes"], r["hook"], r["bucket_mb"]), {})[r["event"]] = r
    lines = ["| nodes | hook | bucket MB | backward ends, measured / predicted ms | buckets done, predicted − "
             "measured ms: median (range) | last bucket done | step ends | error |",
             "|---|---|---|---|---|---|---|---|"]
    for (nodes, hook, bucket), events in configs.items():
        both = {e: (float(r["measured_ms"]), float(r["predicted_ms"])) for e, r in events.items() if r["predicted_ms"]}
        done = sorted((e for e in both if e.startswith("done ")), key=lambda e: int(e.split()[1]))
        gaps = [both[e][1] - both[e][0] for e in done]
        pair = lambda e: f"{both[e][0]:.1f} / {both[e][1]:.1f}"  # noqa: E731
        lines.append(f"| {nodes} | {hook} | {bucket} | {pair('backward')} | {statistics.median(gaps):+.1f} "
                     f"({min(gaps):+.1f} to {max(gaps):+.1f}) | {pair(done[-1])} | {pair('step')} | "
                     f"{both['step'][1] / both['step'][0] - 1:+.1%} |")
    lines += ["", "| nodes | allreduces beside compute | compute slowdown, median over ranks (range) | "
              "cluster file's `compute_slowdown_with_collective` |", "|---|---|---|---|"]
    for r in csv.DictReader(open(HERE / "compute-beside-gloo.csv")):
        lines.append(f"| {r['nodes']} | {int(r['size_bytes']) >> 20} MiB {r['dtype']} | {r['slowdown_median']} "
                     f"({r['slowdown_min']}–{r['slowdown_max']}) | {r['cluster_file']} |")
    splice_readme(HERE / "README.md", lines, block="timeline")


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--rank":
        rank_main(sys.argv[2], float(sys.argv[3]))
        return
    if len(sys.argv) == 5 and sys.argv[1] == "--slowdown":
        slowdown_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--syncopate", default=str(REPO / "target" / "release" / "syncopate"))
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--report-only", action="store_true", help="only rewrite README.md's table from timeline.csv")
    opts = p.parse_args()
    if not opts.report_only:
        SCRATCH.mkdir(parents=True, exist_ok=True)
        on_labs(opts, LABS, SCRATCH / "clusters", DEVICE, lambda: measure(opts))
    report()


if __name__ == "__main__":
    main()
