"""ddp-lab: real PyTorch DDP (gloo) on emulated clusters, measured beside Syncopate's prediction.

The emulated clusters (syncopate lab) have 2 and 4 nodes at 1 Gb/s; DDP runs with its bucket sizes
1, 5, 25 and 100 MB without a comm hook and with its fp16 and PowerSGD hooks, each measured beside
Syncopate's prediction of the same configuration under the `pytorch-ddp` framework file.

    sudo target/pyenv/bin/python experiments/ddp-lab/run.py            # everything (about 50 min)
    target/pyenv/bin/python experiments/ddp-lab/run.py --report-only   # tables and plot from results.csv
    target/pyenv/bin/python experiments/ddp-lab/run.py --repredict     # the committed runs predicted again

Needs root (network namespaces), the release CLI built with `--features mpi` (`lab up` fits each
lab's cluster file to an Open MPI allreduce sweep; a gloo sweep then refits it to gloo, the
library DDP talks here) and the syncopate package in target/pyenv (python/setup-env; the ranks
use it only to record the model's profile and to sweep gloo). The labs are brought up at the start
and removed at the end, also after an error or Ctrl-C.
"""

import argparse
import csv
import json
import os
import pathlib
import random
import sys

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "experiments" / "digits"))
from runner import (SampledInputs, compared, compared_cells, cpu_times, error_lines, fmt, lab_key, lab_result, measure_or_repredict,  # noqa: E402
                    parse_repeated, plot_predicted_vs_measured, repeated_lab_arguments, run_compute_ms,
                    runs_and_predictions, scaled_profile, sh, spearman, splice_readme, stolen_pct, write_csv,
                    write_predictions)

RANK = REPO / "experiments" / "ddp-overhead" / "rank.py"
# This machine's codec costs, measured by experiments/lab-validation (`syncopate profile --backend host`).
DEVICE = REPO / "experiments" / "lab-validation" / "device.json"
# (name, nodes, Gb/s): both labs are up at once, so that their runs interleave.
LABS = [("dla", 2, 1.0), ("dlb", 4, 1.0)]
BUCKETS_MB = [1, 5, 25, 100]
# DDP's hook and the compressor and memory of Syncopate's plan that does what it does.
HOOKS = [("none", "none", "none"), ("fp16", "fp16", "none"), ("powersgd", "powersgd:4", "residual")]
# 10 hidden layers of 1024 with LayerNorm: 10.5 M parameters, 42 MB of fp32 gradients in 42
# tensors (weights of 4.2 MB, biases and norms of 4 KB), so that each bucket size gives DDP a
# different bucketing (10, 5, 2 and 1 buckets, the first capped like the others), and a batch whose compute (about 0.3 s on one core) is of the
# order of one allreduce of the gradients at 1 Gb/s, so that overlap decides.
MODEL = ["--layers", 10, "--norm", "--batch", 256]
WARMUP, ITERATIONS = 3, 12
# The parts of a prediction the table shows.
PARTS = ("compute_ms", "comm_ms", "compression_ms")
# Then steps without communication (DDP's no_sync) on every rank at once: the compute each rank got
# during the run. The machine is a shared virtual machine whose speed drifts by tens of percent
# over an hour (and by 2x between days), so inputs measured once before the runs are stale by the
# time a run starts: the profile and the gloo sweeps are taken again before every repeat, and the
# prediction uses the median over the repeats (`settle_inputs`).
COMPUTE_ITERATIONS = 4
# A run takes 10-25 s here. DDP's powerSGD_hook deadlocks on gloo (experiments/ddp-overhead:
# its callbacks wait for the next allreduce on gloo's two worker threads); such a run is
# stopped at this bound and counted as hung.
RUN_TIMEOUT_S = 75
SCRATCH = REPO / "target" / "ddp-lab"  # profile recordings, and the cluster files of labs brought up for --more


INPUTS = SampledInputs(HERE, SCRATCH, LABS, "mlp")
# The sweep's default collectives and the fp16 allreduce that DDP's fp16 hook calls: beside the
# fp32 one of the same bytes, it gives gloo's cost of float16 sums (`fp16_sum_ns_per_element`).
SWEEP = ("--ops", "allreduce,allgather,push-pull,push-pull-all,allreduce-fp16")


def record_profile(opts):
    """The command that records the model's profile at `nodes` ranks into `out`."""
    return lambda nodes, out: ["env", "OMP_NUM_THREADS=1", opts.python, "-m", "torch.distributed.run", "--standalone",
                               "--nproc-per-node", nodes, RANK, *MODEL, "--profile", out, "--profile-device",
                               os.path.relpath(DEVICE, HERE), "--warmup", WARMUP, "--iterations", ITERATIONS]


def rank_command(python):
    return ["env", "OMP_NUM_THREADS=1", python, RANK, *MODEL]


