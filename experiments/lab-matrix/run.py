"""lab-matrix: issue 15's lab matrix, the digits CNN trained on 2- and 4-node labs at 1 Gb/s.

It trains under every strategy uncompressed and under six compressors with Horovod fusion and with a
tuned plan, each run checking its first iterations' aggregation. Per run it reports completed or the
error, check, accuracy, and measured and predicted time per iteration.

    sudo target/pyenv/bin/python experiments/lab-matrix/run.py            # everything (20–26 min)
    target/pyenv/bin/python experiments/lab-matrix/run.py --report-only   # results.csv and README.md from runs/
    target/pyenv/bin/python experiments/lab-matrix/run.py --repredict     # the committed runs predicted again

Needs root (network namespaces), the release CLI built with `--features mpi` (`lab up` fits each
lab's cluster file to an Open MPI allreduce sweep; a gloo sweep then refits it to gloo, the
library the ranks train over) and the package installed into target/pyenv (see docs/guide/accuracy.md, "Real training on the lab"). The labs (`mx2`, `mx4`) are brought up at the start and removed at the end, also
after an error or Ctrl-C/SIGTERM. A run that fails is recorded with its error, not skipped.
"""

import argparse
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "experiments" / "digits"))
from runner import (end_on_sigterm, fit_gloo, lab_train, lab_up, labs_down, measured_iterations, refit_gloo,  # noqa: E402
                    require_release_package, sh, splice_readme, write_csv)

# This machine's codec costs, measured by experiments/lab-validation (`syncopate profile --backend host`).
DEVICE = REPO / "experiments" / "lab-validation" / "device.json"
# The model profiles lab4-real recorded last, with 2 and 4 ranks computing at once on this
# machine (a lab's ranks share its two cores), copied here when a run starts: the ones the runs
# and their predictions used.
LAB4_PROFILES = REPO / "experiments" / "lab4-real" / "profiles"
PROFILES = HERE / "profiles"
GBPS = 1.0
LABS = [("mx2", 2), ("mx4", 4)]
# (strategy, compressor, memory): every strategy of `syncopate list strategies` uncompressed;
# the four that exist to compress run with a compressor from their papers' evaluations
# (MergeComp: EFSignSGD; HiPress: 1-bit, with error feedback; Espresso: top-k with residual).
STRATEGIES = [
    ("wfbp", "none", "none"),
    ("horovod", "none", "none"),
    ("ddp", "none", "none"),
    ("fixed-groups:2", "none", "none"),
    ("mgwfbp", "none", "none"),
    ("dear", "none", "none"),
    ("bytescheduler", "none", "none"),
    ("byteps", "none", "none"),
    ("mergecomp", "efsignsgd", "efsignsgd"),
    ("hipress:ring", "onebit", "residual"),
    ("hipress:ps", "onebit", "residual"),
    ("espresso", "topk:0.01", "residual"),
]
# Strategies of `syncopate list strategies` that no executor runs, and why.
SIMULATE_ONLY = {"ps": "its parameter servers are machines of their own, which the executors do not have"}
# (compressor, memory) of issue 15's list, each under Horovod fusion and under a tuned plan.
# DGC's warm-up (0.25 … 0.001 of the elements) lasts one epoch instead of the default five, so
# that the short runs train at 0.001 after it; its momentum correction replaces SGD's momentum
# for the parameters it corrects (train.py builds SGD from syncopate.torch.momentum.param_groups).
COMPRESSORS = [
    ("fp16", "none"),
    ("fp8:e4m3", "none"),
    ("topk:0.01", "residual"),
    ("dgc:0.001", "dgc:0.9:1"),
    ("efsignsgd", "efsignsgd"),
    ("powersgd:4", "residual"),
]
SCRATCH = REPO / "target" / "lab-matrix"  # traces (large; only their summaries are kept)
RUN_TIMEOUT_S = 600


