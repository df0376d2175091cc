"""`check`: on the first iterations, every rank's results against exec's reference aggregation.

Every rank's compression inputs and aggregated results are all-gathered and compared with exec's
reference aggregation (the same codecs and seeds); a mismatch raises CheckFailed.
"""

import json

import torch
import torch.distributed as dist

from syncopate import Checker, SyncopateError
from syncopate.errors import CheckFailed


class Check:
    """Keeps this rank's inputs and results of the checked iterations and verifies them once
    per iteration, at a point every rank reaches in the same order."""

    def __init__(self, schedule_json, seed, iterations, state, pieces, link):
        self.checker = Checker(schedule_json, seed)
        self.seed = seed
        self.iterations = iterations
        self.state = state
        self.pieces = pieces
        self.link = link
        self.inputs = {}
        self.outputs = {}
        self.verified = -1
        self.reports = []

    def restart(self, schedule_json, iteration, epoch):
        """The codecs changed before `iteration` (DGC's warm-up at `epoch`): the reference
        restarts with them. Only possible before the first iteration, or after the checked
        ones: a fresh reference mid-check would restart every piece's codec state, not only the
        changed ones'."""
        if 0 < iteration < self.iterations:
            raise SyncopateError(
                f"set_epoch({epoch}) changes DGC's warm-up ratio at iteration {iteration}, inside the {self.iterations} "
                "checked iterations: make check at most the iterations of one epoch"
            )
        if iteration == 0:
            self.checker = Checker(schedule_json, self.seed)

    def _copy(self, piece, read):
        values = torch.empty(self.pieces[piece]["numel"], dtype=torch.float32)
        read(piece, values.numpy())
        return values

    def input(self, piece, iteration, values=None):
        """Keeps the piece's compression input: `values` (a tensor the executor encoded from),
        else the state's compensated input."""
        if iteration < self.iterations:
            self.inputs[piece] = values.clone() if values is not None else self._copy(piece, self.state.copy_compensated)

    def result(self, piece, iteration, values=None):
        """Keeps the piece's decoded sum: `values` (a tensor the executor decoded into), else
        the state's result."""
        if iteration < self.iterations:
            self.outputs[piece] = values.clone() if values is not None else self._copy(piece, self.state.copy_result)

    def verify(self, iteration):
        """Gathers every piece's inputs and results of `iteration` and raises on a mismatch."""
        if iteration >= self.iterations or iteration <= self.verified:
            return
        self.verified = iteration
        world = self.link.world
        for piece in range(len(self.pieces)):
            for values, report in ((self.inputs, self.checker.input), (self.outputs, self.checker.result)):
                mine = values.pop(piece)
                if mine.is_cuda:
                    # Cloned on a link's stream, read and freed on this one.
                    mine.record_stream(torch.cuda.current_stream(mine.device))
                gathered = [torch.empty_like(mine) for _ in range(world)]
                self.link.wait(self.link.start(dist.all_gather, gathered, mine, async_op=True), f"check of piece {piece}")
                for rank, theirs in enumerate(gathered):
                    report(piece, rank, iteration, theirs.cpu().numpy())
        self.reports = json.loads(self.checker.report())
        for group in self.reports:
            if not group["ok"]:
                raise CheckFailed(
                    f"group {group['group']} ({group['compressor']}), iteration {iteration}: aggregated gradient differs "
                    f"from the reference by {group['max_error_vs_reference']:.3g} (tolerance "
                    f"{group['tolerance_vs_reference']:.3g}); from the exact sum by {group['max_error_vs_sum']:.3g}"
                    + (f" (tolerance {group['tolerance_vs_sum']:.3g})" if group.get("tolerance_vs_sum") is not None else "")
                )
