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
import statistics
import sys

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "experiments" / "digits"))
import svgplot  # noqa: E402
from runner import (cpu_times, end_on_sigterm, fmt, keep_median_recording, lab_experiment_arguments,  # noqa: E402
                    lab_result, lab_up, labs_down, median_sweep, p90, refit_gloo, scaled_profile, sh, spearman,
                    splice_readme, stolen_pct, sweep_gloo, write_csv)

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


def lab_key(nodes, gbps):
    return f"{nodes}n-{gbps:g}g"


def profile_path(nodes):
    return HERE / "profiles" / f"mlp-w{nodes}.json"


def rank_command(python):
    return ["env", "OMP_NUM_THREADS=1", python, RANK, *MODEL]


def sweep_path(nodes, gbps, repeat, beside):
    kind = "gloo-sweep-beside-compute" if beside else "gloo-sweep"
    return SCRATCH / "sweeps" / f"lab-{lab_key(nodes, gbps)}.{kind}.r{repeat}.csv"


def recording_path(nodes, repeat):
    return SCRATCH / f"mlp-w{nodes}-r{repeat}.json"


def sample_inputs(opts, repeat):
    """Before repeat `repeat`: each lab's gloo sweeps (alone and beside compute), and the model's
    profile at 2 and 4 ranks computing at once on this machine (torchrun on localhost; no
    communication is timed), so that the prediction sees the compute each rank gets when the
    ranks share the cores."""
    (SCRATCH / "sweeps").mkdir(parents=True, exist_ok=True)
    for name, nodes, gbps in LABS:
        sweep_gloo(opts.syncopate, opts.python, name, sweep_path(nodes, gbps, repeat, False),
                   sweep_path(nodes, gbps, repeat, True))
    for _, nodes, _ in LABS:
        sh(["env", "OMP_NUM_THREADS=1", opts.python, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", nodes, RANK, *MODEL, "--profile", recording_path(nodes, repeat), "--profile-device",
            os.path.relpath(DEVICE, HERE), "--warmup", WARMUP, "--iterations", ITERATIONS],
           f"recording the profile at {nodes} ranks", 600)


def settle_inputs(opts, repeats):
    """The inputs the prediction uses, from those sampled before each of `repeats`: per lab the
    median of each size over the gloo sweeps (committed beside the lab's cluster file) and the
    gloo fit to them; per rank count the recording of median compute."""
    (HERE / "profiles").mkdir(exist_ok=True)
    for _, nodes, gbps in LABS:
        cluster = f"lab-{lab_key(nodes, gbps)}"
        for beside in (False, True):
            kind = "gloo-sweep-beside-compute" if beside else "gloo-sweep"
            median_sweep([sweep_path(nodes, gbps, r, beside) for r in repeats],
                         HERE / "clusters" / f"{cluster}.{kind}.csv")
        refit_gloo(opts.syncopate, cluster, HERE / "clusters")
        keep_median_recording([recording_path(nodes, r) for r in repeats], profile_path(nodes),
                              f"profile at {nodes} ranks")


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
            sample_inputs(opts, repeat)
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


def run_compute_ms(runs):
    """Per configuration (row_key), the median compute of its runs (ms), where they measured it."""
    found = {}
    for r in runs:
        if r.get("compute_ms"):
            found.setdefault(row_key(r), []).append(float(r["compute_ms"]))
    return {k: statistics.median(v) for k, v in found.items()}


