"""A lowered Schedule (JSON from Rust) read into the indices the executor walks.

The indices are steps, pieces and groups; which step waits for which comes from the Rust
extension (`Dependencies`), as the simulator unrolls it. Nothing here decides what a plan means.
"""

from syncopate import Dependencies

SYNC_STREAMS = ("codec", "cpu")
# The exchanges that sum the ranks' payloads element-wise, in place.
SUMMED = ("allreduce", "hierarchical-allreduce")


def kind_of(step):
    """(kind, fields) of a step: `{"backward": {"tensor": 3}}` → ("backward", {"tensor": 3})."""
    kind = step["kind"]
    if isinstance(kind, str):
        return kind, {}
    (name, fields), = kind.items()
    return name, fields


def exchange_of(round_):
    """The exchange's name and, for push-pull, its fields."""
    exchange = round_["exchange"]
    if isinstance(exchange, str):
        return exchange, {}
    (name, fields), = exchange.items()
    return name, fields


def is_summed(piece):
    """Whether `piece`'s first round is summed in place (an allreduce, flat or hierarchical)."""
    first, _ = exchange_of(piece["rounds"][0])
    return first in SUMMED


def is_identity(piece):
    """Whether `piece` has no codec work: no compressor, no memory, one round, summed in place
    (its wire format is its float32 elements themselves)."""
    return (is_summed(piece) and piece["compressor"] == "none" and piece["memory"] == "none"
            and len(piece["rounds"]) == 1)


class Layout:
    """The schedule's steps with the dependency rules of each iteration, where each tensor's
    backward and forward steps are, which groups' updates run before which tensor's forward, and
    each group's synchronization tails (what its update waits for from the iteration before)."""

    def __init__(self, schedule, schedule_json):
        self.schedule_json = schedule_json
        self.world = schedule["world"]
        self.steps = schedule["steps"]
        self.pieces = schedule["pieces"]
        self.buffers = schedule["buffers"]
        self.dependencies = Dependencies(schedule_json)
        # Steps with `from_iteration` 1 run from the second iteration on, so the first and the
        # second iteration's rules hold for all.
        self._waiting = [self.dependencies.waiting(i) for i in (0, 1)]
        self._successors = [self.dependencies.successors(i) for i in (0, 1)]
        self.backward = {}
        self.forward = {}
        self.updates_before = {}
        self.update_step = {}
        self.optimizer = None
        pending_updates = []
        for index, step in enumerate(self.steps):
            kind, fields = kind_of(step)
            if kind == "backward":
                self.backward[fields["tensor"]] = index
            elif kind == "forward":
                self.forward[fields["tensor"]] = index
                self.updates_before[fields["tensor"]] = pending_updates
                pending_updates = []
            elif kind == "update":
                pending_updates.append(fields["group"])
                self.update_step[fields["group"]] = index
            elif kind == "optimizer":
                self.optimizer = index
        self.tails = {g: self.dependencies.waits_for_previous(s, 1) for g, s in self.update_step.items()}

    def waiting(self, iteration):
        """Per step, how many steps of its iteration it waits for, None if it does not run."""
        return list(self._waiting[min(iteration, 1)])

    def successors(self, iteration):
        """Per step, the steps of its iteration that wait for it."""
        return self._successors[min(iteration, 1)]

    def waits_for(self, index, iteration):
        """The steps of its iteration that step `index` waits for."""
        return self.dependencies.waits_for(index, iteration)

    @property
    def overlap(self):
        """Whether groups update just before their next forward (DeAR, ByteScheduler)."""
        return bool(self.update_step)
