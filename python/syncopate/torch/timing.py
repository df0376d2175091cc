"""Per-step timings of a PyTorch run, written as the measured trace `exec --trace` writes.

It has the same schema and task names, with exec's summary (computed by the same Rust code) as its
otherData.
"""

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


def write(path, schedule_json, model_json, recorder, link, warmup, seed, checks):
    """Gathers every rank's records (a collective call) and has rank 0 write the trace."""
    gathered = link.gather_objects(recorder.records, "the trace's records")
    records = [r for rank_records in gathered for r in rank_records]
    if recorder.rank == 0:
        write_trace(str(path), schedule_json, model_json, records, link.world, warmup, seed, json.dumps(checks))
