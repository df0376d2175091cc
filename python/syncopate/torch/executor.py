"""Runs one rank's part of a lowered Schedule during PyTorch training: steps released by their dependencies, codec ops on the Rust state, collectives launched in the launch policy's order and finished in launch order, so every rank issues the same collectives in the same order."""

import collections

from syncopate import Launcher, SyncopateError
from syncopate.torch import exchange
from syncopate.torch.codecs import SUMMED, Codecs
from syncopate.torch.schedule import SYNC_STREAMS, exchange_of, kind_of


class Sync:
    """One iteration's synchronization: which steps are done, what each step still waits
    for, the launch policy's state and the collectives in flight (oldest first)."""

    def __init__(self, layout, launcher, iteration):
        self.iteration = iteration
        self.waiting = [
            len(step.get("after", [])) if layout.exists_in(i, iteration) else None
            for i, step in enumerate(layout.steps)
        ]
        self.done = [False] * len(layout.steps)
        launcher.reset()
        self.readied = 0
        self.launched = 0
        self.in_flight = collections.deque()


class Executor:
    """Interprets the schedule's synchronization steps on `state` (a `syncopate.Rank`) over
    `link`; `buffers` and `results` are each group's float32 gradient and result tensors."""

    def __init__(self, layout, schedule_json, state, link, buffers, results, scales, recorder, check, names):
        self.layout = layout
        self.state = state
        self.link = link
        self.launcher = Launcher(schedule_json)
        self.codecs = Codecs(layout, state, link, buffers, results, scales, check, names)
        self.recorder = recorder
        self.check = check
        self.names = names
        self.scattered = {}
        self.sync = None

    # Events from training.

    def begin(self, iteration):
        """A new backward pass: the previous iteration's synchronization must be complete."""
        self.finish_all()
        self.sync = Sync(self.layout, self.launcher, iteration)

    def gradient_ready(self, tensor):
        self._done(self.layout.backward[tensor])
        self.pump()

    def finish_all(self):
        """Completes every collective of the current iteration, in the policy's order."""
        while self.sync is not None and self._progress():
            pass
        if self.sync is not None and self.check is not None:
            self.check.verify(self.sync.iteration)

    def finish_steps(self, steps):
        """Completes collectives, oldest first, until every one of `steps` is done."""
        while self.sync is not None and not all(self.sync.done[s] for s in steps):
            if not self._progress():
                names = ", ".join(kind_label(self.layout.steps[s]) for s in steps if not self.sync.done[s])
                raise SyncopateError(f"schedule stalled: {names} can never run (a gradient never arrived?)")

    # The dependency walk.

    def _done(self, index):
        sync = self.sync
        sync.done[index] = True
        for successor in self.layout.successors[index]:
            if sync.waiting[successor] is None:
                continue
            sync.waiting[successor] -= 1
            if sync.waiting[successor] == 0:
                self._ready(successor)

    def _ready(self, index):
        step = self.layout.steps[index]
        if step["stream"] in SYNC_STREAMS:
            start = self.recorder.now()
            self.codecs.run(step["piece"], step["ops"], self.sync.iteration)
            self.recorder.add(index, self.sync.iteration, 0, start)
            self._done(index)
        elif step["stream"] == "comm":
            self.launcher.ready(index)
            self.sync.readied += 1

    def pump(self):
        """Launches what the policy releases while a stream is free; with every stream busy
        and a collective released, finishes the oldest first (a stream frees in launch order)."""
        sync = self.sync
        streams = self.launcher.comm_streams
        while True:
            if len(sync.in_flight) < streams:
                index = self.launcher.next()
                if index is not None:
                    self._launch(index)
                    continue
                return
            if sync.readied > sync.launched:
                self._complete_oldest()
                continue
            return

    def _progress(self):
        """One unit of progress: a launch or the oldest collective finished; False when idle."""
        sync = self.sync
        if len(sync.in_flight) < self.launcher.comm_streams:
            index = self.launcher.next()
            if index is not None:
                self._launch(index)
                return True
        if sync.in_flight:
            self._complete_oldest()
            return True
        return False

    # Collectives.

    def _launch(self, index):
        sync = self.sync
        step = self.layout.steps[index]
        ops = step["ops"]
        split = ops.index("exchange")
        start = self.recorder.now()
        self.codecs.run(step["piece"], ops[:split], sync.iteration)
        _, fields = kind_of(step)
        piece = step["piece"]
        what = f"{kind_label(step)} (rank {self.link.rank}, iteration {sync.iteration})"
        name, _ = exchange_of(self.layout.pieces[piece]["rounds"][fields["round"]])
        pending = self._exchange(name, piece, what)
        sync.launched += 1
        sync.in_flight.append((index, pending, start, sync.launched % self.launcher.comm_streams))

    def _exchange(self, name, piece, what):
        state, link = self.state, self.link
        length = self.codecs.length.get(piece, 0)
        dtype = state.wire_dtype(piece) or "f32"
        if name in SUMMED:
            # Gloo on CPU has no node hierarchy: the hierarchical allreduce's sum is the same.
            staged = self.codecs.staged.pop(piece, None)
            return exchange.Allreduce(link, state, piece, length, dtype, what, staged)
        if name == "reduce-scatter":
            pending = exchange.ReduceScatter(link, state, piece, length, dtype, what)
            self.scattered[piece] = pending
            return pending
        if name == "allgather-shards":
            return exchange.AllgatherShards(link, state, piece, self.scattered.pop(piece), what)
        if name == "allgather":
            return exchange.Allgather(link, state, piece, length, what)
        # push-pull, and CaSync-Ring aggregated by the same decode-sum-re-encode on its server.
        return exchange.PushPull(link, state, piece, length, state.server_rank(piece), what)

    def _complete_oldest(self):
        index, pending, start, stream = self.sync.in_flight.popleft()
        step = self.layout.steps[index]
        self.codecs.deliver(step["piece"], pending.finish())
        ops = step["ops"]
        self.codecs.run(step["piece"], ops[ops.index("exchange") + 1:], self.sync.iteration)
        self.recorder.add(index, self.sync.iteration, stream, start)
        self._done(index)


def kind_label(step):
    """`collective g3.0.1`, as the Rust side names steps."""
    kind, fields = kind_of(step)
    if kind == "collective":
        return f"collective g{fields['group']}.{fields['part']}.{fields['round']}"
    if kind in ("encode", "decode"):
        return f"{kind} g{fields['group']}.{fields['part']}"
    return kind