def slug(text):
    return re.sub(r"[^a-z0-9.]+", "-", text.lower())


def configs():
    """Every run: (lab, nodes, plan kind, strategy, compressor, memory), in table order."""
    rows = []
    for lab, nodes in LABS:
        rows += [(lab, nodes, "strategy", s, c, m) for s, c, m in STRATEGIES]
        for c, m in COMPRESSORS:
            rows += [(lab, nodes, "strategy", "horovod", c, m), (lab, nodes, "tuned", "tuned", c, m)]
    return rows


def key_of(config):
    _, nodes, _, strategy, compressor, _ = config
    return f"{nodes}r-{slug(strategy)}-{slug(compressor)}"


def cluster_of(nodes, library=""):
    """The lab's cluster file: fitted to Open MPI's allreduce (`lab up`), or with library
    "-gloo" refitted to gloo's collectives as the wrapper calls them (the ranks talk gloo)."""
    return f"clusters/lab-{nodes}n-{GBPS:g}g{library}.json"


def profile_of(nodes):
    return os.path.relpath(PROFILES / f"digits-w{nodes}.json", HERE)


def check_strategy_coverage(opts):
    """Fails when `syncopate list strategies` names a strategy this matrix does not run (or
    says why it cannot)."""
    listed = {re.match(r"[a-z-]+", line).group() for line in sh([opts.syncopate, "list", "strategies"], "list strategies", 60).splitlines()
              if line.strip()}
    covered = {s.split(":")[0] for s, _, _ in STRATEGIES} | set(SIMULATE_ONLY)
    if listed != covered:
        raise SystemExit(f"the matrix's strategies {sorted(covered)} differ from `syncopate list strategies`: {sorted(listed)}")


def plan_one(opts, config):
    """Makes the config's plan for the lab's gloo fit (simulate --save-plan, or tune --search
    all) and predicts it; returns the predictions, or the error when no plan could be made."""
    _, nodes, kind, strategy, compressor, memory = config
    key = key_of(config)
    plan = f"plans/{key}.json"
    entry = {"plan": plan}
    try:
        if kind == "tuned":
            tuned = json.loads(sh([opts.syncopate, "tune", *on_lab(nodes), "--cluster", cluster_of(nodes, "-gloo"), "--compressor",
                                   compressor, "--memory", memory, "--search", "all", "--out", plan, "--format", "json"],
                                  f"tune {key}", 600, cwd=HERE))
            entry["tune_predicted_ms"] = tuned["best_iteration_time_ms"]
        else:
            sh([*simulate_on(opts, nodes), "--cluster", cluster_of(nodes, "-gloo"), "--strategy", strategy, "--compressor",
                compressor, "--memory", memory, "--save-plan", plan], f"plan {key}", 300, cwd=HERE)
        entry.update(predict_plan(opts, config, plan))
    except RuntimeError as err:
        return {**entry, "error": cause(str(err))}
    return entry


def on_lab(nodes):
    """The model and world of the lab of `nodes` nodes: its profile, one rank per node."""
    return ["--model", profile_of(nodes), "--nodes", nodes, "--gpus-per-node", 1]


def simulate_on(opts, nodes):
    """`syncopate simulate` on the lab of `nodes` nodes, compressing on this machine's CPU."""
    return [opts.syncopate, "simulate", *on_lab(nodes), "--cpu-compression", os.path.relpath(DEVICE, HERE),
            "--format", "json"]


def predict_plan(opts, config, plan):
    """The plan's predicted iteration on the lab's gloo fit and on its MPI fit, and its groups."""
    nodes, key = config[1], key_of(config)
    result = json.loads(sh([*simulate_on(opts, nodes), "--cluster", cluster_of(nodes, "-gloo"), "--plan", plan],
                           f"simulate {key}", 300, cwd=HERE))
    mpi = json.loads(sh([*simulate_on(opts, nodes), "--cluster", cluster_of(nodes), "--plan", plan],
                        f"simulate {key} (MPI fit)", 300, cwd=HERE))
    groups = json.loads((HERE / plan).read_text())["groups"]
    return {"predicted_ms": result["iteration_time_ms"], "predicted_mpi_fit_ms": mpi["iteration_time_ms"],
            "groups": len(groups), "compressed_groups": sum(g.get("compressor", "none") != "none" for g in groups)}


