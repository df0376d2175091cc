"""This rank's end of torch.distributed.

It has launches that remember their tensors, bounded waits, the exchanges' kept buffers, and an exit
that lets gloo's workers let go first.
"""

import atexit
import contextlib
import datetime
import pickle
import threading
import time

import torch
import torch.distributed as dist

from syncopate.errors import PeerFailure
from syncopate.torch.buffers import Buffers

# How long the exit waits for gloo's worker threads to drop the tensors of finished collectives.
SETTLE_TIMEOUT_S = 10.0
# Then how long it leaves them the interpreter's lock to drop what it cannot see: a collective's
# captured thread-local state and the copies gloo makes internally (reduce-scatter's, a
# barrier's list of the collectives it waited for). They need it for microseconds; this is a
# scheduling delay on a loaded machine with margin.
EXIT_GRACE_S = 0.1


class Launch:
    """A started collective and the tensors it was given (views and temporaries included)."""

    def __init__(self, work, tensors):
        self.work = work
        self.tensors = tensors


class Lane:
    """Where work of one kind is enqueued on `device`: on a CUDA device a stream of its own,
    made on first use (a lane that never runs anything takes none from the device's pool); on
    the CPU nothing, the work runs as it is called."""

    def __init__(self, device):
        self.device = device
        self._stream = None

    @property
    def stream(self):
        """The lane's CUDA stream; None on the CPU."""
        if self._stream is None and self.device.type == "cuda":
            self._stream = torch.cuda.Stream(self.device)
        return self._stream

    @contextlib.contextmanager
    def on_stream(self, after=()):
        """Makes the lane's stream wait for the events in `after`, then makes it the calling
        thread's current stream; on the CPU, nothing."""
        if self.device.type != "cuda":
            yield
            return
        for event in after:
            self.stream.wait_event(event)
        with torch.cuda.stream(self.stream):
            yield

    def join(self):
        """Makes the calling thread's current stream wait for what the lane's stream has queued."""
        if self._stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self._stream)


