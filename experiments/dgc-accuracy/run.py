"""dgc-accuracy: accuracy of the digits CNN at 4 ranks, uncompressed and under DGC and others.

The runs are fp32, DGC at 0.1 % (momentum correction, warm-up), top-k 1 % with and without error
feedback, signSGD, EF-signSGD and PowerSGD rank 4; the results are accuracy against epochs and
wall-clock time, and final accuracy over seeds.

    target/pyenv/bin/python experiments/dgc-accuracy/run.py               # everything (about 15 min)
    target/pyenv/bin/python experiments/dgc-accuracy/run.py --report-only # tables and plots from runs/
    target/pyenv/bin/python experiments/dgc-accuracy/run.py --study dgc    # why DGC falls behind (about 20 min)
    target/pyenv/bin/python experiments/dgc-accuracy/run.py --study error-feedback    # top-k with and without it

The 4 ranks run with torchrun on localhost (accuracy does not depend on the network); every run
checks its first 2 iterations' aggregation against the reference (check=2).
"""

import argparse
import json
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
from runner import require_release_package, sh, splice_readme, write_csv  # noqa: E402

TRAINER = REPO / "experiments" / "digits" / "train.py"
WORLD = 4
LR = 0.05  # the trainer's default, at every rank count
SIGN_LR = 0.0003  # signSGD's steps are ±lr per element (README.md: how it was chosen)
WARMUP_EPOCHS = 3
DGC_MEMORY = f"dgc:0.9:{WARMUP_EPOCHS}"
# (key, label, compressor, memory, momentum of the SGD optimizer, lr per rank, epochs as a
# multiple of --epochs)
CONFIGS = [
    ("fp32", "fp32", "none", "none", 0.9, LR, 1),
    ("dgc", "DGC 0.1 % (momentum correction, warm-up)", "dgc:0.001", DGC_MEMORY, 0.0, LR, 1),
    ("topk-ef", "top-k 1 % + error feedback", "topk:0.01", "residual", 0.9, LR, 1),
    ("topk", "top-k 1 %, no error feedback", "topk:0.01", "none", 0.9, LR, 1),
    ("signsgd", "signSGD", "signsgd", "none", 0.9, SIGN_LR, 1),
    ("efsignsgd", "EF-signSGD", "efsignsgd", f"efsignsgd:{LR:g}", 0.9, LR, 1),
    ("powersgd", "PowerSGD rank 4 (+ error feedback)", "powersgd:4", "residual", 0.9, LR, 1),
]
# Why DGC falls behind (`--study dgc`): more density at the same length, and the same density
# over a longer run beside fp32 over as long a run. If every coordinate needs many sends to
# learn, density and length close the gap; if sending often loses the momentum (masking), more
# density widens it.
LONG = 4
ABLATION = [
    ("dgc-1pct", "DGC 1 %", "dgc:0.01", DGC_MEMORY, 0.0, LR, 1),
    ("dgc-10pct", "DGC 10 %", "dgc:0.1", DGC_MEMORY, 0.0, LR, 1),
    ("dgc-long", f"DGC 0.1 %, {LONG}× the epochs", "dgc:0.001", DGC_MEMORY, 0.0, LR, LONG),
    ("fp32-long", f"fp32, {LONG}× the epochs", "none", "none", 0.9, LR, LONG),
]
# Whether top-k without error feedback falls behind top-k with it (`--study error-feedback`):
# at DGC's density, where a step sends 226 of the 226 570 weights and what is not sent is lost
# without feedback, and at 1 % over a run as long as DGC's long one.
ERROR_FEEDBACK = [
    ("topk-ef-0.1pct", "top-k 0.1 % + error feedback", "topk:0.001", "residual", 0.9, LR, 1),
    ("topk-0.1pct", "top-k 0.1 %, no error feedback", "topk:0.001", "none", 0.9, LR, 1),
    ("topk-ef-long", f"top-k 1 % + error feedback, {LONG}× the epochs", "topk:0.01", "residual", 0.9, LR, LONG),
    ("topk-long", f"top-k 1 %, no error feedback, {LONG}× the epochs", "topk:0.01", "none", 0.9, LR, LONG),
]
STUDIES = {"dgc": ABLATION, "error-feedback": ERROR_FEEDBACK}
EXTRA = ABLATION + ERROR_FEEDBACK
# (without error feedback, with it, what the pair holds fixed)
EF_PAIRS = [("topk", "topk-ef", "1 %, 15 epochs"), ("topk-0.1pct", "topk-ef-0.1pct", "0.1 %, 15 epochs"),
            ("topk-long", "topk-ef-long", f"1 %, {LONG * 15} epochs")]
