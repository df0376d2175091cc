"""Sets model profiles captured on a GPU beside the simulator's prediction for that GPU.

    python3 gpu/compare_captures.py SYNCOPATE CLUSTER CAPTURED.json...

Each capture (`python -m syncopate.capture`, fp32 with TF32 off) is matched with the shipped
fp32 profile of the same model and batch measured on another GPU (profiles/models/, the same
tensor sizes in the same order, as `profile --compute-from` matches them). The prediction is `SYNCOPATE simulate` of the shipped
profile on one GPU of CLUSTER: its compute carried from the GPU it was measured on, step by step
(sim/src/inputs/carry.rs). The measurement is the same simulation of the capture, which runs at
its own times on its own GPU. Prints a Markdown table and the median |error|; exit 1 when a
capture matches no shipped profile or a simulation fails, 2 for bad usage.
"""

import glob
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What `syncopate.capture` writes into a GPU capture's description about TF32 (the prediction is
# of fp32 arithmetic, which TF32 would not be).
TF32_NOTE = "TF32 for "
TF32_OFF = "TF32 for fp32 matrix products off, for convolutions off"


def load(path):
    with open(path) as f:
        return json.load(f)


def inventory(profile):
    return [t["numel"] for t in profile["tensors"]], profile["batch_size_per_gpu"]


def shipped_match(captured):
    """The shipped fp32 profile with the capture's tensors and batch measured on another GPU
    (a profile shipped from an earlier capture on this GPU would predict it by itself), or None."""
    for path in sorted(glob.glob(os.path.join(ROOT, "profiles", "models", "*.json"))):
        shipped = load(path)
        fp32 = shipped.get("arithmetic", {}).get("precision") == "fp32"
        if inventory(shipped) == inventory(captured) and fp32 and shipped["device"] != captured["device"]:
            return shipped["name"]
    return None


def compute_ms(syncopate, model, cluster):
    """The compute of one iteration on one GPU of `cluster`, as `simulate` prices it."""
    done = subprocess.run(
        [syncopate, "simulate", "--model", model, "--cluster", cluster, "--nodes", "1", "--gpus-per-node", "1",
         "--format", "json"], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"simulate --model {model} --cluster {cluster}: {done.stderr.strip()}")
    return json.loads(done.stdout)["compute_ms"]


def main(argv):
    if len(argv) < 4:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    syncopate, cluster, files = argv[1], argv[2], argv[3:]
    rows, failed = [], False
    for path in files:
        try:
            captured = load(path)
            autocast = "autocast" in captured["timing"]["backward"]["method"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            print(f"{path}: not a model profile ({type(error).__name__}: {error})", file=sys.stderr)
            failed = True
            continue
        shipped = shipped_match(captured)
        tf32 = TF32_NOTE in captured.get("description", "") and TF32_OFF not in captured["description"]
        if tf32 and not autocast:
            print(f"{path}: not compared: TF32 was on (capture with --tf32 off)", file=sys.stderr)
            failed = True
            continue
        if shipped is None or autocast:
            why = "an autocast capture (the shipped profiles are fp32)" if autocast else \
                f"no shipped fp32 profile measured on another GPU has its {len(captured['tensors'])} tensors at batch " \
                f"{captured['batch_size_per_gpu']}"
            print(f"{path}: not compared: {why}", file=sys.stderr)
            failed = failed or not autocast
            continue
        try:
            measured = compute_ms(syncopate, path, cluster)
            predicted = compute_ms(syncopate, shipped, cluster)
        except RuntimeError as error:
            print(error, file=sys.stderr)
            failed = True
            continue
        rows.append((captured["name"], shipped, measured, predicted, predicted / measured - 1))
    if not rows:
        print("no capture compared", file=sys.stderr)
        return 1
    print(f"| capture | shipped profile carried | measured ms | predicted on {cluster} ms | error |")
    print("|---|---|---:|---:|---:|")
    for name, shipped, measured, predicted, error in rows:
        print(f"| {name} | {shipped} | {measured:.2f} | {predicted:.2f} | {100 * error:+.1f} % |")
    print(f"\nMedian |error| {100 * statistics.median(abs(r[4]) for r in rows):.1f} % over {len(rows)} models.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
