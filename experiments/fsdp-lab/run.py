"""fsdp-lab: real PyTorch FSDP2 (gloo) on emulated clusters, measured beside Syncopate's prediction.

The emulated clusters (syncopate lab) have 2 and 4 nodes at 1 Gb/s; a small GPT-2 is sharded by
FSDP2 as `syncopate export --to fsdp` writes each plan (units of 1, 2, 4 and 8 blocks, forward and
backward prefetch of 1 and 2 units, resharding after forward or not), each run measured beside
Syncopate's prediction of the same plan under the `pytorch-fsdp` framework file.

    sudo target/pyenv/bin/python experiments/fsdp-lab/run.py            # everything (about 40 min)
    target/pyenv/bin/python experiments/fsdp-lab/run.py --report-only   # tables and plot from results.csv
    target/pyenv/bin/python experiments/fsdp-lab/run.py --repredict     # the committed runs predicted again
    sudo target/pyenv/bin/python experiments/fsdp-lab/run.py --tuned   # what tune picks, run beside the defaults

Needs root (network namespaces), the release CLI built with `--features mpi` (`lab up` fits each
lab's cluster file to an Open MPI allreduce sweep; a gloo sweep of FSDP2's own collectives then
refits it to gloo) and the syncopate package in target/pyenv (python/setup-env; the ranks use it
only to record the model's profile and to sweep gloo). The labs are brought up at the start and
removed at the end, also after an error or Ctrl-C.
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
from runner import (SampledInputs, compared, compared_cells, cpu_times, error_lines, fmt, lab_key, lab_result, measure_or_repredict,  # noqa: E402
                    parse_repeated, plot_predicted_vs_measured, repeated_lab_arguments, run_compute_ms,
                    runs_and_predictions, scaled_profile, sh, spearman, splice_readme, stolen_pct, write_csv,
                    write_predictions)

RANK = HERE / "rank.py"
# This machine's codec costs, measured by experiments/lab-validation (`syncopate profile --backend host`).
DEVICE = REPO / "experiments" / "lab-validation" / "device.json"
# (name, nodes, Gb/s): both labs are up at once, so that their runs interleave.
LABS = [("fla", 2, 1.0), ("flb", 4, 1.0)]
# (blocks per unit, prefetch, reshard after forward): FSDP's default wrapping (a unit per block,
# one unit prefetched, resharded) and what `tune --framework fsdp` varies. With 8 blocks there is
# one unit beside the root, and nothing further to prefetch.
SETTINGS = [(1, 1, True), (1, 2, True), (2, 1, True), (2, 2, True), (4, 1, True), (4, 2, True), (8, 1, True),
            (1, 1, False)]
# FSDP's defaults among SETTINGS, against which `--tuned` measures what `tune` picks.
DEFAULTS = (1, 1, True)
# Offsets the tuned check's interleaving from the main runs'.
TUNED_SEED = 100
# Sequences of 128 tokens per rank and iteration: about 0.25 s of compute on one core, of the
# order of the 0.36 s its 30 MB of parameters take to be gathered twice and reduce-scattered once
# at 2 nodes of 1 Gb/s, so that how the gathers overlap the compute decides.
BATCH = 4
WARMUP, ITERATIONS, COMPUTE_ITERATIONS = 3, 12, 4
# The parts of a prediction the table shows.
PARTS = ("compute_ms", "comm_ms")
# The sizes FSDP2's collectives move here: units of 1 to 8 blocks (3.1 to 25 MB) and the root's
# 5.3 MB, and below them the sizes that give the fit its fixed costs.
SWEEP = ["--ops", "allreduce,allgather,reduce-scatter", "--sizes", "4K,16K,64K,256K,1M,4M,8M,16M,32M",
         "--iterations", "5", "--rounds", "3"]
# A run takes 10-30 s here; one that has not finished by then has hung.
RUN_TIMEOUT_S = 120
SCRATCH = REPO / "target" / "fsdp-lab"  # recordings, plans and settings files, scaled profiles


def setting_key(nodes, gbps, blocks, prefetch, reshard):
    return f"{lab_key(nodes, gbps)}-u{blocks}-p{prefetch}-{'reshard' if reshard else 'keep'}"


INPUTS = SampledInputs(HERE, SCRATCH, LABS, "gpt2")


def record_profile(opts):
    """The command that records the model's profile at `nodes` ranks into `out`."""
    return lambda nodes, out: ["env", "OMP_NUM_THREADS=1", opts.python, "-m", "torch.distributed.run", "--standalone",
                               "--nproc-per-node", nodes, RANK, "--batch", BATCH, "--profile", out, "--profile-device",
                               os.path.relpath(DEVICE, HERE), "--warmup", WARMUP, "--iterations", ITERATIONS]


