#!/usr/bin/env python3
"""Turns a model profile captured by `python -m syncopate.capture` into a shipped one.

Usage: python3 profiles/tools/adopt_capture.py CAPTURED.json [SHIPPED_NAME] --from DIR --out FILE

CAPTURED.json is the capture as it came back from the GPU machine, SHIPPED_NAME the shipped
profile of the same model and batch (`resnet50`), whose FLOP counts (its `arithmetic` section and
each tensor's `uses_per_sample`) the capture lacks: they are facts of the architecture, not of the
device. Without SHIPPED_NAME (a model no shipped profile holds) the profile has no FLOP counts,
and the simulator carries it to another GPU by the two devices' `compute_speed_vs_v100` instead
of by class of operation. `--from` names where the capture is kept in the repository (for the provenance). The
capture's timings are kept as measured; its first tensor's backward runs from the start of the
backward pass (the capture's CUDA events start there), so the time before the first gradient is
measured, not estimated. The precision is the capture's: autocast fp16 is `fp16`, fp32 with TF32
off for matrix products and convolutions is `fp32`, fp32 with TF32 on is `tf32`.

Standard library only; the same inputs give the same bytes. Exit status 1 with the reason when the capture
and the shipped profile do not hold the same tensors, 2 for bad usage or unreadable files.
"""

import argparse
import json
import re
import sys
from pathlib import Path

MODELS = Path(__file__).resolve().parent.parent / "models"


def fail(message, status=1):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(status)


def read(path):
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as failed:
        fail(f"{path}: {failed.strerror}", 2)
    except ValueError as failed:
        fail(f"{path} is not JSON: {failed}", 2)


def precision(capture):
    """The capture's precision, from what the capture wrote about autocast and TF32."""
    backward = capture["timing"]["backward"]["method"]
    if "autocast fp16" in backward:
        return "fp16", "autocast fp16 (matrix products and convolutions on FP16 tensor cores)"
    if "autocast" in backward:
        fail(f"{capture['name']}: autocast other than fp16 has no device peak to check against")
    tf32 = re.search(r"TF32 for fp32 matrix products (on|off), for convolutions (on|off)", capture["description"])
    if tf32 is None:
        fail(f"{capture['name']}: the description does not say whether TF32 was on")
    if tf32.groups() == ("off", "off"):
        return "fp32", "FP32 on CUDA cores (TF32 off for matrix products and convolutions)"
    return "tf32", f"FP32 tensors, TF32 {tf32.group(1)} for matrix products and {tf32.group(2)} for convolutions"


def optimizer_state_bytes(capture, command):
    """Bytes of optimizer state per element: as a newer capture measured it, else what the
    capture command's optimizer keeps (`python -m syncopate.capture` steps torch.optim.SGD with
    momentum 0.9, one fp32 buffer per element, unless told `--optimizer adam`: two)."""
    if "optimizer_state_bytes_per_element" in capture:
        return capture["optimizer_state_bytes_per_element"]
    return 8 if re.search(r"--optimizer[ =]adam", command) else 4


def flop_counts(capture, shipped):
    """The `arithmetic` section and each tensor's `uses_per_sample` that `shipped` (same model
    and batch) gives `capture`."""
    uses = {t["name"]: (tuple(t["shape"]), t.get("uses_per_sample", 0)) for t in shipped["tensors"]}
    captured = {t["name"]: tuple(t["shape"]) for t in capture["tensors"]}
    if sorted(captured.items()) != sorted((name, shape) for name, (shape, _) in uses.items()):
        missing = sorted(set(uses) ^ set(captured)) or sorted(n for n in captured if captured[n] != uses[n][0])
        fail(f"{capture['name']} and {shipped['name']} do not hold the same tensors (e.g. {missing[0]})")
    if capture["batch_size_per_gpu"] != shipped["batch_size_per_gpu"]:
        fail(f"{capture['name']} has batch {capture['batch_size_per_gpu']}, {shipped['name']} "
             f"{shipped['batch_size_per_gpu']}: FLOP counts per sample carry over, the timings would not compare")
    mode, described = precision(capture)
    arithmetic = dict(shipped["arithmetic"])
    arithmetic["precision"] = mode
    arithmetic["method"] = (f"counts of the shipped profile {shipped['name']} (same architecture and batch): "
                            f"{shipped['arithmetic']['method'].split('. Precision:')[0]}. Precision: {described}")
    arithmetic.pop("above_peak_reason", None)
    return arithmetic, {name: use for name, (_, use) in uses.items()}