LABELS = {c[0]: c[1] for c in CONFIGS + EXTRA}


def make_plans(opts):
    """One plan per configuration: wfbp (one collective per tensor, so that every compressor
    works per layer as DGC, GRACE and PowerSGD do), made for this model's profile."""
    (HERE / "plans").mkdir(exist_ok=True)
    # A study keeps the main runs' profile (their plans are made from it).
    if not (opts.study and (HERE / "digits.json").exists()):
        sh([opts.python, TRAINER, "--record-profile", HERE / "digits.json"], "recording the profile", 600)
    for key, _, compressor, memory, *_ in CONFIGS + EXTRA:
        # Relative paths: the plans name no machine's paths.
        sh([opts.syncopate, "simulate", "--model", "digits.json", "--cluster", "v100-10gbe", "--nodes", WORLD,
            "--gpus-per-node", 1, "--strategy", "wfbp", "--compressor", compressor, "--memory", memory,
            "--save-plan", f"plans/{key}.json"], f"plan {key}", 300, cwd=HERE)


def run_one(opts, config, seed):
    key, _, _, _, momentum, lr, factor = config
    out = HERE / "runs" / f"{key}-s{seed}.json"
    started = time.monotonic()
    sh(["env", "OMP_NUM_THREADS=1", opts.python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", WORLD,
        TRAINER, "--plan", HERE / "plans" / f"{key}.json", "--model-profile", HERE / "digits.json", "--epochs", opts.epochs * factor,
        "--seed", seed, "--lr", lr, "--momentum", momentum, "--check", 2, "--out", out], f"{key} seed {seed}", 1800)
    log = json.loads(out.read_text())
    log["config"] = key
    out.write_text(json.dumps(log, indent=1) + "\n")
    print(f"  {key} seed {seed}: {time.monotonic() - started:.0f} s, final accuracy {log['epochs'][-1]['test_accuracy']:.3f}",
          flush=True)


def report(opts):
    logs = {}
    for path in sorted((HERE / "runs").glob("*.json")):
        log = json.loads(path.read_text())
        logs.setdefault(log["config"], []).append(log)
    rows, epoch_rows = [], []
    for key, label, compressor, memory, momentum, lr, _ in CONFIGS + EXTRA:
        runs = sorted(logs.get(key, []), key=lambda r: r["seed"])
        if not runs:
            continue
        final = [r["epochs"][-1]["test_accuracy"] * 100 for r in runs]
        last3 = [statistics.mean(e["test_accuracy"] for e in r["epochs"][-3:]) * 100 for r in runs]
        reach = [next((e["epoch"] + 1 for e in r["epochs"] if e["test_accuracy"] >= opts.target), None) for r in runs]
        rows.append({
            "config": key, "compressor": compressor, "memory": memory, "sgd_momentum": momentum, "lr": lr,
            "seeds": len(runs), "epochs": len(runs[0]["epochs"]),
            "final_accuracy_mean": round(statistics.mean(final), 2), "final_accuracy_sd": round(statistics.stdev(final), 2) if len(final) > 1 else 0.0,
            "final_accuracy_min": round(min(final), 2), "final_accuracy_max": round(max(final), 2),
            "last3_accuracy_mean": round(statistics.mean(last3), 2),
            "final_accuracy_by_seed": " ".join(f"{a:.2f}" for a in final),
            "target_accuracy": opts.target, "reached": sum(r is not None for r in reach),
            "epochs_to_target_median": statistics.median([r for r in reach if r is not None]) if any(reach) else "",
            "time_to_target_s_median": round(statistics.median([r["epochs"][n - 1]["elapsed_s"] for r, n in zip(runs, reach) if n]), 2) if any(reach) else "",
            "epoch_s_median": round(statistics.median(e["epoch_s"] for r in runs for e in r["epochs"][1:]), 3),
        })
        for r in runs:
            epoch_rows += [{"config": key, "seed": r["seed"], **e} for e in r["epochs"]]
    main_keys = {c[0] for c in CONFIGS}
    write_csv(HERE / "results.csv", [r for r in rows if r["config"] in main_keys])
    write_csv(HERE / "epochs.csv", [r for r in epoch_rows if r["config"] in main_keys])
    write_readme([r for r in rows if r["config"] in main_keys], logs, opts)
    ablation = [r for r in rows if r["config"] not in main_keys]
    if ablation:
        write_csv(HERE / "studies.csv", ablation)
        write_csv(HERE / "studies-epochs.csv", [r for r in epoch_rows if r["config"] not in main_keys])
        write_ablation(rows, logs)
        write_error_feedback(rows, logs)
    plot(logs)