def plan_flags(nodes, blocks, prefetch, reshard):
    return ["--nodes", nodes, "--gpus-per-node", 1, "--strategy", "fsdp", "--blocks-per-unit", blocks, "--prefetch",
            prefetch, "--reshard-after-forward", str(reshard).lower()]


def export_settings(opts, profile, nodes, gbps, blocks, prefetch, reshard):
    """The FSDP2 settings file of the plan for the model `profile` records (`syncopate export
    --to fsdp`), which the runs load: the runs execute the plan the prediction prices. Stops if
    the export cannot express all of it."""
    key = setting_key(nodes, gbps, blocks, prefetch, reshard)
    plan, settings = SCRATCH / "plans" / f"{key}.json", SCRATCH / "plans" / f"{key}.py"
    plan.parent.mkdir(parents=True, exist_ok=True)
    sh([opts.syncopate, "simulate", "--model", os.path.relpath(profile, HERE), "--cluster",
        f"clusters/lab-{lab_key(nodes, gbps)}.json", *plan_flags(nodes, blocks, prefetch, reshard), "--save-plan", plan],
       f"plan {key}", 300, cwd=HERE)
    report = json.loads(sh([opts.syncopate, "export", "--plan", plan, "--to", "fsdp", "--out", settings, "--format",
                            "json"], f"export {key}", 300, cwd=HERE))
    if report["not_expressed"]:
        raise RuntimeError(f"export {key}: FSDP2 cannot express {report['not_expressed']}")
    return settings


def row_key(row):
    """A results.csv row's configuration, as configs() names it."""
    return (int(row["nodes"]), float(row["gbps"]), int(row["blocks"]), int(row["prefetch"]),
            row["reshard"] == "True")


def configs():
    return [(name, nodes, gbps, *setting) for name, nodes, gbps in LABS for setting in SETTINGS]


def run_settings(opts, name, settings, what):
    """One run on lab `name` of the model sharded by the settings file `settings`: rank 0's
    median step time (or "hung"), the compute the ranks got and the CPU time stolen, in ms and %."""
    command = ["env", "OMP_NUM_THREADS=1", opts.python, RANK, "--settings", settings, "--batch", BATCH, "--warmup",
               WARMUP, "--iterations", ITERATIONS, "--compute-iterations", COMPUTE_ITERATIONS]
    before = cpu_times()
    result = lab_result(opts.syncopate, name, RUN_TIMEOUT_S, command, what)
    stolen = stolen_pct(before, cpu_times())
    ms = round(result["iteration_ms"], 3) if result else "hung"
    compute = round(result["compute_ms"], 3) if result else ""
    print(f"  {what}: {ms} ms (compute {compute}, {stolen} % stolen)", flush=True)
    return {"iteration_ms": ms, "compute_ms": compute, "stolen_pct": stolen}


