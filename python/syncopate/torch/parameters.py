"""Matches a torch module's parameters with the tensors of a plan's model profile.

The match is by name and size, against the profile the plan was made for; a mismatch raises
PlanMismatch naming the tensor.
"""

import torch

from syncopate.errors import PlanMismatch, SyncopateError


def match_parameters(module, model, schedule, plan):
    """The module's parameters in the profile's tensor order, and their names."""
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    tensors = model["tensors"]
    made_for = f"{plan} was made for {model['name']} ({len(tensors)} tensors, fingerprint {schedule['model_fingerprint']})"
    if len(named) != len(tensors):
        raise PlanMismatch(f"{made_for}; the module has {len(named)} trainable parameters")
    by_name = dict(named)
    params = []
    for tensor in tensors:
        param = by_name.get(tensor["name"])
        if param is None:
            raise PlanMismatch(f"{made_for}; the module has no parameter {tensor['name']}")
        if param.numel() != tensor["numel"]:
            raise PlanMismatch(
                f"{made_for}; parameter {tensor['name']} has {param.numel()} elements, the profile {tensor['numel']}"
            )
        if param.dtype != torch.float32:
            raise SyncopateError(f"parameter {tensor['name']} is {param.dtype}: float32 parameters only")
        params.append(param)
    return params, [t["name"] for t in tensors]