def predict(opts):
    """Each configuration's predicted iteration on its lab's gloo fit: the `ddp` strategy's plan
    for the bucket size (first bucket too, as PyTorch 2.15 caps it when bucket_cap_mb is given)
    and compressor, run by the `pytorch-ddp` framework, with the profile of the lab's rank count
    settled from the recordings before each repeat; the same with no framework costs
    (`--framework none`); and, where the runs measured their compute, with the profile scaled to
    it."""
    predicted = {}
    measured_compute = run_compute_ms(list(csv.DictReader(open(HERE / "results.csv"))))
    for _, nodes, gbps in LABS:
        for hook, compressor, memory in HOOKS:
            for bucket in BUCKETS_MB:
                key = f"{lab_key(nodes, gbps)}-{hook}-{bucket}mb"
                profiles = {"pytorch-ddp": profile_path(nodes), "none": profile_path(nodes)}
                compute = measured_compute.get((nodes, gbps, hook, bucket))
                if compute:
                    profiles["run-compute"] = scaled_profile(profile_path(nodes), compute,
                                                             SCRATCH / "scaled" / f"{key}.json")
                entry = {}
                for label, profile in profiles.items():
                    framework = "none" if label == "none" else "pytorch-ddp"
                    # DDP's own fp16 hook as it is written (profiles/codecs/pytorch-ddp.json), its ops
                    # priced by the framework; PowerSGD's hook is not written there: our codec's costs.
                    codecs = "pytorch-ddp" if framework != "none" and hook == "fp16" else "native"
                    out = json.loads(sh([opts.syncopate, "simulate", "--model", os.path.relpath(profile, HERE),
                                         "--cluster", f"clusters/lab-{lab_key(nodes, gbps)}-gloo.json", "--nodes", nodes,
                                         "--gpus-per-node", 1, "--strategy", "ddp", "--bucket-mb", bucket,
                                         "--first-bucket-mb", bucket, "--compressor", compressor, "--memory", memory,
                                         "--framework", framework, "--codecs", codecs,
                                         "--format", "json"], f"simulate {key}", 300, cwd=HERE))
                    entry[label] = {k: out[k] for k in ("iteration_time_ms", "compute_ms", "comm_ms", "compression_ms")}
                predicted[key] = entry
    (HERE / "predictions.json").write_text(json.dumps(predicted, indent=1, sort_keys=True) + "\n")


def repredict(opts):
    """The committed runs predicted again by this Syncopate, without a lab: each lab's gloo file
    refitted to its committed sweeps, then every configuration predicted again."""
    for _, nodes, gbps in LABS:
        refit_gloo(opts.syncopate, f"lab-{lab_key(nodes, gbps)}", HERE / "clusters")
    predict(opts)


def report():
    runs = list(csv.DictReader(open(HERE / "results.csv")))
    predictions = json.loads((HERE / "predictions.json").read_text())
    rows = []
    for _, nodes, gbps, hook, bucket in configs():
        mine = [r for r in runs if row_key(r) == (nodes, gbps, hook, bucket)]
        times = [float(r["iteration_ms"]) for r in mine if r["iteration_ms"] not in ("hung", "not run")]
        stolen = [float(r["stolen_pct"]) for r in mine if r.get("stolen_pct")]
        entry = predictions[f"{lab_key(nodes, gbps)}-{hook}-{bucket}mb"]
        predicted, bare = entry["pytorch-ddp"]["iteration_time_ms"], entry["none"]["iteration_time_ms"]
        scaled = entry["run-compute"]["iteration_time_ms"] if "run-compute" in entry else None
        computes = [float(r["compute_ms"]) for r in mine if r.get("compute_ms")]
        run_compute = statistics.median(computes) if computes else None
        measured = statistics.median(times) if times else None
        rows.append({"nodes": nodes, "gbps": gbps, "hook": hook, "bucket_mb": bucket, "runs": len(times),
                     "hung": sum(r["iteration_ms"] == "hung" for r in mine),
                     "stolen_pct": statistics.median(stolen) if stolen else None, "measured_ms": measured, "min_ms": min(times, default=None),
                     "max_ms": max(times, default=None), "predicted_ms": predicted,
                     "error_pct": (predicted / measured - 1) * 100 if measured else None,
                     "predicted_no_framework_ms": bare,
                     "error_no_framework_pct": (bare / measured - 1) * 100 if measured else None,
                     "run_compute_ms": run_compute, "predicted_run_compute_ms": scaled,
                     "error_run_compute_pct": (scaled / measured - 1) * 100 if measured and scaled else None,
                     **{f"predicted_{k}": entry["pytorch-ddp"][k] for k in ("compute_ms", "comm_ms", "compression_ms")}})
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
    measured = [r for r in rows if r["measured_ms"] is not None]
    lines = []
    if measured:
        for field, label in (("error_pct", "with the `pytorch-ddp` framework file"),
                             ("error_no_framework_pct", "with no framework costs (`--framework none`)"),
                             ("error_run_compute_pct", "with the framework file and the profile scaled to the "
                              "compute measured in the runs")):
            errors = [abs(r[field]) for r in measured if r[field] is not None]
            if not errors:
                continue
            lines.append(f"- Predicted {label}: median |error| **{statistics.median(errors):.1f} %**, 90th percentile "
                         f"{p90(errors):.1f} %, largest {max(errors):.1f} % over the {len(errors)} measured configurations.")
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
        runs = f"{r['runs']} runs" + (f", {r['hung']} hung" if r["hung"] else "")
        measured = (f"{r['measured_ms']:.1f} ({r['min_ms']:.1f}–{r['max_ms']:.1f}, {runs})" if r["measured_ms"]
                    else f"– ({runs})")
        lines.append(f"| {r['nodes']} | {r['hook']} | {r['bucket_mb']} | {measured} | {r['predicted_ms']:.1f} | "
                     f"{fmt(r['error_pct'], '+.1f')} % | {r['predicted_no_framework_ms']:.1f} | "
                     f"{fmt(r['error_no_framework_pct'], '+.1f')} % | {r['predicted_compute_ms']:.1f} / "
                     f"{r['predicted_comm_ms']:.1f} / {r['predicted_compression_ms']:.1f} | {fmt(r['run_compute_ms'])} | "
                     f"{fmt(r['predicted_run_compute_ms'])} | {fmt(r['error_run_compute_pct'], '+.1f')} % | "
                     f"{fmt(r['stolen_pct'])} % |")
    repeats = len({r["repeat"] for r in csv.DictReader(open(HERE / "results.csv"))})
    lines += ["", f"Median (min–max) over {repeats} interleaved repeats of the median of rank 0's step times over "
              f"{ITERATIONS} iterations after {WARMUP} warm-up; error = predicted / measured − 1; a run that did not "
              f"finish within {RUN_TIMEOUT_S} s counts as hung and its configuration is not run again; CPU stolen: the median "
              "over the runs of the share of this virtual machine's CPU time its hypervisor gave other tenants during the "
              "run (/proc/stat), where it was recorded.", ""]
    splice_readme(HERE / "README.md", lines + summary_lines(rows))