class Link:
    """This rank's end of the collectives: world, rank, timeout, and a tag per launch for
    point-to-point messages (every rank launches in the same order, so tags agree). Its tensors
    are on `device`: the CPU over gloo, or a CUDA device over NCCL, where the link's exchanges
    run on a CUDA stream of their own (`on_stream`).

    Gloo's worker thread releases a collective a moment after `wait` returns (and a barrier
    keeps the collectives it waited for until it is released itself). Releasing one drops
    Python objects (its tensors, its captured thread-local state), which needs the
    interpreter's lock; if the interpreter is already shutting down, the worker thread exits
    inside a C++ destructor and the process aborts ("terminate called without an active
    exception", the crash pytorch/pytorch#179291 describes; seen here about once in 10 runs of
    a 2-rank job on a loaded machine). So the link keeps every finished collective's tensors,
    and at exit `settle` waits, with the lock released, until gloo has dropped them, then a grace period
    for what it cannot see."""

    def __init__(self, rank, world, timeout_s, group=None, buffers=None, device=None):
        self.rank = rank
        self.world = world
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.group = group
        self.launches = 0
        self.device = device or torch.device("cpu")
        self.buffers = buffers if buffers is not None else Buffers(self.device)
        self.lane = Lane(self.device)

    def new_group(self):
        """A link over a process group of its own (the same ranks), sharing this link's kept
        buffers: a thread that issues collectives beside others needs one, since a group
        matches collectives by the order they are issued in. Every rank must call it, in the
        same order."""
        group = dist.new_group(timeout=self.timeout)
        return Link(self.rank, self.world, self.timeout.total_seconds(), group, self.buffers, self.device)

    def with_nodes(self, per_node):
        """A link over a process group of its own (as `new_group`) with `node`, a link over
        this rank's node's ranks (`per_node` consecutive ranks), and `across`, a link over the
        ranks with this rank's place in their node: the groups of a hierarchical allreduce.
        Every rank must call it, in the same order."""
        link = self.new_group()
        nodes = self.world // per_node
        for first in range(0, self.world, per_node):
            group = dist.new_group(list(range(first, first + per_node)), timeout=self.timeout)
            if first <= self.rank < first + per_node:
                link.node = Link(self.rank, per_node, self.timeout.total_seconds(), group, self.buffers, self.device)
        for place in range(per_node):
            group = dist.new_group(list(range(place, self.world, per_node)), timeout=self.timeout)
            if self.rank % per_node == place:
                link.across = Link(self.rank, nodes, self.timeout.total_seconds(), group, self.buffers, self.device)
        return link

    def on_stream(self, after=()):
        """Where the link's exchanges are launched and finished: on a CUDA device its own
        stream, made to wait first for the events in `after` (the copies of the gradients the
        exchange sends, the piece's codec work), so that torch's NCCL collectives, which wait
        for the launching stream, see them and nothing queued since; `join` makes the caller's
        stream wait for it in turn. On the CPU: nothing."""
        return self.lane.on_stream(after)

    def connect(self):
        """On a CUDA device, has NCCL make the communicators of this link's groups now, one at a
        time from the calling thread: it makes one at a group's first collective, and making
        one while another communicator's kernels run can deadlock (NCCL's documentation, "Using
        multiple NCCL communicators concurrently"). Every rank must call it, in the same order."""
        if self.device.type != "cuda":
            return
        for link in (self, getattr(self, "node", None), getattr(self, "across", None)):
            if link is not None:
                word = torch.zeros(1, device=self.device)
                link.wait(link.start(dist.all_reduce, word, async_op=True), "the first collective of a new group")
        torch.cuda.synchronize(self.device)

    def join(self):
        """Makes the calling thread's current stream wait for what the link's stream has queued."""
        self.lane.join()

    def start(self, collective, *args, **options):
        """Calls `collective(*args, **options)` (an asynchronous torch.distributed call) on
        this link's group."""
        tensors = [t for a in args for t in (a if isinstance(a, list) else [a]) if isinstance(t, torch.Tensor)]
        if self.group is not None:
            options["group"] = self.group
        return Launch(collective(*args, **options), tensors)

    def wait(self, launch, what):
        """Waits for `launch` within the timeout; a failure names what was waited for. With a
        timeout, NCCL's wait blocks the host until the collective completed on the GPU (and
        makes the current stream wait for it), as gloo's does."""
        try:
            if not launch.work.wait(self.timeout):
                raise PeerFailure(f"{what}: no answer within {self.timeout.total_seconds():g} s")
        except PeerFailure:
            raise
        except RuntimeError as err:
            raise PeerFailure(f"{what} failed on rank {self.rank}: {err}") from err
        if self.device.type != "cpu":
            return
        with SETTLING_LOCK:
            SETTLING[:] = [t for t in SETTLING if held_by_gloo(t)]
            SETTLING.extend(launch.tensors)

    def start_lengths(self, length):
        """Starts gathering every rank's `length`: finish with `finish_lengths`."""
        sizes = [torch.zeros(1, dtype=torch.int64, device=self.device) for _ in range(self.world)]
        mine = torch.tensor([length], dtype=torch.int64, device=self.device)
        return self.start(dist.all_gather, sizes, mine, async_op=True), sizes

    def finish_lengths(self, started, what):
        """Every rank's length, in rank order."""
        launch, sizes = started
        self.wait(launch, what + " (sizes)")
        return [int(s.item()) for s in sizes]

    def gather_lengths(self, length, what):
        """Every rank's `length`, in rank order (a small blocking all-gather)."""
        return self.finish_lengths(self.start_lengths(length), what)

    def gather_objects(self, value, what):
        """Every rank's picklable `value`, in rank order: the pickles' sizes first, then the
        pickles padded to the largest (gloo gathers equal sizes only)."""
        data = pickle.dumps(value)
        lengths = self.gather_lengths(len(data), what)
        mine = torch.zeros(max(lengths), dtype=torch.uint8)
        mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        mine = mine.to(self.device)
        gathered = [torch.empty_like(mine) for _ in range(self.world)]
        self.wait(self.start(dist.all_gather, gathered, mine, async_op=True), what)
        return [pickle.loads(g[:n].cpu().numpy().tobytes()) for g, n in zip(gathered, lengths)]

    def broadcast_int(self, value, what):
        """Rank 0's `value` (an int it passes; the others pass None) on every rank."""
        # On the link's stream, waiting for nothing: a control message reads no gradient and must
        # not wait for the backward pass queued on the default stream.
        with self.on_stream():
            word = torch.tensor([0 if value is None else value], dtype=torch.int64, device=self.device)
            self.wait(self.start(dist.broadcast, word, src=0, async_op=True), what)
            return int(word.item())

    def next_tag(self):
        self.launches += 1
        return (self.launches % (1 << 20)) * 4


# The finished collectives' tensors that gloo may still hold, of every link in this process
# (links wait on several threads: the training thread and one per communication stream).
SETTLING = []
SETTLING_LOCK = threading.Lock()


@atexit.register
def settle():
    """Waits, with the interpreter's lock released, until gloo holds none of the finished
    collectives' tensors (bounded), then for the grace period; nothing to wait for when no
    collective ran."""
    with SETTLING_LOCK:
        settling = list(SETTLING)
        SETTLING.clear()
    if not settling:
        return
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while any(held_by_gloo(t) for t in settling) and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(EXIT_GRACE_S)


def held_by_gloo(tensor):
    """Whether something besides its Python object still holds `tensor`."""
    return tensor._use_count() > 1
