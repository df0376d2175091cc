"""DGC's momentum correction is the momentum of the tensors it corrects.

This module says which parameters a plan corrects, builds optimizer groups that keep the others'
momentum, and checks that no parameter gets momentum twice.

DGC's memory accumulates u ← m·u + g and sends from v ← v + u, so the optimizer must not add
momentum to those parameters again (DGC's own DGCSGD skips them). A plan may leave groups
uncompressed beside DGC groups (a tuned plan does); those keep the optimizer's momentum.
"""

import json

import torch.distributed as dist

from syncopate import SyncopateError, lower
from syncopate.torch.parameters import match_parameters


def corrected_tensors(schedule):
    """The profile's tensor indices whose group's memory is DGC's."""
    groups = {p["group"] for p in schedule["pieces"] if str(p["memory"]).startswith("dgc")}
    return {slot["tensor"] for g in groups for slot in schedule["buffers"][g]["slots"]}


def param_groups(module, plan, momentum, *, model_profile=None, **options):
    """Parameter groups for torch.optim.SGD (or any optimizer with a `momentum` option): the
    parameters `plan`'s DGC memory corrects with momentum 0, the rest with `momentum`; the
    other `options` (lr, weight_decay, …) go to both. Call it after init_process_group."""
    if not dist.is_available() or not dist.is_initialized():
        raise SyncopateError("torch.distributed is not initialized: call init_process_group first")
    schedule_json, model_json = lower(str(plan), dist.get_world_size(), model_profile)
    schedule = json.loads(schedule_json)
    params, _ = match_parameters(module, json.loads(model_json), schedule, str(plan))
    corrected = corrected_tensors(schedule)
    groups = [
        {"params": [p for t, p in enumerate(params) if t in corrected], "momentum": 0.0, **options},
        {"params": [p for t, p in enumerate(params) if t not in corrected], "momentum": momentum, **options},
    ]
    return [g for g in groups if g["params"]]


def check_momentum(optimizer, params, names, schedule):
    """Raises when `optimizer` applies momentum to a parameter that DGC's memory corrects."""
    corrected = {id(params[t]): names[t] for t in corrected_tensors(schedule)}
    for group in optimizer.param_groups:
        if group.get("momentum", 0) > 0:
            twice = [corrected[id(p)] for p in group["params"] if id(p) in corrected]
            if twice:
                raise SyncopateError(
                    f"parameter {twice[0]}: its group's memory is dgc, whose momentum correction is its momentum, "
                    f"but the optimizer adds momentum {group['momentum']} to it: build the optimizer from "
                    "syncopate.torch.momentum.param_groups (momentum 0 for the corrected parameters)"
                )
