"""The wrapper's overhead against PyTorch DDP on the lab.

For the plans DDP can express (its buckets, without a hook, with fp16_compress_hook and with
powerSGD_hook), the same model and batches are trained by DDP and by syncopate.torch under the
equivalent plan, interleaved and repeated.

Needs root (network namespaces), the release CLI (`cargo build --release`) and the package built
in release mode into target/pyenv (docs/guide/training.md). Writes
results.csv, README.md's results and overhead.svg here. One command:

    sudo target/pyenv/bin/python experiments/ddp-overhead/run.py
"""

import argparse
import csv
import pathlib
import random
import statistics
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "experiments" / "digits"))
import svgplot  # noqa: E402
from runner import end_on_sigterm, fit_gloo, lab_result, require_release_package, sh, splice_readme, write_csv  # noqa: E402
RANK = HERE / "rank.py"
COMPRESSORS = [("none", "none"), ("fp16", "none"), ("powersgd:4", "residual")]
ENGINES = ["ddp", "syncopate"]


def plans(opts):
    """The model's profile (one process) and, per compressor, the ddp strategy's plan for the lab's
    gloo fit."""
    sh([*rank_command(opts), "--profile", HERE / "model.json"], "recording the profile", 600)
    (HERE / "plans").mkdir(exist_ok=True)
    for compressor, memory in COMPRESSORS:
        sh([opts.syncopate, "simulate", "--model", "model.json", "--cluster", "lab-gloo.json", "--strategy", "ddp",
            "--compressor", compressor, "--memory", memory, "--save-plan", f"plans/{slug(compressor)}.json"],
           f"plan for {compressor}", 300, cwd=HERE)


def slug(compressor):
    return compressor.replace(":", "-")


def rank_command(opts):
    """rank.py under the chosen interpreter, one thread, with --pythonpath when given."""
    env = ["OMP_NUM_THREADS=1"] + ([f"PYTHONPATH={opts.pythonpath}"] if opts.pythonpath else [])
    return ["env", *env, opts.python, RANK]


# A run's bound: 25 iterations and the start take under 20 s here. DDP's powerSGD_hook can
# deadlock on gloo (its callbacks wait for the next allreduce on gloo's two worker threads; README.md).
RUN_TIMEOUT_S = 60


def run_one(opts, engine, compressor):
    """One run of `iterations` steps on the lab; the median of rank 0's step times, or None when
    the run did not finish within RUN_TIMEOUT_S."""
    command = [*rank_command(opts), "--engine", engine, "--compressor", compressor, "--iterations", opts.iterations]
    if engine == "syncopate":
        command += ["--plan", HERE / "plans" / f"{slug(compressor)}.json"]
    result = lab_result(opts.syncopate, opts.lab, RUN_TIMEOUT_S, command, f"{engine} {compressor}")
    return result["iteration_ms"] if result else None


def measure(opts):
    rows = []
    configs = [(e, c) for c, _ in COMPRESSORS for e in ENGINES]
    order = random.Random(opts.seed)
    for repeat in range(opts.repeats):
        # Interleaved: every configuration once per repeat, in a fresh order.
        for engine, compressor in order.sample(configs, len(configs)):
            ms = run_one(opts, engine, compressor)
            print(f"  repeat {repeat}: {engine:9} {compressor:10} " + (f"{ms:8.1f} ms" if ms else "hung"), flush=True)
            rows.append({"repeat": repeat, "engine": engine, "compressor": compressor,
                         "iteration_ms": round(ms, 3) if ms else "hung"})
    write_csv(HERE / "results.csv", rows)


def summary():
    """Per compressor: each engine's median and range over the repeats, and the overhead of the
    wrapper's median over DDP's."""
    rows = list(csv.DictReader(open(HERE / "results.csv")))
    table = []
    for compressor, _ in COMPRESSORS:
        runs = {e: [r["iteration_ms"] for r in rows if r["engine"] == e and r["compressor"] == compressor] for e in ENGINES}
        times = {e: [float(t) for t in r if t != "hung"] for e, r in runs.items()}
        hung = {e: len(r) - len(times[e]) for e, r in runs.items()}
        medians = {e: statistics.median(t) if t else None for e, t in times.items()}
        overhead = (medians["syncopate"] / medians["ddp"] - 1) * 100 if all(medians.values()) else None
        table.append({"compressor": compressor, "times": times, "hung": hung, "runs": runs, "medians": medians,
                      "overhead_pct": overhead})
    return table