def row_key(row):
    """A results.csv row's configuration: (nodes, Gb/s, hook, bucket MB), as configs() names it."""
    return int(row["nodes"]), float(row["gbps"]), row["hook"], int(row["bucket_mb"])


def configs():
    return [(name, nodes, gbps, hook, bucket) for name, nodes, gbps in LABS for hook, _, _ in HOOKS
            for bucket in BUCKETS_MB]


def measure(opts, rows, sample):
    """Every configuration once per repeat after `rows` (runs already measured), in a fresh order
    seeded by the repeat, each repeat after the inputs sampled for it when `sample`; a
    configuration that hung is not run again (DDP's PowerSGD hook on gloo). Returns the repeats
    run."""
    hung = {row_key(r) for r in rows if r["iteration_ms"] == "hung"}
    first = max((int(r["repeat"]) for r in rows), default=-1) + 1
    compressor = {hook: c for hook, c, _ in HOOKS}
    repeats = range(first, first + opts.repeats)
    for repeat in repeats:
        if sample:
            INPUTS.sample(opts, repeat, record_profile(opts), SWEEP)
        order = random.Random(opts.seed * 1000 + repeat)
        for name, nodes, gbps, hook, bucket in order.sample(configs(), len(configs())):
            key = (nodes, gbps, hook, bucket)
            row = {"repeat": repeat, "nodes": nodes, "gbps": gbps, "hook": hook, "bucket_mb": bucket}
            if key in hung:
                rows.append({**row, "iteration_ms": "not run", "compute_ms": "", "stolen_pct": ""})
                continue
            command = [*rank_command(opts.python), "--engine", "ddp", "--compressor", compressor[hook],
                       "--bucket-mb", bucket, "--warmup", WARMUP, "--iterations", ITERATIONS,
                       "--compute-iterations", COMPUTE_ITERATIONS]
            before = cpu_times()
            result = lab_result(opts.syncopate, name, RUN_TIMEOUT_S, command, f"{nodes} nodes {hook} {bucket} MB")
            stolen = stolen_pct(before, cpu_times())
            if result is None:
                hung.add(key)
            ms = round(result["iteration_ms"], 3) if result else "hung"
            compute = round(result["compute_ms"], 3) if result else ""
            print(f"  repeat {repeat}: {nodes} nodes {hook:8} {bucket:3} MB  {ms}  (compute {compute}, {stolen} % "
                  "stolen)", flush=True)
            rows.append({**row, "iteration_ms": ms, "compute_ms": compute, "stolen_pct": stolen})
            write_csv(HERE / "results.csv", rows)  # after every run: an interrupted experiment keeps its runs
    return list(repeats)


def predict(opts):
    """Each configuration's predicted iteration on its lab's gloo fit: the `ddp` strategy's plan
    for the bucket size (first bucket too, as PyTorch 2.15 caps it when bucket_cap_mb is given)
    and compressor, run by the `pytorch-ddp` framework, with the profile of the lab's rank count
    settled from the recordings before each repeat; the same with no framework costs
    (`--framework none`); and, where the runs measured their compute, with the profile scaled to
    it."""
    predicted = {}
    measured_compute = run_compute_ms(list(csv.DictReader(open(HERE / "results.csv"))), row_key)
    for _, nodes, gbps in LABS:
        for hook, compressor, memory in HOOKS:
            for bucket in BUCKETS_MB:
                key = f"{lab_key(nodes, gbps)}-{hook}-{bucket}mb"
                profiles = {"pytorch-ddp": INPUTS.profile_path(nodes), "none": INPUTS.profile_path(nodes)}
                compute = measured_compute.get((nodes, gbps, hook, bucket))
                if compute:
                    profiles["run-compute"] = scaled_profile(INPUTS.profile_path(nodes), compute,
                                                             SCRATCH / "scaled" / f"{key}.json")
                entry = {}
                for label, profile in profiles.items():
                    framework = "none" if label == "none" else "pytorch-ddp"
                    # DDP's own hooks as they are written (profiles/codecs/pytorch-ddp.json), their ops
                    # priced by the framework, their fresh tensors by the device's fresh_memory.
                    codecs = "pytorch-ddp" if framework != "none" and hook != "none" else "native"
                    out = json.loads(sh([opts.syncopate, "simulate", "--model", os.path.relpath(profile, HERE),
                                         "--cluster", f"clusters/lab-{lab_key(nodes, gbps)}-gloo.json", "--nodes", nodes,
                                         "--gpus-per-node", 1, "--strategy", "ddp", "--bucket-mb", bucket,
                                         "--first-bucket-mb", bucket, "--compressor", compressor, "--memory", memory,
                                         "--framework", framework, "--codecs", codecs,
                                         "--format", "json"], f"simulate {key}", 300, cwd=HERE))
                    entry[label] = {k: out[k] for k in ("iteration_time_ms", "compute_ms", "comm_ms", "compression_ms")}
                predicted[key] = entry
    write_predictions(HERE, predicted)