def paired(logs, a, b):
    """Per-seed differences of the final accuracy a − b in points (the seeds share the
    initial model and the data order)."""
    by_seed = {r["seed"]: r["epochs"][-1]["test_accuracy"] * 100 for r in logs.get(b, [])}
    return [r["epochs"][-1]["test_accuracy"] * 100 - by_seed[r["seed"]] for r in logs.get(a, []) if r["seed"] in by_seed]


def write_readme(rows, logs, opts):
    by = {r["config"]: r for r in rows}
    lines = [
        f"{WORLD} ranks, {rows[0]['seeds']} seeds, {rows[0]['epochs']} epochs of {logs['fp32'][0]['epochs'][0]['iterations']} "
        f"iterations (32 images per rank). Final = test accuracy after the last epoch (360 test images: one image is "
        f"0.28 points).",
        "",
        "| configuration | final accuracy % mean ± sd (min–max) | mean of last 3 epochs % | per seed | epochs to "
        f"{opts.target * 100:g} % (median, runs reaching it) | s per epoch (median) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        reach = f"{r['epochs_to_target_median']} ({r['reached']}/{r['seeds']})" if r["reached"] else f"never (0/{r['seeds']})"
        lines.append(f"| {LABELS[r['config']]} | {r['final_accuracy_mean']:.2f} ± {r['final_accuracy_sd']:.2f} "
                     f"({r['final_accuracy_min']:.2f}–{r['final_accuracy_max']:.2f}) | {r['last3_accuracy_mean']:.2f} | "
                     f"{r['final_accuracy_by_seed']} | {reach} | {r['epoch_s_median']:.3f} |")
    lines.append("")
    if "dgc" in by and "fp32" in by:
        d = paired(logs, "dgc", "fp32")
        gap = by["fp32"]["final_accuracy_mean"] - by["dgc"]["final_accuracy_mean"]
        verdict = "met" if gap <= 1.0 else "NOT met"
        lines.append(f"- **DGC within 1 point of fp32: {verdict}.** fp32 {by['fp32']['final_accuracy_mean']:.2f} %, DGC "
                     f"{by['dgc']['final_accuracy_mean']:.2f} %: DGC is {gap:+.2f} points below (per-seed differences DGC − fp32: "
                     f"{' '.join(f'{x:+.2f}' for x in d)}; last-3-epoch means {by['fp32']['last3_accuracy_mean']:.2f} vs "
                     f"{by['dgc']['last3_accuracy_mean']:.2f}).")
    if "topk" in by and "topk-ef" in by:
        lines.append(ef_verdict(by, logs, "topk", "topk-ef", "top-k 1 %, 15 epochs (0.1 % and 60 epochs: the error-feedback study below)"))
    order = sorted(rows, key=lambda r: -r["final_accuracy_mean"])
    lines.append("- Ordering by mean final accuracy: " + " > ".join(f"{LABELS[r['config']]} ({r['final_accuracy_mean']:.2f})" for r in order) + ".")
    splice_readme(HERE / "README.md", lines)


def ef_verdict(by, logs, without, with_, what):
    """Whether top-k without error feedback is visibly worse than with it: lower on average
    and no seed's final accuracy above the other's lowest."""
    d = paired(logs, without, with_)
    a, b = by[without], by[with_]
    gap = b["final_accuracy_mean"] - a["final_accuracy_mean"]
    visibly = gap > 0 and a["final_accuracy_max"] < b["final_accuracy_min"]
    return (f"- **{what}: without error feedback visibly worse: {'yes' if visibly else 'NO (ranges overlap or it is not worse)'}.** "
            f"with EF {b['final_accuracy_mean']:.2f} %, without {a['final_accuracy_mean']:.2f} % ({gap:+.2f} points; per seed "
            f"without − with: {' '.join(f'{x:+.2f}' for x in d)}; ranges {a['final_accuracy_min']:.2f}–{a['final_accuracy_max']:.2f} "
            f"vs {b['final_accuracy_min']:.2f}–{b['final_accuracy_max']:.2f}).")


def write_error_feedback(rows, logs):
    """Top-k with and without error feedback, pair by pair, with the verdict of each."""
    by = {r["config"]: r for r in rows}
    lines = ["| configuration | epochs | final accuracy % mean ± sd (min–max) | mean of last 3 epochs % | per seed |",
             "|---|---|---|---|---|"]
    verdicts = []
    for without, with_, what in EF_PAIRS:
        if without not in by or with_ not in by:
            continue
        for key in (with_, without):
            r = by[key]
            lines.append(f"| {LABELS[key]} | {r['epochs']} | {r['final_accuracy_mean']:.2f} ± {r['final_accuracy_sd']:.2f} "
                         f"({r['final_accuracy_min']:.2f}–{r['final_accuracy_max']:.2f}) | {r['last3_accuracy_mean']:.2f} | "
                         f"{r['final_accuracy_by_seed']} |")
        verdicts.append(ef_verdict(by, logs, without, with_, f"top-k {what}"))
    if verdicts:
        splice_readme(HERE / "README.md", lines + [""] + verdicts, block="error-feedback")


def write_ablation(rows, logs):
    """The ablation's table beside fp32's and DGC 0.1 %'s main rows, with the updates each
    weight could get: density × iterations (DGC sends a coordinate only when it is among the
    largest accumulated ones)."""
    by = {r["config"]: r for r in rows}
    lines = [
        "| configuration | epochs | final accuracy % mean ± sd (min–max) | mean of last 3 epochs % | per seed | "
        "sends per weight after warm-up (density × iterations) |",
        "|---|---|---|---|---|---|",
    ]
    for key in ("fp32", "dgc", "dgc-1pct", "dgc-10pct", "fp32-long", "dgc-long"):
        r = by.get(key)
        if r is None:
            continue
        iterations = logs[key][0]["epochs"][0]["iterations"]
        compressor = r["compressor"]
        density = float(compressor.split(":")[1]) if compressor.startswith("dgc") else 1.0
        sends = density * iterations * max(r["epochs"] - WARMUP_EPOCHS, 0) if density < 1 else iterations * r["epochs"]
        lines.append(f"| {LABELS[key]} | {r['epochs']} | {r['final_accuracy_mean']:.2f} ± {r['final_accuracy_sd']:.2f} "
                     f"({r['final_accuracy_min']:.2f}–{r['final_accuracy_max']:.2f}) | {r['last3_accuracy_mean']:.2f} | "
                     f"{r['final_accuracy_by_seed']} | {sends:g} |")
    splice_readme(HERE / "README.md", lines, block="ablation")


def plot(logs):
    by_epoch, by_time = [], []
    for key, label, *_ in CONFIGS:
        runs = logs.get(key)
        if not runs:
            continue
        epochs = len(runs[0]["epochs"])
        acc = [statistics.mean(r["epochs"][e]["test_accuracy"] for r in runs) * 100 for e in range(epochs)]
        elapsed = [statistics.mean(r["epochs"][e]["elapsed_s"] for r in runs) for e in range(epochs)]
        by_epoch.append({"label": label, "points": list(zip(range(1, epochs + 1), acc))})
        by_time.append({"label": label, "points": list(zip(elapsed, acc))})
    svgplot.chart(HERE / "accuracy-vs-epoch.svg", f"Digits CNN, {WORLD} ranks: test accuracy by epoch (mean over seeds)",
                  "epoch", "test accuracy %", by_epoch, y_range=(0, 100))
    svgplot.chart(HERE / "accuracy-vs-time.svg", f"Digits CNN, {WORLD} ranks on localhost: test accuracy by training time",
                  "training wall-clock time, s (mean over seeds; evaluation excluded)", "test accuracy %", by_time, y_range=(0, 100))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--target", type=float, default=0.95, help="target test accuracy (fraction)")
    p.add_argument("--syncopate", default=str(REPO / "target" / "release" / "syncopate"))
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--study", choices=sorted(STUDIES),
                   help="run only one study and report, keeping the other runs: dgc (why DGC falls behind: density "
                        "and run length) or error-feedback (top-k with and without it, at 0.1 %% and over a long run)")
    opts = p.parse_args()
    if opts.seeds < 2 or opts.epochs < 3 or not 0 < opts.target <= 1:
        p.error("--seeds ≥ 2, --epochs ≥ 3 and --target in (0, 1]")
    if opts.report_only:
        return report(opts)
    if not pathlib.Path(opts.syncopate).exists():
        raise SystemExit(f"{opts.syncopate} is missing: cargo build --release")
    require_release_package(opts.python)
    configs = STUDIES[opts.study] if opts.study else CONFIGS
    if opts.study:
        for path in (HERE / "runs").glob("*.json"):
            if json.loads(path.read_text())["config"] in {c[0] for c in configs}:
                path.unlink()
    else:
        shutil.rmtree(HERE / "runs", ignore_errors=True)
    (HERE / "runs").mkdir(exist_ok=True)
    started = time.monotonic()
    make_plans(opts)
    for seed in range(opts.seeds):
        order = list(configs)
        random.Random(seed).shuffle(order)  # interleaved: slow phases of the shared machine spread over all
        print(f"seed {seed} ({time.monotonic() - started:.0f} s so far)", flush=True)
        for config in order:
            run_one(opts, config, seed)
    report(opts)
    print(f"done in {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