def cell(row, engine):
    """A table cell: median (range), and how many runs hung."""
    times, hung = row["times"][engine], row["hung"][engine]
    text = f"{statistics.median(times):.1f} ({min(times):.1f}–{max(times):.1f})" if times else "–"
    return text + (f", {hung} of {len(row['runs'][engine])} runs hung" if hung else "")


def write_readme(table, opts):
    lines = ["| plan (ddp buckets) | DDP (ms per iteration) | syncopate.torch (ms) | overhead |", "|---|---|---|---|"]
    for row in table:
        lines.append(f"| {row['compressor']} | {cell(row, 'ddp')} | {cell(row, 'syncopate')} | "
                     + (f"{row['overhead_pct']:+.1f} % |" if row["overhead_pct"] is not None else "– |"))
    runs = len(table[0]["runs"]["ddp"])
    lines += ["", f"Median (range) over {runs} interleaved repeats of {opts.iterations} measured iterations each; "
              f"overhead = syncopate.torch's median / DDP's − 1; a run that did not finish within {RUN_TIMEOUT_S} s "
              "counts as hung."]
    splice_readme(HERE / "README.md", lines)


def plot(table):
    """Every repeat's pair of times, DDP's against the wrapper's, one series per plan (a repeat
    with a hung run has no point); above the diagonal the wrapper is slower."""
    series = []
    for row in table:
        runs = zip(row["runs"]["ddp"], row["runs"]["syncopate"])
        pairs = [(float(d), float(w)) for d, w in runs if "hung" not in (d, w)]
        if pairs:
            series.append({"label": row["compressor"], "points": pairs, "line": False})
    svgplot.chart(HERE / "overhead.svg", "Iteration time on a 2-node lab: syncopate.torch against DDP",
                  "DDP ms per iteration", "syncopate.torch ms per iteration", series, diagonal=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--syncopate", default=str(REPO / "target" / "release" / "syncopate"))
    p.add_argument("--python", default=str(REPO / "target" / "pyenv" / "bin" / "python"))
    p.add_argument("--pythonpath", help="PYTHONPATH for the ranks (a syncopate package unpacked from a wheel, say)")
    p.add_argument("--lab", default="ddpov", help="the lab's name (its network namespaces are named after it)")
    p.add_argument("--gbps", type=float, default=1.0, help="the lab's link rate")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--seed", type=int, default=0, help="the interleaving order's seed")
    p.add_argument("--reuse", action="store_true", help="rewrite the summary from results.csv without measuring")
    opts = p.parse_args()
    if opts.repeats < 1 or opts.iterations < 1 or not opts.gbps > 0:
        p.error("--repeats and --iterations must be at least 1, --gbps positive")
    if not opts.reuse:
        end_on_sigterm()
        for tool in (opts.syncopate, opts.python):
            if not pathlib.Path(tool).exists():
                sys.exit(f"{tool} is missing: see this file's docstring")
        require_release_package(opts.python, opts.pythonpath)
        try:
            sh([opts.syncopate, "lab", "up", "--name", opts.lab, "--nodes", 2, "--gbps", opts.gbps, "--cluster-out", "lab.json"],
               "lab up", 900, cwd=HERE)
            # Both engines talk gloo: the plans are made for the lab's gloo fit (DDP on gloo runs
            # two buckets at once, on ProcessGroupGloo's two worker threads).
            fit_gloo(opts.syncopate, opts.python, opts.lab, "lab", HERE)
            plans(opts)
            measure(opts)
        finally:
            subprocess.run([opts.syncopate, "lab", "down", "--name", opts.lab], capture_output=True, timeout=120)
    table = summary()
    write_readme(table, opts)
    plot(table)
    for row in table:
        print(f"{row['compressor']:10} ddp {cell(row, 'ddp')}  syncopate {cell(row, 'syncopate')}")


if __name__ == "__main__":
    main()