def adopt(capture, shipped, kept_at):
    """The shipped profile made from `capture`, with `shipped`'s FLOP counts, or none where
    `shipped` is None."""
    mode, _ = precision(capture)
    if not shipped and mode != "fp32":
        # The carry without FLOP counts scales by compute_speed_vs_v100, measured in fp32.
        fail(f"{capture['name']} was captured in {mode}: without a shipped profile's FLOP counts "
             "only an fp32 capture (TF32 off) can be adopted")
    arithmetic, uses = flop_counts(capture, shipped) if shipped else (None, {})
    batch = capture["batch_size_per_gpu"]
    command = re.sub(r" --out \S+", "", capture["source"])
    timing = dict(capture["timing"])
    timing["first_gradient"] = {
        "status": "measured",
        "method": "the capture's CUDA events start at the beginning of the backward pass, so the first "
                  "tensor's backward_us holds the head's backward and the loss's kernels",
    }
    timing["batch"] = {
        "status": "measured",
        "method": f"batch {batch} per GPU, measured: the batch of the random inputs the capture made "
                  f"({timing['batch']['method'].split(',')[0]})",
    }
    tensors = []
    for t in capture["tensors"]:
        tensor = {k: t[k] for k in ("name", "shape", "numel")}
        if uses.get(t["name"]):
            tensor["uses_per_sample"] = uses[t["name"]]
        tensor.update({k: t[k] for k in ("dtype", "registration_index", "backward_us", "forward_us")})
        tensors.append(tensor)
    counts = (f"FLOP counts (arithmetic, uses_per_sample) from the shipped profile {shipped['name']}" if shipped
              else "no FLOP counts (no shipped profile holds this model and batch): carried to another GPU "
                   "by the devices' compute_speed_vs_v100")
    return {
        "format_version": capture["format_version"],
        "name": capture["name"],
        "description": capture["description"],
        "source": f"{command}; kept as it came back in {kept_at}; {counts} by profiles/tools/adopt_capture.py",
        "device": capture["device"],
        "framework": capture["framework"],
        "batch_size_per_gpu": batch,
        "sample_unit": capture["sample_unit"],
        "threads": capture["threads"],
        "timing": timing,
        **({"arithmetic": arithmetic} if arithmetic else {}),
        "optimizer_us": capture["optimizer_us"],
        "optimizer_state_bytes_per_element": optimizer_state_bytes(capture, command),
        # A newer capture measures what autograd keeps for backward; older ones did not.
        **({"activation_bytes": capture["activation_bytes"]} if "activation_bytes" in capture else {}),
        "tensors": tensors,
    }


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("captured", help="the capture, as python -m syncopate.capture wrote it")
    parser.add_argument("shipped", nargs="?", help="the shipped profile of the same model and batch, by name, "
                        "whose FLOP counts the profile takes (none: no FLOP counts)")
    parser.add_argument("--from", dest="kept_at", required=True, help="where the capture is kept in the repository")
    parser.add_argument("--out", required=True, help="the shipped profile to write")
    args = parser.parse_args(argv)
    capture = read(args.captured)
    shipped = read(MODELS / f"{args.shipped}.json") if args.shipped else None
    adopted = adopt(capture, shipped, args.kept_at)
    Path(args.out).write_text(json.dumps(adopted, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