def measure(opts, sample):
    """Every configuration once per repeat, in a fresh order seeded by the repeat, each repeat
    after the inputs sampled for it when `sample`; a configuration that hung is not run again.
    Returns the repeats run."""
    rows, hung = [], set()
    settings = {}
    repeats = range(opts.repeats)
    for repeat in repeats:
        if sample:
            INPUTS.sample(opts, repeat, record_profile(opts), SWEEP, gathers="tensor")
        order = random.Random(opts.seed * 1000 + repeat)
        for name, nodes, gbps, blocks, prefetch, reshard in order.sample(configs(), len(configs())):
            key = (nodes, gbps, blocks, prefetch, reshard)
            row = {"repeat": repeat, "nodes": nodes, "gbps": gbps, "blocks": blocks, "prefetch": prefetch,
                   "reshard": reshard}
            if key in hung:
                rows.append({**row, "iteration_ms": "not run", "compute_ms": "", "stolen_pct": ""})
                continue
            if key not in settings:
                # The units are the model's, whatever the recording's times.
                settings[key] = export_settings(opts, INPUTS.recording_path(nodes, 0), *key)
            what = f"{nodes} nodes, {blocks} blocks a unit, prefetch {prefetch}, reshard {reshard}"
            measured = run_settings(opts, name, settings[key], f"repeat {repeat}: {what}")
            if measured["iteration_ms"] == "hung":
                hung.add(key)
            rows.append({**row, **measured})
            write_csv(HERE / "results.csv", rows)  # after every run: an interrupted experiment keeps its runs
    return list(repeats)


def tune(opts, nodes, gbps):
    """`syncopate tune --framework fsdp --search all` on the lab's committed gloo fit and profile:
    its report (the tuned settings and their predicted iteration beside FSDP's defaults'), with
    the tuned settings exported to a file the runs load."""
    key = lab_key(nodes, gbps)
    settings = SCRATCH / "tuned" / f"{key}.py"
    settings.parent.mkdir(parents=True, exist_ok=True)
    report = json.loads(sh([opts.syncopate, "tune", "--model", os.path.relpath(INPUTS.profile_path(nodes), HERE), "--cluster",
                            f"clusters/lab-{key}-gloo.json", "--nodes", nodes, "--gpus-per-node", 1, "--framework",
                            "fsdp", "--search", "all", "--export", settings, "--format", "json"],
                           f"tune {key}", 600, cwd=HERE))
    if report["not_expressed"]:
        raise RuntimeError(f"tune {key}: FSDP2 cannot express {report['not_expressed']}")
    return report, settings


def measure_tuned(opts):
    """On labs brought up afresh: per lab, the settings `tune` picks and FSDP's defaults (a unit
    per block, prefetch 1, resharded), each run once per repeat in a fresh seeded order, into
    tuned.csv; the tune reports into tuned.json."""
    runs, reports = {}, {}
    for name, nodes, gbps in LABS:
        reports[lab_key(nodes, gbps)], runs[(name, nodes, gbps, "tuned")] = tune(opts, nodes, gbps)
        runs[(name, nodes, gbps, "defaults")] = export_settings(opts, INPUTS.profile_path(nodes), nodes, gbps, *DEFAULTS)
    (HERE / "tuned.json").write_text(json.dumps(reports, indent=1, sort_keys=True) + "\n")
    rows = []
    for repeat in range(opts.repeats):
        order = random.Random(opts.seed * 1000 + TUNED_SEED + repeat)
        for name, nodes, gbps, which in order.sample(sorted(runs), len(runs)):
            measured = run_settings(opts, name, runs[(name, nodes, gbps, which)],
                                    f"repeat {repeat}: {nodes} nodes, {which}")
            rows.append({"repeat": repeat, "nodes": nodes, "gbps": gbps, "settings": which, **measured})
            write_csv(HERE / "tuned.csv", rows)