def report():
    runs, predictions = runs_and_predictions(HERE)
    rows = []
    for _, nodes, gbps, hook, bucket in configs():
        mine = [r for r in runs if row_key(r) == (nodes, gbps, hook, bucket)]
        entry = predictions[f"{lab_key(nodes, gbps)}-{hook}-{bucket}mb"]
        rows.append({"nodes": nodes, "gbps": gbps, "hook": hook, "bucket_mb": bucket,
                     **compared(mine, entry, "pytorch-ddp", PARTS)})
    return rows


def groups(rows):
    """The rows of each lab and hook, in bucket order."""
    keys = sorted({(r["nodes"], r["gbps"]) for r in rows})
    return [((n, g, hook), [r for r in rows if (r["nodes"], r["gbps"], r["hook"]) == (n, g, hook)])
            for n, g in keys for hook, _, _ in HOOKS]


def effect(values):
    """How much slower the slowest bucket size is than the fastest, in %."""
    return (max(values) / min(values) - 1) * 100


def summary_lines(rows):
    lines = error_lines(rows, (("error_pct", "with the `pytorch-ddp` framework file"),
                               ("error_no_framework_pct", "with no framework costs (`--framework none`)"),
                               ("error_run_compute_pct", "with the framework file and the profile scaled to the "
                                "compute measured in the runs")))
    lines.append("- Per lab and hook, over the bucket sizes: Spearman's ρ of predicted against measured, and the bucket "
                 "effect (slowest bucket size over the fastest):")
    lines.append("")
    lines.append("| nodes | hook | ρ | ρ, run's compute | measured effect | predicted effect | fastest measured | "
                 "fastest predicted |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for (nodes, _, hook), group in groups(rows):
        done = [r for r in group if r["measured_ms"] is not None]
        predicted = [r["predicted_ms"] for r in group]
        if len(done) == len(group):
            measured = [r["measured_ms"] for r in group]
            rho = spearman(measured, predicted)
            scaled = [r["predicted_run_compute_ms"] for r in group]
            rho_scaled = spearman(measured, scaled) if None not in scaled else None
            fastest = min(group, key=lambda r: r["measured_ms"])["bucket_mb"]
            cells = [fmt(rho, ".2f"), fmt(rho_scaled, ".2f"), f"{effect(measured):.1f} %", f"{fastest} MB"]
        else:
            cells = [f"– ({len(group) - len(done)} of {len(group)} sizes hung)", "–", "–", "–"]
        fastest_predicted = min(group, key=lambda r: r["predicted_ms"])["bucket_mb"]
        lines.append(f"| {nodes} | {hook} | {cells[0]} | {cells[1]} | {cells[2]} | {effect(predicted):.1f} % | "
                     f"{cells[3]} | {fastest_predicted} MB |")
    return lines


def write_readme(rows):
    lines = ["| nodes | hook | bucket MB | measured ms (min–max, runs) | predicted ms | error | no framework ms | error |"
             " predicted compute / comm / codec ms | run's compute ms | predicted with it | error | CPU stolen |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [r["nodes"], r["hook"], r["bucket_mb"], *compared_cells(r, PARTS)]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    repeats = len({r["repeat"] for r in csv.DictReader(open(HERE / "results.csv"))})
    lines += ["", f"Median (min–max) over {repeats} interleaved repeats of the median of rank 0's step times over "
              f"{ITERATIONS} iterations after {WARMUP} warm-up; error = predicted / measured − 1; a run that did not "
              f"finish within {RUN_TIMEOUT_S} s counts as hung and its configuration is not run again; CPU stolen: the median "
              "over the runs of the share of this virtual machine's CPU time its hypervisor gave other tenants during the "
              "run (/proc/stat), where it was recorded.", ""]
    splice_readme(HERE / "README.md", lines + summary_lines(rows))


def plot(rows):
    plot_predicted_vs_measured(HERE, "PyTorch DDP on the lab: Syncopate's prediction vs the runs",
                               [(f"{nodes} nodes, {hook}", group) for (nodes, _, hook), group in groups(rows)])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    repeated_lab_arguments(p, REPO, "only rewrite README.md and the plot from results.csv")
    p.add_argument("--more", action="store_true",
                   help="measure --repeats more repeats into results.csv on labs brought up afresh, keeping the "
                        "committed cluster files and profiles (their fits stay those of the first runs)")
    opts = parse_repeated(p, "more")

    def work():
        if opts.more:
            measure(opts, list(csv.DictReader(open(HERE / "results.csv"))), sample=False)
        else:
            INPUTS.settle(opts, measure(opts, [], sample=True))

    measure_or_repredict(opts, INPUTS, SCRATCH if opts.more else HERE / "clusters", DEVICE, work, predict)
    rows = report()
    write_readme(rows)
    plot(rows)
    for line in summary_lines(rows):
        print(line)


if __name__ == "__main__":
    main()