def repredict(opts):
    """The committed runs predicted again by this Syncopate, without a lab: each lab's gloo file
    refitted to its committed sweeps, then every plan that ran predicted again (a tuned plan's
    `tune_predicted_ms` stays what the tuner said when it chose it)."""
    for _, nodes in LABS:
        refit_gloo(opts.syncopate, pathlib.Path(cluster_of(nodes)).stem, HERE / "clusters")
    predictions = json.loads((HERE / "predictions.json").read_text())
    for config in configs():
        entry = predictions.get(key_of(config), {})
        if "plan" in entry and "error" not in entry:
            entry.update(predict_plan(opts, config, entry["plan"]))
    (HERE / "predictions.json").write_text(json.dumps(predictions, indent=1, sort_keys=True) + "\n")


def cause(output):
    """The line that says why a command failed: a rank's last Python exception (`pkg.SomeError:
    message`), else the last `error:` line (the CLI's message), else the output's first line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    exceptions = [line for line in lines if re.search(r"\b[A-Za-z_][\w.]*(Error|Exception|Failed|Gradient|Exit): ", line)
                  and not re.search(r"(^|\] )error: ", line)]
    errors = [line for line in lines if re.search(r"(^|\] )error: ", line)]
    return (exceptions or errors or lines[:1] or ["no output"])[-1][:400]


def run_one(opts, config, prediction):
    """Trains the config on its lab; writes runs/KEY.json with the trainer's log, or the error."""
    lab, nodes, *_ = config
    key = key_of(config)
    out = HERE / "runs" / f"{key}.json"
    trace = SCRATCH / f"{key}.trace.json"
    record = {"config": key, "status": "failed"}
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    if "error" in prediction:
        record["error"] = f"no plan: {prediction['error']}"
    else:
        args = ["--plan", HERE / prediction["plan"], "--model-profile", HERE / profile_of(nodes), "--epochs", opts.epochs,
                "--seed", opts.seed, "--check", opts.check, "--trace", trace, "--out", out]
        try:
            lab_train(opts.syncopate, lab, opts.python, args, key, RUN_TIMEOUT_S)
            # The plan as this directory names it, not this machine's path to it.
            record.update(json.loads(out.read_text()), status="completed", plan=prediction["plan"])
            summary = json.loads(trace.read_text())["otherData"]
            record["iteration_ms"] = measured_iterations(trace, record, opts.check)
            record["checks"] = summary["checks"]
            trace.unlink()
        except (RuntimeError, subprocess.TimeoutExpired) as err:
            record["error"] = cause(str(err))
            record["output"] = str(err)[-4000:]
    record["wall_s"] = round(time.monotonic() - started, 1)
    # The machine's 1-minute load average before and after: other jobs share its two cores.
    record["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    out.write_text(json.dumps(record, indent=1) + "\n")
    outcome = (f"final accuracy {record['epochs'][-1]['test_accuracy']:.3f}" if record["status"] == "completed"
               else f"FAILED: {record['error']}")
    print(f"  {key}: {record['wall_s']:.0f} s, {outcome}", flush=True)


def checks_passed(record, groups, check):
    """Every group of the plan checked on at least `check` iterations, and every one ok."""
    checks = record.get("checks", [])
    return len(checks) == groups and all(c["ok"] and c["checked"] >= check for c in checks)


def report(opts):
    meta = json.loads((HERE / "meta.json").read_text())
    predictions = json.loads((HERE / "predictions.json").read_text())
    rows = []
    for config in configs():
        _, nodes, kind, strategy, compressor, memory = config
        key = key_of(config)
        path = HERE / "runs" / f"{key}.json"
        record = json.loads(path.read_text()) if path.exists() else {"status": "not run", "error": "not run"}
        prediction = predictions.get(key, {})
        completed = record["status"] == "completed"
        measured = sum(record["iteration_ms"]) / len(record["iteration_ms"]) if completed else None
        rows.append({
            "config": key, "ranks": nodes, "plan": kind if kind == "tuned" else strategy, "compressor": compressor,
            "memory": memory, "status": record["status"], "error": record.get("error", ""),
            # A run stopped by a failed check (CheckFailed) counts as one whose check failed.
            "checks_passed": (checks_passed(record, prediction.get("groups", -1), meta["check"]) if completed
                              else False if "CheckFailed" in record.get("error", "") else ""),
            "groups": prediction.get("groups", ""), "compressed_groups": prediction.get("compressed_groups", ""),
            "final_accuracy_pct": round(record["epochs"][-1]["test_accuracy"] * 100, 2) if completed else "",
            "measured_iteration_ms": round(measured, 3) if completed else "",
            "predicted_iteration_ms": round(prediction["predicted_ms"], 3) if "predicted_ms" in prediction else "",
            "tune_predicted_ms": round(prediction["tune_predicted_ms"], 3) if "tune_predicted_ms" in prediction else "",
            "predicted_mpi_fit_ms": round(prediction["predicted_mpi_fit_ms"], 3) if "predicted_mpi_fit_ms" in prediction else "",
            "wall_s": record.get("wall_s", ""),
            "load_average_before": record.get("load_average", ["", ""])[0],
            "load_average_after": record.get("load_average", ["", ""])[1],
        })
    write_csv(HERE / "results.csv", rows)
    write_readme(rows, meta)


def write_readme(rows, meta):
    done = [r for r in rows if r["status"] == "completed"]
    failed_checks = [r["config"] for r in rows if r["checks_passed"] is False]
    failures = [r for r in rows if r["status"] != "completed"]
    accuracy = sorted(r["final_accuracy_pct"] for r in done)
    minutes = meta["duration_s"] / 60
    ranks = sorted({r["ranks"] for r in done})
    ratios = {n: sorted(r["measured_iteration_ms"] / r["predicted_iteration_ms"] for r in done if r["ranks"] == n) for n in ranks}
    ratios_mpi = {n: sorted(r["measured_iteration_ms"] / r["predicted_mpi_fit_ms"] for r in done if r["ranks"] == n)
                  for n in ranks}
    lines = [
        f"Run on {meta['date']}: {len(rows)} runs ({meta['epochs']} epochs, seed {meta['seed']}, check of the first "
        f"{meta['check']} iterations) in {minutes:.0f} min including the labs' bring-up and measurement; the machine's "
        f"1-minute load average during the runs was {meta['load_min']:.1f}–{meta['load_max']:.1f}.",
        "",
        f"**{len(done)} of {len(rows)} runs completed**; checks: "
        + ("all passed" if not failed_checks else f"FAILED or incomplete in {', '.join(failed_checks)}")
        + (f"; final test accuracy {accuracy[0]:.2f}–{accuracy[-1]:.2f} %" if accuracy else "")
        + (f". Failed: {', '.join(r['config'] for r in failures)}." if failures else "."),
        "",
        "Measured / predicted time per iteration (median, min–max over the runs): on the labs' gloo fits "
        + "; ".join(f"{n} ranks {statistics.median(v):.2f} ({v[0]:.2f}–{v[-1]:.2f})" for n, v in ratios.items())
        + "; on their MPI fits " + "; ".join(f"{n} ranks {statistics.median(v):.2f} ({v[0]:.2f}–{v[-1]:.2f})"
                                             for n, v in ratios_mpi.items()) + ".",
        "",
        "| ranks | plan | compressor (memory) | groups (compressed) | completed | check | final test accuracy % | "
        "measured ms/iteration | predicted ms/iteration (gloo fit) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        codec = r["compressor"] if r["memory"] == "none" else f"{r['compressor']} ({r['memory']})"
        groups = f"{r['groups']} ({r['compressed_groups']})" if r["groups"] != "" else "—"
        if r["status"] == "completed":
            status = "yes"
            check = "passed" if r["checks_passed"] else "**FAILED**"
            numbers = f"{r['final_accuracy_pct']:.2f} | {r['measured_iteration_ms']:.2f}"
        else:
            status = f"**no**: {r['error'].replace('|', '/')}"
            check = "**FAILED**" if r["checks_passed"] is False else "—"
            numbers = "— | —"
        predicted = f"{r['predicted_iteration_ms']:.2f}" if r["predicted_iteration_ms"] != "" else "—"
        lines.append(f"| {r['ranks']} | {r['plan']} | {codec} | {groups} | {status} | {check} | {numbers} | {predicted} |")
    splice_readme(HERE / "README.md", lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--check", type=int, default=2, help="iterations whose aggregation every run checks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--syncopate", default=str(REPO / "target" / "release" / "syncopate"))
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--report-only", "--reuse", action="store_true",
                   help="only rewrite results.csv and README.md from runs/, predictions.json and meta.json")
    p.add_argument("--repredict", action="store_true",
                   help="refit the gloo cluster files to the committed sweeps and predict the committed plans again "
                        "(no lab, no root), then rewrite the tables")
    opts = p.parse_args()
    if opts.epochs < 2 or opts.check < 1:
        p.error("--epochs ≥ 2 (the first iteration of each epoch is not measured) and --check ≥ 1")
    if opts.report_only:
        return report(opts)
    if opts.repredict:
        repredict(opts)
        return report(opts)
    if os.geteuid() != 0:
        raise SystemExit("lab-matrix makes network namespaces: run it as root (sudo)")
    for tool, how in ((opts.syncopate, "cargo build --release --features mpi"), (opts.python, "python/setup-env")):
        if not pathlib.Path(tool).exists():
            raise SystemExit(f"{tool} is missing: {how}")
    require_release_package(opts.python)
    check_strategy_coverage(opts)
    end_on_sigterm()
    for directory in ("runs", "plans"):
        shutil.rmtree(HERE / directory, ignore_errors=True)
        (HERE / directory).mkdir()
    shutil.copytree(LAB4_PROFILES, PROFILES, dirs_exist_ok=True)
    (HERE / "clusters").mkdir(exist_ok=True)
    SCRATCH.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    loads = []
    try:
        for lab, nodes in LABS:
            lab_up(opts.syncopate, lab, nodes, GBPS, os.path.relpath(DEVICE, HERE / "clusters"),
                   os.path.basename(cluster_of(nodes)), HERE / "clusters")
        for lab, nodes in LABS:
            fit_gloo(opts.syncopate, opts.python, lab, pathlib.Path(cluster_of(nodes)).stem, HERE / "clusters")
        predictions = {key_of(c): plan_one(opts, c) for c in configs()}
        (HERE / "predictions.json").write_text(json.dumps(predictions, indent=1, sort_keys=True) + "\n")
        print(f"{len(predictions)} plans ({time.monotonic() - started:.0f} s so far)", flush=True)
        for config in configs():
            loads.append(os.getloadavg()[0])
            run_one(opts, config, predictions[key_of(config)])
    finally:
        labs_down(opts.syncopate, [lab for lab, _ in LABS])
    meta = {"date": time.strftime("%Y-%m-%d"), "duration_s": round(time.monotonic() - started), "epochs": opts.epochs,
            "seed": opts.seed, "check": opts.check, "gbps": GBPS, "load_min": min(loads), "load_max": max(loads)}
    (HERE / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    report(opts)
    print(f"done in {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
