"""A lowered Schedule (JSON from Rust) read into the indices the executor walks.

The indices are steps, successors, pieces and groups; nothing here decides what a plan means.
"""

SYNC_STREAMS = ("codec", "cpu")


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


class Layout:
    """The schedule's steps with their successors, where each tensor's backward and forward
    steps are, which groups' updates run before which tensor's forward, and each group's
    synchronization tails (what its update or the optimizer waits for)."""

    def __init__(self, schedule):
        self.world = schedule["world"]
        self.steps = schedule["steps"]
        self.pieces = schedule["pieces"]
        self.buffers = schedule["buffers"]
        self.successors = [[] for _ in self.steps]
        for index, step in enumerate(self.steps):
            for before in step.get("after", []):
                self.successors[before].append(index)
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
        self.tails = {g: self.steps[s].get("after_previous", []) for g, s in self.update_step.items()}

    def exists_in(self, index, iteration):
        return self.steps[index].get("from_iteration", 0) <= iteration

    @property
    def overlap(self):
        """Whether groups update just before their next forward (DeAR, ByteScheduler)."""
        return bool(self.update_step)
