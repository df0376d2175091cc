"""Runs one rank's part of a lowered Schedule during PyTorch training.

Steps are released by their dependencies, codec ops run on the Rust state, and one thread per
communication stream takes the launch policy's next collective, launches it and finishes it
(Horovod's background thread), so the backward pass never waits for the network.
"""

import atexit
import threading

from syncopate import Launcher, SyncopateError
from syncopate.torch import exchange
from syncopate.torch.codecs import Codecs
from syncopate.torch.schedule import SYNC_STREAMS, exchange_of, kind_of

# What rank 0 broadcasts when a stream has nothing more to run in the iteration.
END = -1
# How long stopping waits for each stream thread: at exit, a thread still inside a collective
# must not be cut off in C++ frames (see link.py).
STOP_TIMEOUT_S = 10.0


class Sync:
    """One iteration's synchronization: which steps are done, what each step still waits
    for, which collectives are ready, and how many have been taken by a stream and finished."""

    def __init__(self, layout, launcher, iteration):
        self.iteration = iteration
        self.waiting = layout.waiting(iteration)
        self.successors = layout.successors(iteration)
        self.done = [False] * len(layout.steps)
        # Each tensor's mark after its gradient was copied into its buffer (a CUDA event on a
        # device, which the exchanges of its pieces wait for).
        self.copied = {}
        self.collectives = sum(
            1 for i, step in enumerate(layout.steps) if step["stream"] == "comm" and self.waiting[i] is not None
        )
        launcher.reset()
        self.ready = set()
        self.taken = 0
        self.finished = 0

    def idle(self):
        """Whether every ready collective has finished (nothing can happen without new events)."""
        return self.finished == len(self.ready)


