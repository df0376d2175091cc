"""What the lab experiments' run.py scripts share.

That is running a command with its output in the error, refusing a debug build of the package,
bringing labs up and down, sweeping gloo on them and fitting to the sweeps, training on them,
keeping the median of several profile recordings or scaling one to a run's compute, the measured
iterations of a trace, the statistics the predicted-against-measured tables report, writing a
CSV, and splicing a generated block into a README.
"""

import csv
import json
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys

import svgplot

TRAINER = pathlib.Path(__file__).resolve().parent / "train.py"


def repeated_lab_arguments(parser, repo, report_only_help):
    """lab_experiment_arguments and the interleaved repeats' count and seed; `parse` checks them."""
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0, help="the interleaving order's seed")
    lab_experiment_arguments(parser, repo, report_only_help)


def parse_repeated(parser, lab_only):
    """The options of a parser set up by repeated_lab_arguments, checked; the flag `lab_only`
    (a dest name) runs on labs, and goes with neither --repredict nor --report-only."""
    opts = parser.parse_args()
    if opts.repeats < 1:
        parser.error(f"--repeats: {opts.repeats} is not a positive integer")
    if getattr(opts, lab_only) and (opts.repredict or opts.report_only):
        parser.error(f"--{lab_only} runs on labs: it goes with neither --repredict nor --report-only")
    return opts


def plot_predicted_vs_measured(here, title, groups):
    """`here`/predicted-vs-measured.svg: for each (label, rows) of `groups`, the measured and
    predicted iteration times of the rows that measured one."""
    series = []
    for label, rows in groups:
        points = [(r["measured_ms"], r["predicted_ms"]) for r in rows if r["measured_ms"] is not None]
        if points:
            series.append({"label": label, "points": points, "line": False})
    svgplot.chart(pathlib.Path(here) / "predicted-vs-measured.svg", title,
                  "measured ms per iteration (median over repeats)", "predicted ms per iteration", series,
                  diagonal=True)


def lab_experiment_arguments(parser, repo, report_only_help):
    """The arguments every predicted-against-measured lab experiment takes: the CLI, the ranks'
    interpreter, --report-only and --repredict."""
    parser.add_argument("--syncopate", default=str(pathlib.Path(repo) / "target" / "release" / "syncopate"))
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--report-only", action="store_true", help=report_only_help)
    parser.add_argument("--repredict", action="store_true",
                        help="refit the gloo cluster files to the committed sweeps and predict the committed runs "
                             "again (no lab, no root), then rewrite the tables")


def sh(args, what, timeout, cwd=None):
    """Runs a command; raises with its output when it fails; returns its stdout."""
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, cwd=cwd)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {' '.join(map(str, args))}\n{done.stdout}\n{done.stderr}")
    return done.stdout


RELEASE_WHEEL = ("target/pyenv/bin/maturin build --release -m python/Cargo.toml -o target/wheels-release && "
                 "target/pyenv/bin/pip install --force-reinstall --no-deps target/wheels-release/syncopate-*.whl")


def require_release_package(python, pythonpath=None):
    """Stops unless `python` imports a release build of the syncopate package (`.ci/run`
    installs a debug one for the tests): a debug build's codecs run several times slower, and
    a timed run would measure the build rather than the plan."""
    env = dict(os.environ, **({"PYTHONPATH": str(pythonpath)} if pythonpath else {}))
    probe = subprocess.run([str(python), "-c", "import syncopate._syncopate as s; print(s.release_build())"],
                           capture_output=True, text=True, env=env, timeout=120)
    if probe.returncode != 0:
        raise SystemExit(f"{python} cannot import the syncopate package (python/setup-env): {probe.stderr.strip()[-400:]}")
    if probe.stdout.strip() != "True":
        raise SystemExit(f"{python} imports a debug build of the syncopate package; install a release build: {RELEASE_WHEEL}")


