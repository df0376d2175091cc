"""Bad input ends in a Python exception that names it, never a hang.

The cases are a plan for another model, a world size the plan was not made for, dedicated parameter
servers, a non-finite gradient, a peer that dies.
"""

import datetime
import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import conftest
import models
import ranks
from syncopate import NonFiniteGradient, PeerFailure, PlanMismatch, SyncopateError
from syncopate.torch import DistributedOptimizer


@pytest.fixture
def alone():
    """A process group of this process alone."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{conftest.free_port()}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    yield
    dist.destroy_process_group()


def wrap(model, plan):
    return DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, plan, timeout_s=10)


def test_a_plan_for_another_model_is_refused(alone, make_plan):
    plan = make_plan("horovod", ranks_per_node=1)
    other = torch.nn.Sequential(torch.nn.Linear(16, 4))
    with pytest.raises(PlanMismatch, match=r"was made for tiny \(7 tensors, fingerprint [0-9a-f]{16}\); the module has 2"):
        wrap(other, plan)
    resized = models.tiny()
    resized[8] = torch.nn.Linear(24, 5)
    with pytest.raises(PlanMismatch, match=r"parameter 8\.(weight has 120 elements, the profile 96|bias has 5 elements, the profile 4)"):
        wrap(resized, plan)


def test_a_plan_for_another_world_size_is_refused(alone, make_plan):
    plan = make_plan("horovod", ranks_per_node=4)
    with pytest.raises(PlanMismatch, match=r"made for 4 ranks \(1 nodes × 4\), this run has world size 1"):
        wrap(models.tiny(), plan)


def test_a_plan_with_dedicated_servers_is_refused(alone, make_plan):
    plan = make_plan("ps", ranks_per_node=1)
    with pytest.raises(SyncopateError, match=r"policy\.ps_servers 1.*machines of their own.*`byteps`"):
        wrap(models.tiny(), plan)


def poisoned(rank, world, plan):
    """Rank 1's gradient of one tensor is NaN in the second iteration."""
    model = models.tiny()
    optimizer = wrap(model, plan)
    for k in range(3):
        optimizer.zero_grad()
        x, y = models.batch(rank, k)
        loss = F.cross_entropy(model(x), y)
        if rank == 1 and k == 1:
            loss = loss + model[4].bias.sum() * float("nan")
        loss.backward()
        optimizer.step()


def test_a_non_finite_gradient_names_its_tensor_and_stops_every_rank(make_plan):
    outcomes = ranks.run(poisoned, make_plan("horovod"), timeout=600)
    (status0, error0), (status1, error1) = outcomes
    assert status1 == "error" and error1[0] == "NonFiniteGradient", error1
    assert "gradient of 4.bias" in error1[1] and "rank 1, iteration 1" in error1[1]
    # The peer waits no longer than its timeout and says what it was waiting for.
    assert status0 == "error" and error0[0] == "PeerFailure", error0


def deserter(rank, world, plan):
    """Rank 1 leaves after the first iteration."""
    model = models.tiny()
    optimizer = wrap(model, plan)
    for k in range(3):
        if rank == 1 and k == 1:
            os._exit(0)
        optimizer.zero_grad()
        x, y = models.batch(rank, k)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()


def test_a_dead_peer_is_an_exception(make_plan):
    (status0, error0), _ = ranks.run(deserter, make_plan("wfbp", "topk:0.01"), timeout=600)
    assert status0 == "error" and error0[0] == "PeerFailure", error0
    assert "rank 0, iteration 1" in error0[1]


def test_exceptions_share_one_base():
    import syncopate

    for error in (NonFiniteGradient, PeerFailure, PlanMismatch):
        assert issubclass(error, syncopate.SyncopateError)
