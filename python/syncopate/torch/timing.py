"""Per-step timings of a PyTorch run, written as the measured trace `exec --trace` writes.

It has the same schema and task names, with exec's summary (computed by the same Rust code) as its
otherData. On the CPU a step's ends are perf_counter readings; on a CUDA device they are CUDA
events on the stream the step ran on, read when the trace is written.
"""

import json
import time

import torch

from syncopate import write_trace


class Recorder:
    """This rank's step spans in ns since a common start (the ranks pass a barrier first).

    `now` is the host's clock, which the launch policy decides on. `mark` is where a step begins
    or ends: the host's clock on the CPU, where the op is done when its call returns; a CUDA
    event on the calling thread's current stream on a GPU, where the call only queues the op.
    A record keeps its marks; `spans` turns them into ns once the device has reached them all."""

    def __init__(self, rank, device=None):
        self.rank = rank
        self.device = device or torch.device("cpu")
        self.cuda = self.device.type == "cuda"
        self.records = []
        # Records before this index hold ns only: their events were read and let go.
        self.settled = 0
        self.restart()

    def restart(self):
        """The common start: now, on the host and (with the device idle) on the device."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self.epoch_event = torch.cuda.Event(enable_timing=True)
            self.epoch_event.record(torch.cuda.current_stream(self.device))
            self.epoch_event.synchronize()
        self.epoch = time.perf_counter_ns()

    def now(self):
        return time.perf_counter_ns() - self.epoch

    def origin(self):
        """The mark of the common start."""
        return self.epoch_event if self.cuda else 0

    def mark(self):
        if not self.cuda:
            return self.now()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def add(self, step, iteration, stream, start):
        """Step `step` of `iteration` ran on `stream` from mark `start` until now."""
        self.span(step, iteration, stream, start, self.mark())

    def span(self, step, iteration, stream, start, end, part=0, parts=1):
        """Step `step` ran from `start` to `end`, or the `part`-th of `parts` equal shares of it."""
        self.records.append((self.rank, step, iteration, stream, start, end, part, parts))

    def earlier(self, first, second):
        """The earlier of two marks: on the host the clock decides; on a device, marks on one
        stream are in the order they were queued."""
        return first if self.cuda else min(first, second)

    def _ns(self, mark):
        """A mark's ns since the common start (a CUDA event that has completed)."""
        if isinstance(mark, int):
            return mark
        return round(self.epoch_event.elapsed_time(mark) * 1e6)

    def settle(self):
        """On a device, reads the events of every record whose two marks have completed and
        lets them go, so that a long run keeps no more events than its last iterations' (called
        once per iteration)."""
        if not self.cuda:
            return
        done = lambda mark: isinstance(mark, int) or mark.query()
        for i in range(self.settled, len(self.records)):
            rank, step, iteration, stream, start, end, part, parts = self.records[i]
            if done(start) and done(end):
                self.records[i] = (rank, step, iteration, stream, self._ns(start), self._ns(end), part, parts)
        while self.settled < len(self.records) and all(isinstance(m, int) for m in self.records[self.settled][4:6]):
            self.settled += 1

    def spans(self):
        """The records as (rank, step, iteration, stream, start ns, end ns)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
        spans = []
        for rank, step, iteration, stream, start, end, part, parts in self.records:
            first, last = self._ns(start), self._ns(end)
            width = (last - first) // parts
            spans.append((rank, step, iteration, stream, first + part * width, first + (part + 1) * width))
        return spans


def write(path, schedule_json, model_json, recorder, link, warmup, seed, checks):
    """Gathers every rank's records (a collective call) and has rank 0 write the trace."""
    gathered = link.gather_objects(recorder.spans(), "the trace's records")
    records = [r for rank_records in gathered for r in rank_records]
    if recorder.rank == 0:
        write_trace(str(path), schedule_json, model_json, records, link.world, warmup, seed, json.dumps(checks))