def end_on_sigterm():
    """SIGTERM ends the run like Ctrl-C: through the caller's `finally`, which removes its labs."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def lab_up(syncopate, name, nodes, gbps, device, cluster_out, cwd):
    """Brings up lab `name` (`nodes` namespaces, links shaped to `gbps` per direction) and writes
    its fitted cluster file `cluster_out`, naming the device profile `device` (both relative to `cwd`)."""
    print(f"lab up {name}: {nodes} nodes at {gbps:g} Gb/s", flush=True)
    sh([syncopate, "lab", "up", "--name", name, "--nodes", nodes, "--gbps", gbps, "--device", device,
        "--cluster-out", cluster_out], f"lab up {name}", 900, cwd=cwd)
    # Without the `mpi` feature `lab up` measures no contention and no allreduce sweep, and the
    # predictions would silently lack them.
    if "contention" not in json.loads((pathlib.Path(cwd) / cluster_out).read_text()):
        raise RuntimeError(f"{syncopate} was built without the `mpi` feature: lab up {name} measured no contention "
                           "(cargo build --release --features mpi)")


def labs_down(syncopate, names):
    """Removes the labs `names` (a lab that is not up is no error here: this runs in `finally`)."""
    for name in names:
        subprocess.run([str(syncopate), "lab", "down", "--name", name], capture_output=True, timeout=120)


def lab_python(syncopate, name, python, args, what, timeout_s):
    """Runs `python args` once per node of lab `name`, one torch thread per rank; the lab stops
    every rank after `timeout_s`. Raises with the output when it fails."""
    return sh([syncopate, "lab", "run", "--name", name, "--timeout-s", timeout_s, "--", "env", "OMP_NUM_THREADS=1",
               python, *args], what, timeout_s + 100)


def lab_train(syncopate, name, python, args, what, timeout_s):
    """Runs the digits trainer with `args` on lab `name` (see lab_python)."""
    return lab_python(syncopate, name, python, [TRAINER, *args], what, timeout_s)


def cpu_times():
    """This machine's CPU time since boot from /proc/stat: (stolen, total) in clock ticks. A
    virtual machine's hypervisor steals time for other tenants; the share stolen during a run
    says how much of its spread is theirs."""
    fields = [int(x) for x in pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is already in user)
    return fields[7], sum(fields[:8])


def stolen_pct(before, after):
    """The share of CPU time the hypervisor stole between two cpu_times() readings, in %."""
    total = after[1] - before[1]
    return round((after[0] - before[0]) / total * 100, 1) if total > 0 else 0.0


def lab_result(syncopate, name, timeout_s, command, what):
    """Runs `command` once per node of lab `name` and returns the JSON that rank 0 prints after
    `RESULT `, or None when the lab stopped the ranks after `timeout_s` (a run that hung).
    Raises with the output on any other failure."""
    args = [syncopate, "lab", "run", "--name", name, "--timeout-s", timeout_s, "--", *command]
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout_s + 60)
    if done.returncode != 0 and "timed out" in done.stderr:
        return None
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in done.stdout.splitlines() if "RESULT " in line]
    if len(results) != 1:
        raise RuntimeError(f"{what}: expected one RESULT line from rank 0, got:\n{done.stdout}")
    return results[0]


# The sizes timed again beside compute: those that move bytes (`beside_compute::FROM_BYTES` up).
BESIDE_COMPUTE_SIZES = "64K,256K,1M,4M"


def sweep_gloo(syncopate, python, name, sweep, busy, alone_args=(), gathers="wrapper"):
    """Times gloo's allreduce and allgather on lab `name` as the wrapper calls them (`python -m
    syncopate.torch.sweep`, one rank per node; allgather as FSDP2 calls it with `gathers`
    "tensor"), alone into the CSV file `sweep` and with every rank computing beside them into
    `busy`, and the wrapper's parameter-server push-pull alone (into `sweep`; `alone_args`, the
    sweep's --ops and --sizes, say otherwise)."""
    print(f"gloo sweep on {name}", flush=True)
    module = ["-m", "syncopate.torch.sweep", "--gathers", gathers]
    lab_python(syncopate, name, python, [*module, *alone_args, "--out", sweep], f"gloo sweep on {name}", 900)
    lab_python(syncopate, name, python, [*module, "--beside-compute", "--ops", "allreduce,allgather",
                                         "--sizes", BESIDE_COMPUTE_SIZES, "--out", busy],
               f"gloo sweep beside compute on {name}", 900)


def fit_gloo(syncopate, python, name, cluster, clusters):
    """Sweeps gloo on lab `name` into the files beside the lab's MPI cluster file
    `clusters/CLUSTER.json` and refits it to them (`refit_gloo`)."""
    sweep, busy = f"{cluster}.gloo-sweep.csv", f"{cluster}.gloo-sweep-beside-compute.csv"
    sweep_gloo(syncopate, python, name, pathlib.Path(clusters) / sweep, pathlib.Path(clusters) / busy)
    refit_gloo(syncopate, cluster, clusters)


# The measured columns of a sweep, and the digits each keeps.
SWEEP_MEASURES = {"time_us": 1, "compute_slowdown": 3}


def median_sweep(paths, dest):
    """Writes to `dest` each (op, gpus, size) of the sweeps `paths` with the median of each of
    its measured columns over them (its time, and beside compute the compute's slowdown), in the
    first sweep's row order: sweeps taken at several moments of an experiment on a machine whose
    speed drifts. Sweeps that measured different columns are an error."""
    sweeps = {p: list(csv.DictReader(open(p))) for p in paths}
    measured = {p: [c for c in SWEEP_MEASURES if c in (rows[0] if rows else {})] for p, rows in sweeps.items()}
    first = next(iter(paths))
    for path, columns in measured.items():
        if columns != measured[first]:
            raise RuntimeError(f"{path} measured {', '.join(columns)} where {first} measured "
                               f"{', '.join(measured[first])}: its sweeps are of different kinds")

    def key(row):
        return row["op"], row["gpus"], row["size_bytes"]

    values = {}
    for rows in sweeps.values():
        for row in rows:
            for column in measured[first]:
                values.setdefault((key(row), column), []).append(float(row[column]))
    rows = [{**row, **{c: round(statistics.median(values[(key(row), c)]), SWEEP_MEASURES[c]) for c in measured[first]}}
            for row in sweeps[first]]
    write_csv(dest, rows)


def refit_gloo(syncopate, cluster, clusters):
    """Fits `clusters/CLUSTER-gloo.json` to the gloo sweeps `clusters/CLUSTER.gloo-sweep.csv` and
    `CLUSTER.gloo-sweep-beside-compute.csv` beside the lab's MPI cluster file
    `clusters/CLUSTER.json` (no lab needed: an experiment's committed sweeps can be refitted by a
    newer Syncopate): the file to predict with, its collectives' slowdown beside compute
    measured with gloo and its cost per point-to-point message fitted to the push-pulls."""
    sweep, busy = f"{cluster}.gloo-sweep.csv", f"{cluster}.gloo-sweep-beside-compute.csv"
    sh([syncopate, "collective", "--cluster", f"{cluster}.json", "--library", "gloo", "--compare", sweep,
        "--beside-compute", busy, "--fit-out", f"{cluster}-gloo.json"], f"gloo fit of {cluster}", 300, cwd=clusters)


def lab_key(nodes, gbps):
    """A lab's name in file names: `2n-1g`."""
    return f"{nodes}n-{gbps:g}g"


class SampledInputs:
    """The inputs of a predicted-against-measured lab experiment, sampled before every repeat:
    this machine's speed drifts by tens of percent within an hour, so each lab's gloo sweeps and
    the model's profile (recorded with as many ranks computing at once as the lab has) are taken
    again before each repeat, into `scratch`, and the prediction uses their medians, committed
    under `here` (`clusters/lab-KEY.gloo-sweep*.csv` and their gloo fit, `profiles/MODEL-wN.json`)."""

    def __init__(self, here, scratch, labs, model):
        self.here, self.scratch, self.labs, self.model = pathlib.Path(here), pathlib.Path(scratch), labs, model

    def profile_path(self, nodes):
        return self.here / "profiles" / f"{self.model}-w{nodes}.json"

    def sweep_path(self, nodes, gbps, repeat, beside):
        kind = "gloo-sweep-beside-compute" if beside else "gloo-sweep"
        return self.scratch / "sweeps" / f"lab-{lab_key(nodes, gbps)}.{kind}.r{repeat}.csv"

    def recording_path(self, nodes, repeat):
        return self.scratch / f"{self.model}-w{nodes}-r{repeat}.json"

    def sample(self, opts, repeat, record, sweep_args=(), gathers="wrapper"):
        """Before repeat `repeat`: each lab's gloo sweeps (`sweep_gloo` with `sweep_args` and
        `gathers`), then the command `record(nodes, out)` run on this machine for each lab's rank
        count (torchrun on localhost; no communication is timed)."""
        (self.scratch / "sweeps").mkdir(parents=True, exist_ok=True)
        for name, nodes, gbps in self.labs:
            sweep_gloo(opts.syncopate, opts.python, name, self.sweep_path(nodes, gbps, repeat, False),
                       self.sweep_path(nodes, gbps, repeat, True), sweep_args, gathers)
        for _, nodes, _ in self.labs:
            sh(record(nodes, self.recording_path(nodes, repeat)), f"recording the profile at {nodes} ranks", 600)

    def settle(self, opts, repeats):
        """The inputs the prediction uses, from those sampled before each of `repeats`: per lab
        the median of each size over the gloo sweeps and the gloo fit to them; per rank count the
        recording of median compute."""
        (self.here / "profiles").mkdir(exist_ok=True)
        for _, nodes, gbps in self.labs:
            cluster = f"lab-{lab_key(nodes, gbps)}"
            for beside in (False, True):
                kind = "gloo-sweep-beside-compute" if beside else "gloo-sweep"
                median_sweep([self.sweep_path(nodes, gbps, r, beside) for r in repeats],
                             self.here / "clusters" / f"{cluster}.{kind}.csv")
            refit_gloo(opts.syncopate, cluster, self.here / "clusters")
            keep_median_recording([self.recording_path(nodes, r) for r in repeats], self.profile_path(nodes),
                                  f"profile at {nodes} ranks")

    def refit(self, opts):
        """Each lab's gloo file refitted to its committed sweeps (no lab needed)."""
        for _, nodes, gbps in self.labs:
            refit_gloo(opts.syncopate, f"lab-{lab_key(nodes, gbps)}", self.here / "clusters")


def on_labs(opts, labs, clusters, device, work):
    """Brings `labs` up (root needed), their cluster files into `clusters` naming the device
    profile `device`, runs `work()`, and takes the labs down whatever happens."""
    if os.geteuid() != 0:
        sys.exit("the labs need root (network namespaces): run with sudo, or --repredict / --report-only")
    end_on_sigterm()
    try:
        clusters = pathlib.Path(clusters)
        clusters.mkdir(parents=True, exist_ok=True)
        for name, nodes, gbps in labs:
            lab_up(opts.syncopate, name, nodes, gbps, os.path.relpath(device, clusters),
                   f"lab-{lab_key(nodes, gbps)}.json", clusters)
        return work()
    finally:
        labs_down(opts.syncopate, [name for name, _, _ in labs])


def measure_or_repredict(opts, inputs, clusters, device, work, predict, predict_after=True):
    """What a repeated lab experiment does before its report: with --repredict, the committed
    runs predicted again without a lab (each lab's gloo file refitted to its committed sweeps,
    then `predict(opts)`); unless --report-only, `work()` on `inputs`' labs brought up with their
    cluster files in `clusters`, then `predict(opts)` when `predict_after`."""
    if opts.repredict:
        inputs.refit(opts)
        predict(opts)
    elif not opts.report_only:
        on_labs(opts, inputs.labs, clusters, device, work)
        if predict_after:
            predict(opts)


def run_compute_ms(runs, key):
    """Per configuration (`key(row)`), the median compute of its runs (ms), where they measured it."""
    found = {}
    for r in runs:
        if r.get("compute_ms"):
            found.setdefault(key(r), []).append(float(r["compute_ms"]))
    return {k: statistics.median(v) for k, v in found.items()}


def write_predictions(here, predicted):
    """`here`/predictions.json: every configuration's predicted summaries, keys sorted."""
    (pathlib.Path(here) / "predictions.json").write_text(json.dumps(predicted, indent=1, sort_keys=True) + "\n")


def runs_and_predictions(here):
    """The committed runs (`here`/results.csv rows) and predictions (`here`/predictions.json)."""
    here = pathlib.Path(here)
    return list(csv.DictReader(open(here / "results.csv"))), json.loads((here / "predictions.json").read_text())


def compared(runs, entry, framework, parts):
    """A configuration's runs (rows of results.csv) beside its predictions (`entry`: the
    predicted summaries under `framework`, under no framework, and with the runs' compute): the
    median measured time with its range, the predictions and their errors, and the `parts` of
    the framework's prediction."""
    times = [float(r["iteration_ms"]) for r in runs if r["iteration_ms"] not in ("hung", "not run")]
    stolen = [float(r["stolen_pct"]) for r in runs if r.get("stolen_pct")]
    computes = [float(r["compute_ms"]) for r in runs if r.get("compute_ms")]
    measured = statistics.median(times) if times else None
    predicted, bare = entry[framework]["iteration_time_ms"], entry["none"]["iteration_time_ms"]
    scaled = entry["run-compute"]["iteration_time_ms"] if "run-compute" in entry else None

    def error(value):
        return (value / measured - 1) * 100 if measured and value else None

    return {"runs": len(times), "hung": sum(r["iteration_ms"] == "hung" for r in runs),
            "stolen_pct": statistics.median(stolen) if stolen else None, "measured_ms": measured,
            "min_ms": min(times, default=None), "max_ms": max(times, default=None), "predicted_ms": predicted,
            "error_pct": error(predicted), "predicted_no_framework_ms": bare, "error_no_framework_pct": error(bare),
            "run_compute_ms": statistics.median(computes) if computes else None, "predicted_run_compute_ms": scaled,
            "error_run_compute_pct": error(scaled), **{f"predicted_{k}": entry[framework][k] for k in parts}}


def compared_cells(row, parts):
    """A `compared` row's table cells after its configuration's: measured (range, runs),
    predicted and error, without the framework and error, the predicted `parts` (ms), the runs'
    compute, predicted with it and error, and the CPU stolen."""
    runs = f"{row['runs']} runs" + (f", {row['hung']} hung" if row["hung"] else "")
    measured = (f"{row['measured_ms']:.1f} ({row['min_ms']:.1f}–{row['max_ms']:.1f}, {runs})" if row["measured_ms"]
                else f"– ({runs})")
    return [measured, f"{row['predicted_ms']:.1f}", f"{fmt(row['error_pct'], '+.1f')} %",
            f"{row['predicted_no_framework_ms']:.1f}", f"{fmt(row['error_no_framework_pct'], '+.1f')} %",
            " / ".join(f"{row[f'predicted_{part}']:.1f}" for part in parts), fmt(row["run_compute_ms"]),
            fmt(row["predicted_run_compute_ms"]), f"{fmt(row['error_run_compute_pct'], '+.1f')} %",
            f"{fmt(row['stolen_pct'])} %"]


def error_lines(rows, fields):
    """For each (field, label) of `fields`, the line giving the median, 90th percentile and
    largest |error| of the `rows` that measured something."""
    measured = [r for r in rows if r["measured_ms"] is not None]
    lines = []
    for field, label in fields:
        errors = [abs(r[field]) for r in measured if r[field] is not None]
        if errors:
            lines.append(f"- Predicted {label}: median |error| **{statistics.median(errors):.1f} %**, 90th percentile "
                         f"{p90(errors):.1f} %, largest {max(errors):.1f} % over the {len(errors)} measured "
                         "configurations.")
    return lines


def compute_us(profile):
    """A loaded profile's compute per iteration (forward, backward, optimizer), in µs."""
    return sum(t["forward_us"] + t["backward_us"] for t in profile["tensors"]) + profile["optimizer_us"]


def profile_total(path):
    """The compute per iteration of the profile in file `path`, in µs."""
    return compute_us(json.loads(pathlib.Path(path).read_text()))


def scaled_profile(path, compute_ms, out):
    """The profile in file `path` with every time scaled so that its compute per iteration is
    `compute_ms`, written to `out`: the per-tensor shape of the recording, the level a run
    measured."""
    profile = json.loads(pathlib.Path(path).read_text())
    factor = compute_ms * 1e3 / compute_us(profile)
    for tensor in profile["tensors"]:
        tensor["forward_us"] *= factor
        tensor["backward_us"] *= factor
    profile["optimizer_us"] *= factor
    profile["description"] += f"; every time scaled by {factor:.3f} to the compute measured in the runs"
    out = pathlib.Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(profile, indent=1) + "\n")
    return out


def ranks(values):
    """Ranks from 1, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    result = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            result[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return result


def spearman(xs, ys):
    """Spearman's rank correlation (Pearson's on the ranks); None when either side is constant."""
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return sxy / (sxx * syy) ** 0.5 if sxx and syy else None


def p90(values):
    """The 90th percentile, linearly interpolated between the sorted values (syncopate_sim::base::stats)."""
    ordered = sorted(values)
    position = 0.9 * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def fmt(value, spec=".1f", empty="–"):
    return empty if value is None else format(value, spec)


def keep_median_recording(paths, dest, what):
    """Copies the recording of median compute among the profiles `paths` to `dest`: the machine
    is shared, and one recording can catch another job's burst."""
    ranked = sorted(paths, key=profile_total)
    totals = ", ".join(f"{profile_total(p) / 1e3:.2f}" for p in ranked)
    print(f"{what}: compute {totals} ms per iteration; keeping the median", flush=True)
    shutil.copyfile(ranked[len(ranked) // 2], dest)


def measured_iterations(trace, log, checked):
    """The trace's iteration times without the first iteration of each epoch (it follows the
    previous epoch's evaluation), the `checked` iterations and the one after them (their
    all-gathers of every rank's gradients are not part of the plan, and an iteration's time
    carries the tail of the one before: syncopate_sim::inputs::real_run). The trace itself measures from
    the iteration after the one that follows its warm-up."""
    summary = json.loads(pathlib.Path(trace).read_text())["otherData"]
    per_epoch = log["epochs"][0]["iterations"]
    first = summary["warmup_iterations"] + 1
    times = summary["iteration_times_ms"]
    total = sum(e["iterations"] for e in log["epochs"])
    if len(times) != total - first:
        raise RuntimeError(f"{trace}: {len(times)} iteration times for {total} iterations measured from {first}")
    return [t for k, t in zip(range(first, total), times) if k % per_epoch != 0 and k > checked]


def write_csv(path, rows):
    """Rows (dicts) as CSV; the columns are the last row's (the fullest), missing cells empty."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[-1]), restval="")
        writer.writeheader()
        writer.writerows(rows)


def splice_readme(path, lines, block="results"):
    """Replaces what lies between the README's `<!-- BLOCK:begin -->` and `<!-- BLOCK:end -->`
    markers with `lines`."""
    begin, end = f"<!-- {block}:begin -->", f"<!-- {block}:end -->"
    text = path.read_text()
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    path.write_text(head + begin + "\n" + "\n".join(lines) + "\n" + end + tail)
