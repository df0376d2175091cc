"""lab4-real: the Horovod lab's table for real, with the digits CNN on emulated clusters.

The digits CNN is trained serially and at 2 and 4 ranks on emulated clusters (syncopate lab) at 1
and 0.2 Gb/s, uncompressed and with fp16, fp8 e4m3 and e5m2 under Horovod-style fusion. It reports
time per epoch, time to a target accuracy, final accuracy, and Syncopate's predicted time per
iteration beside the measured one.

    sudo target/pyenv/bin/python experiments/lab4-real/run.py            # everything (about 25 min)
    target/pyenv/bin/python experiments/lab4-real/run.py --report-only   # tables and plots from runs/
    target/pyenv/bin/python experiments/lab4-real/run.py --repredict     # the committed runs predicted again

Needs root (network namespaces), the release CLI built with `--features mpi` (`lab up` fits each
lab's cluster file to an Open MPI allreduce sweep; a gloo sweep then refits it to gloo, the
library the ranks train over) and the package installed into target/pyenv (python/setup-env,
then a release build of the extension: see docs/guide/accuracy.md, "Real training on the lab"). The labs are brought up at the start and
removed at the end, also after an error or Ctrl-C.
"""

import argparse
import json
import os
import pathlib
import random
import shutil
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "experiments" / "digits"))
import svgplot  # noqa: E402
from runner import (TRAINER, end_on_sigterm, fit_gloo, keep_median_recording, lab_experiment_arguments,  # noqa: E402
                    lab_train, lab_up, labs_down, measured_iterations, refit_gloo, require_release_package, sh,
                    splice_readme, write_csv)

# This machine's codec costs, measured by experiments/lab-validation (`syncopate profile --backend host`).
DEVICE = REPO / "experiments" / "lab-validation" / "device.json"
# (name, nodes, Gb/s): every lab is up at once, so that the runs of all of them interleave.
LABS = [("l4a", 2, 1.0), ("l4b", 2, 0.2), ("l4c", 4, 1.0), ("l4d", 4, 0.2)]
COMPRESSORS = ["none", "fp16", "fp8:e4m3", "fp8:e5m2"]
LABEL = {"none": "fp32", "fp16": "fp16", "fp8:e4m3": "fp8 e4m3", "fp8:e5m2": "fp8 e5m2"}
CHECKED = 2  # iterations whose aggregation every distributed run checks against the reference
SCRATCH = REPO / "target" / "lab4-real"  # traces (large; only their summaries are kept)


def lab_key(nodes, gbps):
    return f"{nodes}n-{gbps:g}g"


def config_key(nodes, gbps, compressor):
    return "serial" if nodes == 1 else f"{lab_key(nodes, gbps)}-{compressor.replace(':', '-')}"


# Recordings per rank count before the runs (the plans are made from them), and then one more
# before each seed's runs: the machine is shared, and its speed drifts over the experiment.
PROFILE_RECORDINGS = 3
RANK_COUNTS = (1, 2, 4)