def tuned_lines():
    """The tuned check's table: per lab, the settings tune picked, predicted and measured
    beside FSDP's defaults."""
    reports = json.loads((HERE / "tuned.json").read_text())
    runs = list(csv.DictReader(open(HERE / "tuned.csv")))
    lines = ["| nodes | tuned settings | predicted ms: tuned / defaults | predicted gain | measured ms: tuned (min–max) | "
             "defaults (min–max) | measured gain |", "|---|---|---|---|---|---|---|"]
    for _, nodes, gbps in LABS:
        report = reports[lab_key(nodes, gbps)]
        times = {which: [float(r["iteration_ms"]) for r in runs if int(r["nodes"]) == nodes
                         and r["settings"] == which and r["iteration_ms"] != "hung"] for which in ("tuned", "defaults")}
        tuned, defaults = (statistics.median(t) if t else None for t in (times["tuned"], times["defaults"]))
        predicted, predicted_defaults = report["iteration_ms"], report["compared_with"]["iteration_ms"]

        def cell(which, median):
            return f"{median:.1f} ({min(times[which]):.1f}–{max(times[which]):.1f})" if median else "–"

        gain = f"{(1 - tuned / defaults) * 100:.1f} %" if tuned and defaults else "–"
        lines.append(f"| {nodes} | {report['settings']} | {predicted:.1f} / {predicted_defaults:.1f} | "
                     f"{(1 - predicted / predicted_defaults) * 100:.1f} % | {cell('tuned', tuned)} | "
                     f"{cell('defaults', defaults)} | {gain} |")
    repeats = len({r["repeat"] for r in runs})
    return lines + ["", f"Median (min–max) over {repeats} interleaved repeats; gain = 1 − tuned / defaults."]


def predict(opts):
    """Each configuration's predicted iteration on its lab's gloo fit: the `fsdp` strategy's plan
    for its units, prefetch and resharding, run by the `pytorch-fsdp` framework (the strategy's
    default), with the profile of the lab's rank count settled from the recordings before each
    repeat; the same with no framework costs (`--framework none`); and, where the runs measured
    their compute, with the profile scaled to it."""
    predicted = {}
    measured_compute = run_compute_ms(list(csv.DictReader(open(HERE / "results.csv"))), row_key)
    for _, nodes, gbps, blocks, prefetch, reshard in configs():
        key = setting_key(nodes, gbps, blocks, prefetch, reshard)
        profiles = {"pytorch-fsdp": INPUTS.profile_path(nodes), "none": INPUTS.profile_path(nodes)}
        compute = measured_compute.get((nodes, gbps, blocks, prefetch, reshard))
        if compute:
            profiles["run-compute"] = scaled_profile(INPUTS.profile_path(nodes), compute, SCRATCH / "scaled" / f"{key}.json")
        entry = {}
        for label, profile in profiles.items():
            framework = "none" if label == "none" else "pytorch-fsdp"
            out = json.loads(sh([opts.syncopate, "simulate", "--model", os.path.relpath(profile, HERE), "--cluster",
                                 f"clusters/lab-{lab_key(nodes, gbps)}-gloo.json",
                                 *plan_flags(nodes, blocks, prefetch, reshard), "--framework", framework,
                                 "--format", "json"], f"simulate {key}", 300, cwd=HERE))
            entry[label] = {k: out[k] for k in ("iteration_time_ms", "compute_ms", "comm_ms")}
        predicted[key] = entry
    write_predictions(HERE, predicted)


def report():
    runs, predictions = runs_and_predictions(HERE)
    rows = []
    for _, nodes, gbps, blocks, prefetch, reshard in configs():
        mine = [r for r in runs if row_key(r) == (nodes, gbps, blocks, prefetch, reshard)]
        entry = predictions[setting_key(nodes, gbps, blocks, prefetch, reshard)]
        rows.append({"nodes": nodes, "gbps": gbps, "blocks": blocks, "prefetch": prefetch, "reshard": reshard,
                     **compared(mine, entry, "pytorch-fsdp", PARTS)})
    return rows


def setting_label(row):
    return f"{row['blocks']} / {row['prefetch']} / {'yes' if row['reshard'] else 'no'}"


