"""DistributedOptimizer: wraps a torch optimizer so that a plan's Schedule synchronizes gradients.

The Schedule is the plan's lowered one, run Horovod/DeAR style: hooks, async collectives, updates.
"""

import functools
import json

import torch
import torch.distributed as dist

from syncopate import SyncopateError, lower
from syncopate.torch import timing
from syncopate.torch.check import Check
from syncopate.torch.device import check_backend, codec_state, device_of, refusal
from syncopate.torch.link import Link
from syncopate.torch.executor import Executor
from syncopate.torch.momentum import check_momentum
from syncopate.torch.parameters import match_parameters
from syncopate.torch.schedule import Layout, kind_of


class DistributedOptimizer:
    """Runs `plan` (a plan file; `model_profile` overrides the model profile it records) for
    `module` on the initialized torch.distributed process group: gloo for float32 parameters on
    the CPU, NCCL for float32 parameters on one CUDA device (buffers, codecs, collectives and
    timings on the GPU; what a device refuses is `device.refusal`).

    Gradients are copied into their group's fusion buffer as they become ready; the schedule's
    encode, collective and decode steps follow its dependencies and launch policy. `step()`
    applies the averaged gradients; plans that update each group just before its next forward
    (DeAR, ByteScheduler) do so in forward pre-hooks, and `flush()` applies what is pending
    (call it before evaluating or saving the model). `check=N` compares the first N
    iterations' aggregated gradients with the reference aggregation and raises on a mismatch.
    `timeout_s` bounds every wait for a peer."""

    def __init__(self, optimizer, module, plan, *, model_profile=None, seed=0, check=0, timeout_s=60.0):
        if not dist.is_available() or not dist.is_initialized():
            raise SyncopateError("torch.distributed is not initialized: call init_process_group first")
        if not timeout_s > 0:
            raise SyncopateError(f"timeout_s: {timeout_s!r} is not a positive number of seconds")
        if check < 0:
            raise SyncopateError(f"check: {check!r} is not a number of iterations")
        self.optimizer = optimizer
        self.world = dist.get_world_size()
        self.rank = dist.get_rank()
        self.seed = seed
        self.schedule_json, self.model_json = lower(str(plan), self.world, model_profile)
        schedule = json.loads(self.schedule_json)
        model = json.loads(self.model_json)
        self.params, names = match_parameters(module, model, schedule, str(plan))
        self.device = device_of(self.params, names)
        check_backend(self.device)
        check_momentum(optimizer, self.params, names, schedule)
        self.layout = Layout(schedule, self.schedule_json)
        refused = refusal(self.device, self.layout, schedule["policy"]["comm_streams"])
        if refused is not None:
            raise SyncopateError(f"{plan} on {self.device}: {refused}")
        self.link = Link(self.rank, self.world, timeout_s, device=self.device)
        self.state = codec_state(self.device, self.layout, self.rank, seed)
        self.recorder = timing.Recorder(self.rank, self.device)
        self._buffers(schedule)
        self.check = (
            Check(self.schedule_json, seed, check, self.state, schedule["pieces"], self.link) if check else None
        )
        self.executor = Executor(
            self.layout, self.schedule_json, self.state, self.link, self.buffers, self.results,
            self.scales, self.recorder, self.check, names,
        )
        self.iteration = -1
        self.in_backward = False
        self.pending_updates = set()
        self.handles = [
            p.register_post_accumulate_grad_hook(functools.partial(self._gradient, t)) for t, p in enumerate(self.params)
        ]
        self._forward_hooks(module)
        # A common time origin for the trace, and a first proof that every peer is there.
        self.link.wait(self.link.start(dist.barrier, async_op=True), "the start barrier")
        self.recorder.restart()
        self.last_ready = self.last_forward_end = self.recorder.origin()

    def _buffers(self, schedule):
        """Each group's fusion buffer and result buffer; each parameter's slots in them. A
        group reduced in fp16 divides by the world size before summing (Horovod's prescale,
        so the sum cannot overflow); the others divide the decoded sum."""
        self.buffers = [torch.zeros(b["numel"], dtype=torch.float32, device=self.device) for b in schedule["buffers"]]
        self.results = [torch.zeros(b["numel"], dtype=torch.float32, device=self.device) for b in schedule["buffers"]]
        self.prescale = [False] * len(self.buffers)
        for index, piece in enumerate(schedule["pieces"]):
            self.prescale[piece["group"]] = self.state.wire_dtype(index) == "f16"
        self.scales = [1.0 if pre else 1.0 / self.world for pre in self.prescale]
        self.slots = [None] * len(self.params)
        for g, buffer in enumerate(schedule["buffers"]):
            for slot in buffer["slots"]:
                t, lo, hi = slot["tensor"], slot["offset"], slot["offset"] + slot["numel"]
                shape = self.params[t].shape
                self.slots[t] = (g, self.buffers[g][lo:hi], self.results[g][lo:hi].view(shape))

    def _forward_hooks(self, module):
        index = {id(p): t for t, p in enumerate(self.params)}
        for owner in module.modules():
            own = sorted(index[id(p)] for p in owner.parameters(recurse=False) if id(p) in index)
            if own:
                self.handles.append(owner.register_forward_pre_hook(functools.partial(self._before_forward, own)))
                self.handles.append(owner.register_forward_hook(functools.partial(self._after_forward, own)))

    # Hooks.

    def _before_forward(self, tensors, _module, _inputs):
        for t in tensors:
            for g in self.layout.updates_before.get(t, []):
                if g in self.pending_updates:
                    self.executor.finish_steps(self.layout.tails[g])
                    self._update(g)
        self.forward_start = self.recorder.mark()

    def _after_forward(self, tensors, _module, _inputs, _output):
        if not torch.is_grad_enabled():
            return
        end = self.recorder.mark()
        for i, t in enumerate(tensors):
            self.recorder.span(self.layout.forward[t], self.iteration + 1, 0, self.forward_start, end, i, len(tensors))
        self.last_forward_end = end

    def _gradient(self, tensor, param):
        if not self.in_backward:
            self.in_backward = True
            self.iteration += 1
            self.executor.begin(self.iteration)
            self.last_ready = self.last_forward_end
        sync = self.executor.sync
        step = self.layout.backward[tensor]
        if sync.done[step]:
            raise SyncopateError(
                f"the gradient of {self._name(tensor)} arrived twice in iteration {self.iteration}: call step() "
                "after each backward pass (accumulating several backward passes is not supported)"
            )
        group, inputs, _ = self.slots[tensor]
        grad = param.grad.reshape(-1)
        if self.prescale[group]:
            torch.div(grad, self.world, out=inputs)
        else:
            inputs.copy_(grad)
        now = self.recorder.mark()
        self.recorder.span(step, self.iteration, 0, self.recorder.earlier(self.last_ready, now), now)
        self.last_ready = now
        self.executor.gradient_ready(tensor, now)

    def _name(self, tensor):
        return self.executor.names[tensor]

    # The optimizer.

    def _missing(self, steps):
        """Tensors whose gradient never arrived before `steps` were needed."""
        sync = self.executor.sync
        missing = [self._name(t) for t, s in self.layout.backward.items() if not sync.done[s]]
        if missing:
            raise SyncopateError(
                f"iteration {self.iteration}: no gradient arrived for {len(missing)} parameter(s), e.g. {missing[0]} "
                "(unused parameters cannot be synchronized: freeze them with requires_grad=False)"
            )
        self.executor.finish_steps(steps)

    def _attach(self, groups):
        """Points the parameters of `groups` at their averaged gradients, the others at None."""
        chosen = set(groups)
        for t, p in enumerate(self.params):
            group, _, result = self.slots[t]
            p.grad = result if group in chosen else None

    def _timed(self, step, iteration, body):
        start = self.recorder.mark()
        value = body()
        if step is not None:
            self.recorder.add(step, iteration, 0, start)
        return value

    def _update(self, group):
        self._attach([group])
        self._timed(self.layout.update_step[group], self.iteration + 1, self.optimizer.step)
        for t, p in enumerate(self.params):
            if self.slots[t][0] == group:
                p.grad = None
        self.pending_updates.discard(group)

    def step(self, closure=None):
        """Synchronizes this iteration's gradients and applies them (or, for plans that
        overlap updates with the next forward, leaves them pending for its pre-hooks)."""
        if closure is not None:
            raise SyncopateError("step(closure): closures re-run backward, which a schedule cannot replay")
        if not self.in_backward:
            raise SyncopateError("step() without a backward pass since the last step()")
        self.in_backward = False
        if not self.layout.pieces:
            # One rank: nothing to synchronize; the gradients are the average already.
            return self._timed(self.layout.optimizer, self.iteration, self.optimizer.step)
        if self.layout.overlap:
            self._missing([])
            # The all-gathers go out as the reduce-scatters finish, overlapping the next forward.
            self.pending_updates = set(self.layout.update_step)
            return None
        self._missing(self.layout.waits_for(self.layout.optimizer, self.iteration))
        self.executor.finish_all()
        self._attach(range(len(self.buffers)))
        return self._timed(self.layout.optimizer, self.iteration, self.optimizer.step)

    def synchronize(self):
        """Completes every collective of the iteration (before gradient clipping, say)."""
        self.executor.finish_all()

    def flush(self):
        """Applies every pending per-group update now (before evaluation or saving)."""
        self.executor.finish_all()
        for step in sorted(self.layout.update_step[g] for g in self.pending_updates):
            _, fields = kind_of(self.layout.steps[step])
            self._update(fields["group"])

    def set_epoch(self, epoch):
        """Tells the plan's codecs that training epoch `epoch` (from 0) begins; call it on every
        rank before the epoch's first backward. DGC's warm-up is per epoch (the memory
        `dgc:MOMENTUM:WARMUP_EPOCHS`): its pieces sparsify at 0.25, 0.063, 0.015, 0.004, 0.001 of
        the elements stretched over the warm-up epochs, never below the plan's ratio, and at the
        plan's ratio afterwards. Without calls the plan's ratio holds from the first iteration.
        Other compressors and memories do not depend on the epoch. Returns the pieces whose
        codecs changed (each starts afresh from its seed)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch < 2**32:
            raise SyncopateError(f"set_epoch: {epoch!r} is not an epoch number (an integer from 0)")
        if self.in_backward:
            raise SyncopateError(f"set_epoch({epoch}) during a backward pass: call it between step() and the next backward")
        self.executor.finish_all()
        changed = self.state.set_epoch(epoch)
        if changed and self.check is not None:
            self.check.restart(self.state.schedule_json(), self.iteration + 1, epoch)
        return changed

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def write_trace(self, path, warmup=1):
        """Writes the run's measured trace (every rank calls it; rank 0 writes `path`)."""
        if warmup < 1:
            raise ValueError(f"write_trace: warmup {warmup}: at least one warm-up iteration (its tail pays first-time costs)")
        self.executor.finish_all()
        checks = self.check.reports if self.check else []
        timing.write(path, self.schedule_json, self.model_json, self.recorder, self.link, warmup,
                     self.seed, checks)

    def close(self):
        """Removes the hooks from the module and its parameters, and ends the communication threads."""
        for handle in self.handles:
            handle.remove()
        self.handles = []
        self.executor.close()

    def __getattr__(self, name):
        # param_groups, state, state_dict, ...: the wrapped optimizer's.
        return getattr(self.__dict__["optimizer"], name)
