"""What gpu/measure's scripts share: their common flags, torch's import, clocks and JSON output.

Each script runs as `python gpu/measure/NAME.py`, so this file is importable beside it.
"""

import argparse
import contextlib
import datetime
import json
import math
import pathlib
import platform
import socket
import statistics
import sys
import time

# The exit status of a GPU measurement on a machine without a GPU (the automake convention).
SKIP_EXIT = 77
MAX_SECONDS = 3600.0

torch = None  # imported once the arguments parse (import_torch), so that a bad flag fails at once


def seconds_arg(text):
    """A time budget: a finite number of seconds above 0 and at most MAX_SECONDS."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and 0 < value <= MAX_SECONDS):
        raise argparse.ArgumentTypeError(f"must be above 0 and at most {MAX_SECONDS:g} seconds, not {text!r}")
    return value


def parser(description, output, quick, seconds, budget):
    """The flags every script takes: --out-dir (for `output`), --device, --quick (`quick` says
    what it runs) and --seconds (default `seconds`; `budget` says what the budget stops)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out-dir", required=True, type=pathlib.Path, help=f"where {output} goes")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--quick", action="store_true", help=quick)
    p.add_argument("--seconds", type=seconds_arg, default=seconds,
                   help=f"soft time budget: {budget} once it is spent (default {seconds:g})")
    return p


def import_torch(device):
    """torch, or None after printing the SKIP line when `device` is cuda and there is no GPU."""
    global torch
    import torch as module

    torch = module
    if device == "cuda" and not torch.cuda.is_available():
        print(f"SKIP: no CUDA device (torch {torch.__version__})")
        return None
    return torch


class CudaClock:
    """Marks are CUDA events on the calling thread's current stream, timed by the GPU itself."""
    what = "CUDA events (torch.cuda.Event.elapsed_time)"

    def mark(self):
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def wait(self, mark):
        mark.synchronize()

    def elapsed(self, start, end):
        return start.elapsed_time(end)

    def sync(self):
        torch.cuda.synchronize()

    def on(self, stream):
        return torch.cuda.stream(stream)


class CpuClock:
    """Marks are time.perf_counter() readings; CPU work is done when the call returns."""
    what = "time.perf_counter"

    def mark(self):
        return time.perf_counter()

    def wait(self, mark):
        pass

    def elapsed(self, start, end):
        return (end - start) * 1e3

    def sync(self):
        pass

    def on(self, stream):
        return contextlib.nullcontext()


def time_ops(op, clock, count):
    """Milliseconds per op over `count` back-to-back ops."""
    start = clock.mark()
    for _ in range(count):
        op()
    end = clock.mark()
    clock.sync()
    return max(clock.elapsed(start, end), 1e-6) / count


def calibrate(op, clock, target_ms, cap):
    """(ms per op, ops needed for target_ms): the count grows until a timing spans 5 ms or more,
    since one short op is below the timers' resolution."""
    op()
    op()  # the first calls pay for library set-up (cuBLAS handles, cuDNN plans, NCCL communicators)
    clock.sync()
    count = 1
    while True:
        per_op = time_ops(op, clock, count)
        if per_op * count >= 5.0 or count >= cap:
            break
        count = min(cap, count * 4)
    # Once more at the count found: the first timings can still include warm-up (clocks ramping).
    count = max(1, min(cap, math.ceil(target_ms / per_op)))
    per_op = time_ops(op, clock, count)
    return per_op, max(1, min(cap, math.ceil(target_ms / per_op)))


class Run:
    """What every script's run keeps: its arguments, device and clock, its time budget, and what
    it skipped or failed at (which `finish` writes)."""

    def __init__(self, args):
        self.args, self.device, self.quick = args, args.device, args.quick
        self.clock = CudaClock() if args.device == "cuda" else CpuClock()
        self.started = time.perf_counter()
        self.deadline = self.started + args.seconds
        self.skipped, self.skipped_for_time, self.errors = {}, [], {}


def stats(samples, unit=None):
    """Median, min, max and count of `samples`, with the samples themselves (and their unit)."""
    record = {"median": statistics.median(samples), "min": min(samples), "max": max(samples),
              "repeats": len(samples), "samples": [round(s, 6) for s in samples]}
    if unit:
        record["unit"] = unit
    return record


def stats_ms(samples):
    """`stats` of times in ms, each value's key marked `_ms`."""
    return {key if key == "repeats" else f"{key}_ms": value for key, value in stats(samples).items()}


def environment(device):
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
           "device": device, "cpu_threads": torch.get_num_threads(), "gpu_name": None, "sm_count": None,
           "nccl": None, "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu_name=props.name, sm_count=props.multi_processor_count, gpu_memory_bytes=props.total_memory,
                   compute_capability=f"{props.major}.{props.minor}", nccl=nccl_version())
    return env


def nccl_version():
    try:
        version = torch.cuda.nccl.version()
    except Exception as error:  # a build without NCCL
        return f"unknown ({type(error).__name__}: {error})"
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def precision_settings(tf32=False):
    """TF32 off so that fp32 work is fp32 (the simulator's fp32 profiles and curves), or on with
    `tf32`, read back as set."""
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    return {"matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cudnn_benchmark": torch.backends.cudnn.benchmark}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_json(path, document):
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(document, sort_keys=True, indent=1, allow_nan=False) + "\n")
    partial.replace(path)


def document(script, what):
    """The head of a script's JSON: which script, what it measures, its command and start."""
    return {"schema": f"syncopate-gpu-measure/{script}/1", "script": f"gpu/measure/{script}.py", "what": what,
            "command": " ".join([sys.executable, *sys.argv]),
            "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def guarded(errors, work, teardown):
    """Runs work() then teardown(), each failure recorded in `errors` instead of raised, so that
    what was measured is still written; 1 when work failed, else 0."""
    status = 0
    try:
        work()
    except Exception as error:
        errors["fatal"] = f"{type(error).__name__}: {error}"
        status = 1
    finally:
        try:
            teardown()
        except Exception as error:
            errors["destroy_process_group"] = f"{type(error).__name__}: {error}"
    return status


def finish(doc, run, path, lines):
    """Completes `doc` with `run`'s skips, errors and elapsed time, writes it to `path` and
    prints `lines` and the RESULT line."""
    doc.update(skipped=run.skipped, skipped_for_time=run.skipped_for_time, errors=run.errors,
               elapsed_s=round(time.perf_counter() - run.started, 3),
               complete=not run.skipped_for_time and not run.errors)
    write_json(path, doc)
    for line in lines:
        print(line)
    print(f"RESULT wrote {path} in {doc['elapsed_s']:.1f} s"
          + (f"; skipped for time: {len(run.skipped_for_time)}" if run.skipped_for_time else "")
          + (f"; errors: {sorted(run.errors)}" if run.errors else ""))
