"""Per-step timings of a PyTorch run, written as the measured trace `exec --trace` writes (same schema and task names), with exec's summary as its otherData."""

import json
import time

from syncopate import write_trace


class Recorder:
    """This rank's step spans in ns since a common start (the ranks pass a barrier first)."""

    def __init__(self, rank):
        self.rank = rank
        self.epoch = time.perf_counter_ns()
        self.records = []

    def restart(self):
        self.epoch = time.perf_counter_ns()

    def now(self):
        return time.perf_counter_ns() - self.epoch

    def add(self, step, iteration, stream, start):
        self.records.append((self.rank, step, iteration, stream, start, self.now()))


def busy_ms(records, streams_of, streams, iterations):
    """Total time of rank 0's records on `streams` in `iterations`, per iteration, in ms."""
    spans = sorted((r[4], r[5]) for r in records if r[0] == 0 and r[2] in iterations and streams_of(r[1]) in streams)
    total, end = 0, 0
    for start, stop in spans:
        # Overlapping collectives count once: the time during which some collective ran.
        start = max(start, end)
        if stop > start:
            total += stop - start
            end = stop
    return total / 1e6 / max(len(iterations), 1)


def summary(layout, records, world, warmup, seed, checks):
    """exec's MeasuredSummary for `records` of every rank."""
    steps = layout.steps
    ends = {}
    for rank, step, iteration, _, _, stop in records:
        if step == layout.iteration_end:
            ends[iteration] = max(ends.get(iteration, 0), stop)
    order = sorted(ends)
    measured = [k for k in order if k >= max(warmup, 1)]
    times = [round((ends[k] - ends[k - 1]) / 1e6, 6) for k in measured if k - 1 in ends]
    stream = lambda index: steps[index]["stream"]
    return {
        "model": layout.schedule["model"],
        "strategy": layout.schedule["strategy"],
        "backend": "torch",
        "world_size": world,
        "warmup_iterations": warmup,
        "measured_iterations": len(times),
        "iteration_time_ms": round(sum(times) / max(len(times), 1), 6),
        "iteration_times_ms": times,
        "compute_ms": round(busy_ms(records, stream, ("compute",), measured), 6),
        "compression_ms": round(busy_ms(records, stream, ("codec", "cpu"), measured), 6),
        "comm_ms": round(busy_ms(records, stream, ("comm",), measured), 6),
        "compute_scale": 1.0,
        "seed": seed,
        "checks": checks,
    }


def write(path, layout, schedule_json, model_json, recorder, link, warmup, seed, checks):
    """Gathers every rank's records (a collective call) and has rank 0 write the trace."""
    gathered = link.gather_objects(recorder.records, "the trace's records")
    records = [r for rank_records in gathered for r in rank_records]
    if recorder.rank == 0:
        text = json.dumps(summary(layout, records, link.world, warmup, seed, checks))
        write_trace(str(path), schedule_json, model_json, records, text)