def summary_lines(rows):
    lines = error_lines(rows, (("error_pct", "with the `pytorch-fsdp` framework file"),
                               ("error_no_framework_pct", "with no framework costs (`--framework none`)"),
                               ("error_run_compute_pct", "with the framework file and the profile scaled to the "
                                "compute measured in the runs")))
    lines += ["- Per lab, over the settings: Spearman's ρ of predicted against measured, and the fastest setting "
              "(blocks a unit / prefetch / reshard):", "",
              "| nodes | ρ | ρ, run's compute | fastest measured | fastest predicted | measured spread | predicted spread |",
              "|---|---|---|---|---|---|---|"]
    for nodes in sorted({r["nodes"] for r in rows}):
        group = [r for r in rows if r["nodes"] == nodes]
        done = [r for r in group if r["measured_ms"] is not None]
        predicted = [r["predicted_ms"] for r in done]
        measured_times = [r["measured_ms"] for r in done]
        scaled = [r["predicted_run_compute_ms"] for r in done]
        rho = spearman(measured_times, predicted) if len(done) > 1 else None
        rho_scaled = spearman(measured_times, scaled) if len(done) > 1 and None not in scaled else None
        fastest = setting_label(min(done, key=lambda r: r["measured_ms"])) if done else "–"
        spread = f"{(max(measured_times) / min(measured_times) - 1) * 100:.1f} %" if done else "–"
        lines.append(f"| {nodes} | {fmt(rho, '.2f')} | {fmt(rho_scaled, '.2f')} | {fastest} | "
                     f"{setting_label(min(group, key=lambda r: r['predicted_ms']))} | {spread} | "
                     f"{(max(r['predicted_ms'] for r in group) / min(r['predicted_ms'] for r in group) - 1) * 100:.1f} % |")
    return lines


def write_readme(rows):
    lines = ["| nodes | blocks a unit / prefetch / reshard | measured ms (min–max, runs) | predicted ms | error | "
             "no framework ms | error | predicted compute / comm ms | run's compute ms | predicted with it | error | "
             "CPU stolen |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| " + " | ".join(map(str, [r["nodes"], setting_label(r), *compared_cells(r, PARTS)])) + " |")
    repeats = len({r["repeat"] for r in csv.DictReader(open(HERE / "results.csv"))})
    lines += ["", f"Median (min–max) over {repeats} interleaved repeats of the median of rank 0's step times over "
              f"{ITERATIONS} iterations after {WARMUP} warm-up; error = predicted / measured − 1; a run that did not "
              f"finish within {RUN_TIMEOUT_S} s counts as hung; CPU stolen: the median over the runs of the share of "
              "this virtual machine's CPU time its hypervisor gave other tenants during the run (/proc/stat).", ""]
    splice_readme(HERE / "README.md", lines + summary_lines(rows))


def plot(rows):
    groups = [(f"{nodes} nodes", [r for r in rows if r["nodes"] == nodes]) for nodes in sorted({r["nodes"] for r in rows})]
    plot_predicted_vs_measured(HERE, "PyTorch FSDP2 on the lab: Syncopate's prediction vs the runs", groups)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    repeated_lab_arguments(p, REPO, "only rewrite README.md and the plot from results.csv")
    p.add_argument("--tuned", action="store_true",
                   help="on labs brought up afresh, measure the settings `tune --framework fsdp` picks from the "
                        "committed inputs beside FSDP's defaults (tuned.csv), keeping the committed runs and fits")
    opts = parse_repeated(p, "tuned")

    def work():
        if opts.tuned:
            measure_tuned(opts)
        else:
            INPUTS.settle(opts, measure(opts, sample=True))

    # The tuned check keeps the committed cluster files: its labs' go to the scratch folder, and
    # it predicts nothing new.
    measure_or_repredict(opts, INPUTS, SCRATCH / "clusters" if opts.tuned else HERE / "clusters", DEVICE, work,
                         predict, predict_after=not opts.tuned)
    rows = report()
    write_readme(rows)
    if (HERE / "tuned.csv").exists():
        splice_readme(HERE / "README.md", tuned_lines(), "tuned")
    plot(rows)
    for line in summary_lines(rows):
        print(line)


if __name__ == "__main__":
    main()