def record_profiles(opts, tags):
    """The model profile at 1, 2 and 4 ranks computing at once on this machine (torchrun on
    localhost; no communication is timed), so that the prediction sees the compute each rank
    gets when the ranks share the cores, and (at 2 and 4 ranks) how much the ranks differ
    within an iteration (`rank_skew`). One recording per rank count and tag, the rank counts
    interleaved; returns {rank count: [recordings]}."""
    recordings = {world: [] for world in RANK_COUNTS}
    for tag in tags:
        for world in RANK_COUNTS:
            out = SCRATCH / "profiles" / f"digits-w{world}-{tag}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            # The device (a path relative to this directory, where simulate runs) is the cluster's:
            # the simulator then takes the recorded times as they are (compute_scale 1).
            common = [TRAINER, "--record-profile", out, "--profile-device", os.path.relpath(DEVICE, HERE)]
            if world == 1:
                sh([opts.python, *common], "recording the serial profile", 600)
            else:
                sh([opts.python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", world, *common],
                   f"recording the profile at {world} ranks", 600)
            recordings[world].append(out)
    return recordings


def profile_path(world, purpose):
    """profiles/digits-wN-plans.json: what the plans were made from and the ranks lowered them
    with; profiles/digits-wN.json: what the predictions price (PURPOSE "plans" or "predict")."""
    return HERE / "profiles" / (f"digits-w{world}-plans.json" if purpose == "plans" else f"digits-w{world}.json")


def keep_median_profiles(recordings, purpose):
    """Keeps, per rank count, the recording of median compute as the profile for `purpose`."""
    (HERE / "profiles").mkdir(exist_ok=True)
    for world, paths in recordings.items():
        keep_median_recording(paths, profile_path(world, purpose), f"profile at {world} rank(s)")


def labs_up(opts):
    (HERE / "clusters").mkdir(exist_ok=True)
    device = os.path.relpath(DEVICE, HERE / "clusters")
    for name, nodes, gbps in LABS:
        lab_up(opts.syncopate, name, nodes, gbps, device, f"lab-{lab_key(nodes, gbps)}.json", HERE / "clusters")
    for name, nodes, gbps in LABS:
        fit_gloo(opts.syncopate, opts.python, name, f"lab-{lab_key(nodes, gbps)}", HERE / "clusters")


def make_plans(opts):
    """A Horovod plan per lab and compressor, made for the profile at the lab's rank count on the
    lab's gloo fit: what the ranks run."""
    (HERE / "plans").mkdir(exist_ok=True)
    device = os.path.relpath(DEVICE, HERE)
    for _, nodes, gbps in LABS:
        for compressor in COMPRESSORS:
            key = config_key(nodes, gbps, compressor)
            # Paths relative to this directory, so that the plans name no machine's paths.
            sh([opts.syncopate, "simulate", "--model", os.path.relpath(profile_path(nodes, "plans"), HERE), "--cluster",
                f"clusters/lab-{lab_key(nodes, gbps)}-gloo.json", "--nodes", nodes, "--gpus-per-node", 1,
                "--strategy", "horovod", "--compressor", compressor, "--cpu-compression", device,
                "--save-plan", f"plans/{key}.json"], f"plan {key}", 300, cwd=HERE)


def predict_plans(opts):
    """The predicted iteration of each plan that ran, on its lab's gloo fit with the profile at
    the lab's rank count; also from the serial profile and on the lab's MPI fit."""
    predicted = {}
    device = os.path.relpath(DEVICE, HERE)
    for _, nodes, gbps in LABS:
        for compressor in COMPRESSORS:
            key = config_key(nodes, gbps, compressor)
            entry = {}
            for profile, library, field in ((f"digits-w{nodes}.json", "-gloo", "predicted_ms"),
                                            ("digits-w1.json", "-gloo", "predicted_serial_profile_ms"),
                                            (f"digits-w{nodes}.json", "", "predicted_mpi_fit_ms")):
                result = json.loads(sh([opts.syncopate, "simulate", "--plan", f"plans/{key}.json", "--model",
                                        f"profiles/{profile}", "--cluster", f"clusters/lab-{lab_key(nodes, gbps)}{library}.json",
                                        "--nodes", nodes, "--gpus-per-node", 1, "--cpu-compression", device,
                                        "--framework", "syncopate-torch", "--format", "json"], f"simulate {key}", 300,
                                       cwd=HERE))
                entry[field] = result["iteration_time_ms"]
                if field == "predicted_ms":
                    entry.update(predicted_compute_ms=result["compute_ms"], predicted_comm_ms=result["comm_ms"],
                                 predicted_compression_ms=result["compression_ms"], wire_bytes_per_rank=result["wire_bytes_per_rank"])
            predicted[key] = entry
    serial = json.loads(sh([opts.syncopate, "simulate", "--model", "profiles/digits-w1.json", "--cluster",
                            f"clusters/lab-{lab_key(2, 1.0)}.json", "--nodes", 2, "--gpus-per-node", 1,
                            "--strategy", "horovod", "--format", "json"], "simulate serial", 300, cwd=HERE))
    predicted["serial"] = dict.fromkeys(("predicted_ms", "predicted_serial_profile_ms", "predicted_mpi_fit_ms"),
                                        serial["single_gpu_iteration_time_ms"])
    (HERE / "predictions.json").write_text(json.dumps(predicted, indent=1, sort_keys=True) + "\n")


def repredict(opts):
    """The committed runs predicted again by this Syncopate, without a lab: each lab's gloo file
    refitted to its committed sweeps, then the plans that ran predicted again."""
    for _, nodes, gbps in LABS:
        refit_gloo(opts.syncopate, f"lab-{lab_key(nodes, gbps)}", HERE / "clusters")
    predict_plans(opts)


def run_one(opts, config, seed):
    name, nodes, gbps, compressor = config
    key = config_key(nodes, gbps, compressor)
    out = HERE / "runs" / f"{key}-s{seed}.json"
    trace = SCRATCH / f"{key}-s{seed}.trace.json"
    common = ["--epochs", opts.epochs, "--seed", seed, "--out", out]
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    if nodes == 1:
        sh(["env", "OMP_NUM_THREADS=1", opts.python, TRAINER, *common], f"{key} seed {seed}", 1200)
    else:
        lab_train(opts.syncopate, name, opts.python,
                  [*common, "--plan", HERE / "plans" / f"{key}.json", "--model-profile",
                   profile_path(nodes, "plans"), "--trace", trace, "--check", CHECKED], f"{key} seed {seed}", 1200)
    log = json.loads(out.read_text())
    log["config"] = key
    # The machine's 1-minute load average before and after: other jobs share its two cores.
    log["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    if nodes > 1:
        log["iteration_ms"] = measured_iterations(trace, log, CHECKED)
        summary = json.loads(trace.read_text())["otherData"]
        log["checks_ok"] = all(c["ok"] for c in summary["checks"])
        # Rank 0's busy time per iteration on each stream (the trace's summary).
        log["trace_ms"] = {k: summary[k] for k in ("compute_ms", "compression_ms", "comm_ms")}
        trace.unlink()
    out.write_text(json.dumps(log, indent=1) + "\n")
    print(f"  {key} seed {seed}: {time.monotonic() - started:.0f} s, final accuracy "
          f"{log['epochs'][-1]['test_accuracy']:.3f}", flush=True)


def configs():
    rows = [("", 1, 0.0, "none")]
    for name, nodes, gbps in LABS:
        rows += [(name, nodes, gbps, c) for c in COMPRESSORS]
    return rows


def spread(values):
    return f"{statistics.mean(values):.{3}g} ({min(values):.3g}–{max(values):.3g})"


def report(opts):
    predictions = json.loads((HERE / "predictions.json").read_text())
    logs = {}
    for path in sorted((HERE / "runs").glob("*.json")):
        log = json.loads(path.read_text())
        logs.setdefault(log["config"], []).append(log)
    rows, run_rows = [], []
    for _, nodes, gbps, compressor in configs():
        key = config_key(nodes, gbps, compressor)
        runs = logs.get(key, [])
        if not runs:
            continue
        epoch_s = [statistics.median(e["epoch_s"] for e in r["epochs"][1:]) for r in runs]
        final = [r["epochs"][-1]["test_accuracy"] * 100 for r in runs]
        reach = [next((e["elapsed_s"] for e in r["epochs"] if e["test_accuracy"] >= opts.target), None) for r in runs]
        if nodes == 1:
            iteration = [statistics.median(e["epoch_s"] / e["iterations"] for e in r["epochs"][1:]) * 1e3 for r in runs]
        else:
            iteration = [statistics.mean(r["iteration_ms"]) for r in runs]
        measured = statistics.median(iteration)
        predicted = predictions[key]["predicted_ms"]
        row = {
            "config": key, "ranks": nodes, "gbps": gbps if nodes > 1 else "", "compressor": LABEL[compressor],
            "seeds": len(runs), "epochs": len(runs[0]["epochs"]), "iterations_per_epoch": runs[0]["epochs"][0]["iterations"],
            "epoch_s_mean": round(statistics.mean(epoch_s), 4), "epoch_s_min": round(min(epoch_s), 4), "epoch_s_max": round(max(epoch_s), 4),
            "target_accuracy": opts.target, "reached": sum(r is not None for r in reach),
            "time_to_target_s_mean": round(statistics.mean([r for r in reach if r is not None]), 3) if any(r is not None for r in reach) else "",
            "time_to_target_s_min": round(min(r for r in reach if r is not None), 3) if any(r is not None for r in reach) else "",
            "time_to_target_s_max": round(max(r for r in reach if r is not None), 3) if any(r is not None for r in reach) else "",
            "final_accuracy_mean": round(statistics.mean(final), 2), "final_accuracy_min": round(min(final), 2),
            "final_accuracy_max": round(max(final), 2),
            "measured_iteration_ms": round(measured, 3), "measured_iteration_ms_min": round(min(iteration), 3),
            "measured_iteration_ms_max": round(max(iteration), 3), "predicted_iteration_ms": round(predicted, 3),
            "error_pct": round((predicted - measured) / measured * 100, 1),
            "predicted_serial_profile_ms": round(predictions[key]["predicted_serial_profile_ms"], 3),
            "error_serial_profile_pct": round((predictions[key]["predicted_serial_profile_ms"] - measured) / measured * 100, 1),
            "predicted_mpi_fit_ms": round(predictions[key]["predicted_mpi_fit_ms"], 3),
            "error_mpi_fit_pct": round((predictions[key]["predicted_mpi_fit_ms"] - measured) / measured * 100, 1),
            "checks_ok": all(r.get("checks_ok", True) for r in runs),
            "load_average_median": round(statistics.median(x for r in runs for x in r["load_average"]), 2),
        }
        if nodes > 1:
            # Where the time goes: rank 0's busy time per iteration on each stream (the traces'
            # summaries, median over seeds) beside the prediction's.
            for stream in ("compute", "comm", "compression"):
                row[f"measured_{stream}_ms"] = round(statistics.median(r["trace_ms"][f"{stream}_ms"] for r in runs), 3)
                row[f"predicted_{stream}_ms"] = round(predictions[key][f"predicted_{stream}_ms"], 3)
        rows.append(row)
        for r in runs:
            for e in r["epochs"]:
                run_rows.append({"config": key, "seed": r["seed"], **e})
    write_csv(HERE / "results.csv", rows)
    write_csv(HERE / "epochs.csv", run_rows)
    write_readme(rows, opts)
    plot(rows, logs)


def write_readme(rows, opts):
    distributed = [r for r in rows if r["ranks"] > 1]
    errors = sorted(abs(r["error_pct"]) for r in distributed)
    errors_serial = sorted(abs(r["error_serial_profile_pct"]) for r in distributed)
    errors_mpi = sorted(abs(r["error_mpi_fit_pct"]) for r in distributed)
    lines = [
        f"{len(rows)} configurations, {rows[0]['seeds']} seeds each, {rows[0]['epochs']} epochs; target accuracy "
        f"{opts.target * 100:g} %. Mean (min–max) over seeds; time per epoch is each run's median epoch after the first.",
        "",
        "| ranks | link | compression | time per epoch s | time to target s (runs reaching it) | final test accuracy % | measured ms/iteration (min–max) | predicted ms/iteration | error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        reach = (f"{r['time_to_target_s_mean']} ({r['time_to_target_s_min']}–{r['time_to_target_s_max']}, {r['reached']}/{r['seeds']})"
                 if r["reached"] else f"not reached (0/{r['seeds']})")
        link = f"{r['gbps']:g} Gb/s" if r["ranks"] > 1 else "—"
        lines.append(
            f"| {r['ranks']} | {link} | {r['compressor']} | {r['epoch_s_mean']:.3f} ({r['epoch_s_min']:.3f}–{r['epoch_s_max']:.3f}) | {reach} | "
            f"{r['final_accuracy_mean']:.2f} ({r['final_accuracy_min']:.2f}–{r['final_accuracy_max']:.2f}) | "
            f"{r['measured_iteration_ms']:.2f} ({r['measured_iteration_ms_min']:.2f}–{r['measured_iteration_ms_max']:.2f}) | "
            f"{r['predicted_iteration_ms']:.2f} | {r['error_pct']:+.1f} % |")
    lines += [
        "",
        f"Predicted vs measured time per iteration over the {len(distributed)} distributed configurations: median |error| "
        f"**{statistics.median(errors):.1f} %** (target ≤ 10 %), largest {errors[-1]:.1f} %. Predicted from the serial "
        f"profile instead of the profile recorded at the lab's rank count: median |error| {statistics.median(errors_serial):.1f} %, "
        f"largest {errors_serial[-1]:.1f} %. Predicted on the labs' MPI fits instead of their gloo fits (the ranks talk "
        f"gloo): median |error| {statistics.median(errors_mpi):.1f} %, largest {errors_mpi[-1]:.1f} %. The serial row's prediction is the profile's compute alone. Every distributed run "
        f"checked its first 2 iterations' aggregation against the reference: {'all passed' if all(r['checks_ok'] for r in rows) else 'SOME FAILED'}.",
    ]
    lines += [
        "",
        "Where an iteration's time goes: rank 0's busy time per iteration on each stream, measured (the traces' summaries, "
        "median over seeds) and predicted; the machine's 1-minute load average around the runs (median).",
        "",
        "| ranks | link | compression | compute ms measured / predicted | comm ms measured / predicted | compression ms measured / predicted | load average |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in distributed:
        lines.append(f"| {r['ranks']} | {r['gbps']:g} Gb/s | {r['compressor']} | {r['measured_compute_ms']:.1f} / {r['predicted_compute_ms']:.1f} | "
                     f"{r['measured_comm_ms']:.1f} / {r['predicted_comm_ms']:.1f} | {r['measured_compression_ms']:.2f} / "
                     f"{r['predicted_compression_ms']:.2f} | {r['load_average_median']:.1f} |")
    splice_readme(HERE / "README.md", lines)


def plot(rows, logs):
    distributed = [r for r in rows if r["ranks"] > 1]
    series = []
    for _, nodes, gbps in LABS:
        points = [(r["measured_iteration_ms"], r["predicted_iteration_ms"]) for r in distributed
                  if r["ranks"] == nodes and r["gbps"] == gbps]
        series.append({"label": f"{nodes} ranks, {gbps:g} Gb/s", "points": points, "line": False})
    svgplot.chart(HERE / "predicted-vs-measured.svg", "Time per iteration: Syncopate's prediction vs the lab",
                  "measured ms per iteration (median over seeds)", "predicted ms per iteration", series, diagonal=True)
    curves = []
    for key, label, dash in [("serial", "serial", None)] + [
            (config_key(n, g, c), f"{n} ranks {g:g} Gb/s {LABEL[c]}", "5 3" if g < 1 else None)
            for _, n, g in LABS for c in ("none", "fp16", "fp8:e4m3") if n == 4 or c == "none"]:
        runs = logs.get(key)
        if not runs:
            continue
        epochs = len(runs[0]["epochs"])
        points = [(statistics.mean(r["epochs"][e]["elapsed_s"] for r in runs),
                   statistics.mean(r["epochs"][e]["test_accuracy"] for r in runs) * 100) for e in range(epochs)]
        curves.append({"label": label, "points": points, "dash": dash})
    svgplot.chart(HERE / "accuracy-vs-time.svg", "Test accuracy against training time (mean over seeds)",
                  "training wall-clock time, s (evaluation excluded)", "test accuracy %", curves, y_range=(0, 100))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--target", type=float, default=0.95, help="target test accuracy (fraction)")
    lab_experiment_arguments(p, REPO, "only rewrite results.csv, README.md and the plots from runs/")
    opts = p.parse_args()
    if opts.seeds < 1 or opts.epochs < 2 or not 0 < opts.target <= 1:
        p.error("--seeds ≥ 1, --epochs ≥ 2 and --target in (0, 1]")
    if opts.report_only:
        return report(opts)
    if opts.repredict:
        repredict(opts)
        return report(opts)
    if os.geteuid() != 0:
        raise SystemExit("lab4-real makes network namespaces: run it as root (sudo)")
    if not pathlib.Path(opts.syncopate).exists():
        raise SystemExit(f"{opts.syncopate} is missing: cargo build --release --features mpi")
    require_release_package(opts.python)
    end_on_sigterm()
    shutil.rmtree(HERE / "runs", ignore_errors=True)
    (HERE / "runs").mkdir()
    # Written once the runs are done: an interrupted run leaves none to mix with its runs.
    (HERE / "predictions.json").unlink(missing_ok=True)
    SCRATCH.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        recordings = record_profiles(opts, range(PROFILE_RECORDINGS))
        keep_median_profiles(recordings, "plans")
        labs_up(opts)
        make_plans(opts)
        for seed in range(opts.seeds):
            # The profile again between the runs, so that the one kept for the prediction is
            # the median over the whole experiment, not over its first minute.
            for world, more in record_profiles(opts, [f"s{seed}"]).items():
                recordings[world] += more
            # Every configuration once per seed, in an order drawn per seed: slow phases of the
            # shared machine spread over all of them.
            order = configs()
            random.Random(seed).shuffle(order)
            print(f"seed {seed}: {len(order)} configurations ({time.monotonic() - started:.0f} s so far)", flush=True)
            for config in order:
                run_one(opts, config, seed)
    finally:
        labs_down(opts.syncopate, [name for name, _, _ in LABS])
    keep_median_profiles(recordings, "predict")
    predict_plans(opts)
    report(opts)
    print(f"done in {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