class Executor:
    """Interprets the schedule's synchronization steps on `state` (a `syncopate.Rank`) over
    `link`; `buffers` and `results` are each group's float32 gradient and result tensors.

    Each communication stream gets a process group of its own, and, unless every rank can
    decide the launch order alone (plan order on one stream), one more on which rank 0 tells
    the others which collective the stream runs next (Horovod's coordinator).

    The training thread reports events (a new backward pass, a gradient ready) and waits for
    steps; the stream threads launch and finish collectives. One lock guards the iteration's
    state, the launcher and the codecs; nobody holds it while waiting for the network."""

    def __init__(self, layout, schedule_json, state, link, buffers, results, scales, recorder, check, names):
        self.layout = layout
        self.state = state
        self.launcher = Launcher(schedule_json)
        streams = range(self.launcher.comm_streams)
        # The hierarchical allreduce runs on groups of each node's ranks and of one rank per node.
        hierarchical = any(exchange_of(r)[0] == "hierarchical-allreduce" for p in layout.pieces for r in p["rounds"])
        per_node = layout.world["ranks_per_node"]
        self.links = [link.with_nodes(per_node) if hierarchical else link.new_group() for _ in streams]
        self.controls = None if self.launcher.order_is_fixed else [link.new_group() for _ in streams]
        for made in self.links + (self.controls or []):
            made.connect()
        self.codecs = Codecs(layout, state, link, buffers, results, scales, check, names)
        self.piece_tensors = [pieces_tensors(layout, piece) for piece in layout.pieces]
        self.recorder = recorder
        self.check = check
        self.names = names
        self.scattered = {}
        self.sync = None
        self.lock = threading.Condition()
        self.failure = None
        self.closed = False
        self.threads = [
            threading.Thread(target=self._stream, args=(s,), name=f"syncopate comm {s}", daemon=True)
            for s in streams
        ]
        for thread in self.threads:
            thread.start()
        atexit.register(self.stop)

    # Events from training.

    def begin(self, iteration):
        """A new backward pass: the previous iteration's synchronization must be complete."""
        self.finish_all()
        with self.lock:
            self.sync = Sync(self.layout, self.launcher, iteration)
            self.lock.notify_all()

    def gradient_ready(self, tensor, copied):
        """`tensor`'s gradient is in its buffer since mark `copied`."""
        with self.lock:
            self._raise_failure()
            self.sync.copied[tensor] = copied
            self._done(self.layout.backward[tensor])

    def finish_all(self):
        """Waits until every ready collective of the current iteration has finished (on a
        device, the caller's stream then waits for the links' streams, where the results were
        written), then verifies the iteration when it is checked."""
        with self.lock:
            self._wait(lambda: self.sync is None or self.sync.idle())
            self._raise_failure()
        self._join()
        self.recorder.settle()
        if self.sync is not None:
            self.codecs.check_finite(self.sync.iteration)
            if self.check is not None:
                self.check.verify(self.sync.iteration)

    def finish_steps(self, steps):
        """Waits until every one of `steps` is done."""
        with self.lock:
            while not all(self.sync.done[s] for s in steps):
                if self.sync.idle():
                    names = ", ".join(kind_label(self.layout.steps[s]) for s in steps if not self.sync.done[s])
                    raise SyncopateError(f"schedule stalled: {names} can never run (a gradient never arrived?)")
                self._wait_once()
            self._raise_failure()
        self._join()

    def _join(self):
        """On a device, makes the caller's stream wait for every link's stream and the codecs'."""
        for link in self.links:
            link.join()
        self.codecs.lane.join()

    def close(self):
        """Finishes what is in flight, then ends the stream threads; the exit no longer holds
        this executor (and its buffers) once it is closed."""
        self.finish_all()
        self.stop()
        atexit.unregister(self.stop)

    def stop(self):
        """Ends the stream threads without finishing anything (at exit, and after close):
        each leaves once its current exchange, bounded by the timeout, returns."""
        with self.lock:
            self.closed = True
            self.lock.notify_all()
        for thread in self.threads:
            if thread is not threading.current_thread():
                thread.join(STOP_TIMEOUT_S)

    # Waiting (with the lock held).

    def _raise_failure(self):
        if self.failure is not None:
            raise self.failure

    def _wait_once(self, timeout=None):
        self._raise_failure()
        self.lock.wait(timeout)
        self._raise_failure()

    def _wait(self, condition):
        while not condition():
            self._wait_once()

    # The dependency walk (with the lock held).

    def _done(self, index):
        sync = self.sync
        sync.done[index] = True
        for successor in sync.successors[index]:
            if sync.waiting[successor] is None:
                continue
            sync.waiting[successor] -= 1
            if sync.waiting[successor] == 0:
                self._ready(successor)

    def _ready(self, index):
        step = self.layout.steps[index]
        if step["stream"] in SYNC_STREAMS:
            piece = step["piece"]
            with self.codecs.lane.on_stream(self._copies(self.sync, piece) + self.codecs.after(piece)):
                start = self.recorder.mark()
                self.codecs.run(piece, step["ops"], self.sync.iteration)
                self.recorder.add(index, self.sync.iteration, 0, start)
            self._done(index)
        elif step["stream"] == "comm":
            self.launcher.ready(index, self.recorder.now())
            self.sync.ready.add(index)
            self.lock.notify_all()

    # The stream threads.

    def _stream(self, stream):
        """Stream `stream`'s thread: each iteration, the collectives it is given, one at a time."""
        try:
            iteration = -1
            while True:
                with self.lock:
                    while not self.closed and (self.sync is None or self.sync.iteration <= iteration):
                        self.lock.wait()
                    if self.closed:
                        return
                    # The thread stays with this iteration's state even once the training
                    # thread has begun the next one.
                    sync = self.sync
                    iteration = sync.iteration
                while (index := self._next(stream, sync)) is not None:
                    self._run(index, stream, sync)
        except BaseException as err:  # noqa: BLE001 - handed to the training thread
            with self.lock:
                if self.failure is None:
                    self.failure = err
                self.lock.notify_all()

    def _next(self, stream, sync):
        """The collective the stream runs next in `sync`'s iteration, or None when it has none left."""
        control = None if self.controls is None else self.controls[stream]
        if control is not None and control.rank != 0:
            index = control.broadcast_int(None, f"rank 0's launch decision on stream {stream}")
            if index == END:
                return None
            with self.lock:
                if not 0 <= index < len(self.layout.steps) or self.layout.steps[index]["stream"] != "comm":
                    raise SyncopateError(f"rank 0 decided on step {index}, not a collective of the schedule")
                self._wait(lambda: self.closed or index in sync.ready)
                if self.closed:
                    return None
                if sync.done[index]:
                    raise SyncopateError(f"rank 0 decided on {kind_label(self.layout.steps[index])} twice "
                                         f"in iteration {sync.iteration}")
                sync.taken += 1
            return index
        with self.lock:
            index = self._decide(sync, stream)
        # Once stopped, nobody waits for the decision.
        if control is not None and not self.closed:
            control.broadcast_int(END if index is None else index, f"rank 0's launch decision on stream {stream}")
        return index

    def _decide(self, sync, stream):
        """The launch policy's next collective for `stream` on this rank's clock, waiting for one
        to be released (under plan order, for the stream's turn); None once every collective of
        `sync`'s iteration was taken."""
        while sync.taken < sync.collectives and not self.closed:
            now = self.recorder.now()
            index = self.launcher.next(stream, now)
            if index is not None:
                sync.taken += 1
                # Another stream waiting for the last collective may now send its END.
                self.lock.notify_all()
                return index
            release = self.launcher.next_release()
            self._wait_once(None if release is None else max(release - now, 0) / 1e9)
        return None

    def _run(self, index, stream, sync):
        """Launches collective step `index` of `sync`'s iteration on the stream's link and finishes it."""
        link = self.links[stream]
        piece = self.layout.steps[index]["piece"]
        with link.on_stream(self._copies(sync, piece) + self.codecs.after(piece)):
            with self.lock:
                step = self.layout.steps[index]
                piece, ops = step["piece"], step["ops"]
                split = ops.index("exchange")
                start = self.recorder.mark()
                self.codecs.run(piece, ops[:split], sync.iteration)
                _, fields = kind_of(step)
                what = f"{kind_label(step)} (rank {link.rank}, iteration {sync.iteration})"
                name, _ = exchange_of(self.layout.pieces[piece]["rounds"][fields["round"]])
                pending = self._exchange(link, name, piece, what)
            # The exchange touches only this piece's payload: the training thread may go on.
            arrived = pending.finish()
            with self.lock:
                self.codecs.deliver(piece, arrived)
                self.codecs.run(piece, ops[split + 1:], sync.iteration)
                self.recorder.add(index, sync.iteration, stream, start)
                self._done(index)
                sync.finished += 1
                self.lock.notify_all()

    def _copies(self, sync, piece):
        """The marks after which the gradients `piece` sends were in their buffer."""
        return [sync.copied[t] for t in self.piece_tensors[piece] if t in sync.copied]

    def _exchange(self, link, name, piece, what):
        state = self.state
        length = self.codecs.length.get(piece, 0)
        dtype = state.wire_dtype(piece) or "f32"
        if name == "allreduce":
            staged = self.codecs.staged.pop(piece, None)
            return exchange.Allreduce(link, state, piece, length, dtype, what, staged)
        if name == "hierarchical-allreduce":
            staged = self.codecs.staged.pop(piece, None)
            return exchange.HierarchicalAllreduce(link, state, piece, length, dtype, what, staged)
        if name == "reduce-scatter":
            staged = self.codecs.staged.pop(piece, None)
            pending = exchange.ReduceScatter(link, state, piece, length, dtype, what, staged)
            self.scattered[piece] = pending
            return pending
        if name == "allgather-shards":
            return exchange.AllgatherShards(link, state, piece, self.scattered.pop(piece), what)
        if name == "allgather" and self.codecs.on_device:
            return exchange.GatheredPayloads(link, piece, self.codecs.staged.pop(piece), what)
        if name == "allgather":
            return exchange.Allgather(link, state, piece, length, what)
        if name == "compressed-ring":
            return exchange.CompressedRing(link, state, piece, what)
        return exchange.PushPull(link, state, piece, length, state.server_rank(piece), what)


def pieces_tensors(layout, piece):
    """The tensors whose gradients lie in `piece` (a span of its group's buffer)."""
    lo, hi = piece["offset"], piece["offset"] + piece["numel"]
    return [slot["tensor"] for slot in layout.buffers[piece["group"]]["slots"]
            if slot["offset"] < hi and lo < slot["offset"] + slot["numel"]]


def kind_label(step):
    """`collective g3.0.1`, as the Rust side names steps."""
    kind, fields = kind_of(step)
    if kind == "collective":
        return f"collective g{fields['group']}.{fields['part']}.{fields['round']}"
    if kind in ("encode", "decode"):
        return f"{kind} g{fields['group']}.{fields['part']}"
    return kind