def plot(rows):
    series = []
    for (nodes, _, hook), group in groups(rows):
        points = [(r["measured_ms"], r["predicted_ms"]) for r in group if r["measured_ms"] is not None]
        if points:
            series.append({"label": f"{nodes} nodes, {hook}", "points": points, "line": False})
    svgplot.chart(HERE / "predicted-vs-measured.svg", "PyTorch DDP on the lab: Syncopate's prediction vs the runs",
                  "measured ms per iteration (median over repeats)", "predicted ms per iteration", series, diagonal=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0, help="the interleaving order's seed")
    lab_experiment_arguments(p, REPO, "only rewrite README.md and the plot from results.csv")
    p.add_argument("--more", action="store_true",
                   help="measure --repeats more repeats into results.csv on labs brought up afresh, keeping the "
                        "committed cluster files and profiles (their fits stay those of the first runs)")
    opts = p.parse_args()
    if opts.repeats < 1:
        p.error(f"--repeats: {opts.repeats} is not a positive integer")
    if opts.repredict:
        repredict(opts)
    elif not opts.report_only:
        if os.geteuid() != 0:
            sys.exit("the labs need root (network namespaces): run with sudo, or --repredict / --report-only")
        end_on_sigterm()
        try:
            clusters = SCRATCH if opts.more else HERE / "clusters"
            clusters.mkdir(parents=True, exist_ok=True)
            device = os.path.relpath(DEVICE, clusters)
            for name, nodes, gbps in LABS:
                lab_up(opts.syncopate, name, nodes, gbps, device, f"lab-{lab_key(nodes, gbps)}.json", clusters)
            if opts.more:
                measure(opts, list(csv.DictReader(open(HERE / "results.csv"))), sample=False)
            else:
                settle_inputs(opts, measure(opts, [], sample=True))
        finally:
            labs_down(opts.syncopate, [name for name, _, _ in LABS])
        predict(opts)
    rows = report()
    write_readme(rows)
    plot(rows)
    for line in summary_lines(rows):
        print(line)


if __name__ == "__main__":
    main()
