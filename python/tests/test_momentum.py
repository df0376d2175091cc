"""DGC's momentum correction is the momentum of the parameters it corrects.

param_groups gives them momentum 0 and the rest the optimizer's, and an optimizer that adds momentum
to a corrected parameter is refused (2 gloo ranks: one rank alone exchanges nothing and corrects
nothing).
"""

import json

import pytest

import ranks


@pytest.fixture
def mixed_plan(make_plan):
    """A wfbp DGC plan whose first group (one tensor) is left uncompressed, as a tuned plan may."""
    path = make_plan("wfbp", "dgc:0.01", "dgc", ranks_per_node=2)
    plan = json.loads(path.read_text())
    plan["groups"][0].update(compressor="none", memory="none")
    mixed = path.with_name("mixed-dgc.json")
    mixed.write_text(json.dumps(plan))
    return mixed, plan["groups"][0]["tensors"]


def groups_and_refusal(rank, world, plan):
    import torch

    import models
    from syncopate import SyncopateError
    from syncopate.torch import DistributedOptimizer
    from syncopate.torch.momentum import param_groups

    model = models.tiny()
    groups = param_groups(model, plan, 0.9, lr=0.1)
    # The optimizer built from them is accepted; one that adds momentum everywhere is not.
    DistributedOptimizer(torch.optim.SGD(groups), model, plan, timeout_s=10).close()
    try:
        DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model, plan, timeout_s=10)
        refusal = None
    except SyncopateError as err:
        refusal = str(err)
    return {g["momentum"]: (len(g["params"]), g["lr"]) for g in groups}, len(list(model.parameters())), refusal


def test_uncompressed_groups_keep_the_optimizers_momentum_and_corrected_ones_get_none(mixed_plan):
    plan, plain_tensors = mixed_plan
    for by_momentum, params, refusal in ranks.values(ranks.run(groups_and_refusal, plan)):
        assert by_momentum == {0.9: (len(plain_tensors), 0.1), 0.0: (params - len(plain_tensors), 0.1)}
        assert refusal is not None and "memory is dgc" in refusal and "adds momentum 0.9" in refusal, refusal
        assert "param_groups" in refusal
