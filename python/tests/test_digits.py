"""The digits trainer of the experiments trains an epoch at 2 ranks under a plan.

The trainer is experiments/digits/train.py, and set_epoch runs DGC's per-epoch warm-up.
"""

import importlib.util
import json
import math

import pytest
import torch
import torch.nn.functional as F

import conftest
import models
import ranks
from syncopate import Rank, SyncopateError, lower
from syncopate.torch import DistributedOptimizer

TRAINER = conftest.REPO / "experiments" / "digits" / "train.py"


def trainer():
    spec = importlib.util.spec_from_file_location("digits_train", TRAINER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_split_is_fixed_and_complete():
    digits = trainer()
    train_x, train_y, test_x, test_y = digits.load_digits()
    assert (len(train_y), len(test_y)) == (1437, 360)
    assert train_x.shape[1:] == (1, 8, 8)
    # Standardized with the training set's statistics (the test set's are close, not exact).
    assert abs(float(train_x.mean())) < 1e-5 and abs(float(train_x.std()) - 1) < 1e-5
    assert abs(float(test_x.mean())) < 0.1
    assert set(test_y.tolist()) == set(range(10))
    again = digits.load_digits()
    assert torch.equal(again[3], test_y)
    # Every rank gets as many whole batches as the others, disjoint from theirs.
    shards = [digits.shard(len(train_y), 3, 7, r, 4, 32) for r in range(4)]
    assert {s.shape for s in shards} == {(11, 32)}
    flat = torch.cat([s.flatten() for s in shards])
    assert len(set(flat.tolist())) == len(flat)


def one_epoch(rank, world, plan, profile, out):
    digits = trainer()
    args = digits.parse(["--plan", str(plan), "--model-profile", str(profile), "--epochs", "1", "--check", "2",
                         "--out", str(out), "--trace", str(out.with_suffix(".trace.json"))])
    digits.train(args, rank, world)
    return True


@pytest.fixture(scope="module")
def digits_profile(tmp_path_factory):
    digits = trainer()
    path = tmp_path_factory.mktemp("digits") / "digits.json"
    digits.record_profile(digits.parse(["--record-profile", str(path)]), 0, 1)
    return path


def test_the_trainer_runs_an_epoch_at_2_ranks(digits_profile, tmp_path):
    plan = tmp_path / "plan.json"
    conftest.cli("simulate", "--model", digits_profile, "--cluster", "v100-10gbe", "--nodes", 1, "--gpus-per-node", 2,
                 "--strategy", "horovod", "--compressor", "fp16", "--save-plan", plan)
    out = tmp_path / "log.json"
    ranks.values(ranks.run(one_epoch, plan, digits_profile, out))
    log = json.loads(out.read_text())
    (epoch,) = log["epochs"]
    assert log["world_size"] == 2 and epoch["iterations"] == 22
    assert epoch["epoch_s"] > 0 and 0 <= epoch["test_accuracy"] <= 1 and epoch["train_loss"] > 0
    summary = json.loads(out.with_suffix(".trace.json").read_text())["otherData"]
    assert summary["measured_iterations"] == 20
    assert summary["checks"] and all(check["ok"] for check in summary["checks"])


def payload_lengths(state, schedule, epoch):
    """Each piece's payload length in bytes after `set_epoch(epoch)` (a gradient of ones)."""
    state.set_epoch(epoch)
    lengths = []
    for index, piece in enumerate(schedule["pieces"]):
        buffer = torch.ones(schedule["buffers"][piece["group"]]["numel"], dtype=torch.float32)
        state.compensate(index, buffer.numpy())
        lengths.append(state.encode(index))
    return lengths


def test_set_epoch_follows_dgc_warmup(make_plan):
    # Memory dgc:0.9:5: ratios 0.25, 0.063, 0.015, 0.004, 0.001 in epochs 0..4, the plan's after.
    plan = make_plan("horovod", "topk:0.01", "dgc:0.9:5")
    schedule_json, _ = lower(str(plan), 2, None)
    schedule = json.loads(schedule_json)
    numel = [piece["numel"] for piece in schedule["pieces"]]
    state = Rank(schedule_json, 0, 0)
    assert state.set_epoch(0) == list(range(len(numel)))
    # top-k sends k = ceil(ratio · n) u32 indices and f32 values.
    expected = lambda ratio: [8 * min(n, max(1, math.ceil(ratio * n))) for n in numel]
    assert payload_lengths(state, schedule, 0) == expected(0.25)
    assert payload_lengths(state, schedule, 2) == expected(0.015)
    assert payload_lengths(state, schedule, 5) == expected(0.01)  # never below the plan's ratio
    assert state.set_epoch(6) == []
    assert json.loads(state.schedule_json())["pieces"][0]["compressor"] == "topk:0.01"
    # Without DGC's memory nothing depends on the epoch.
    plain = make_plan("horovod", "topk:0.01", "residual")
    assert Rank(lower(str(plain), 2, None)[0], 0, 0).set_epoch(0) == []


def warm_training(rank, world, plan, check, epochs):
    """Two iterations per epoch of the tiny model under `plan`, entering each epoch."""
    torch.manual_seed(0)
    model = models.tiny()
    optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, plan, check=check, timeout_s=30)
    changed = []
    for epoch in epochs:
        changed.append(optimizer.set_epoch(epoch))
        for k in range(2):
            optimizer.zero_grad()
            x, y = models.batch(rank, 2 * epoch + k)
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
    optimizer.flush()
    checks = optimizer.check.reports if optimizer.check else []
    optimizer.close()
    return {"changed": [len(c) for c in changed], "checks": checks}


def test_set_epoch_in_training_keeps_the_check(make_plan):
    plan = make_plan("wfbp", "dgc:0.001", "dgc:0.9:2")
    outcome = ranks.values(ranks.run(warm_training, plan, 2, [0, 1, 2]))
    pieces = outcome[0]["changed"][0]
    assert pieces > 0 and outcome[0]["changed"] == [pieces, pieces, pieces]
    assert outcome[0]["checks"] and all(c["ok"] and c["checked"] == 2 for c in outcome[0]["checks"])


def test_set_epoch_inside_the_checked_iterations_is_refused(make_plan):
    plan = make_plan("wfbp", "dgc:0.001", "dgc:0.9:2")
    with pytest.raises(ranks.RankError, match=r"set_epoch\(1\) changes DGC's warm-up ratio at iteration 2, inside the 4 checked"):
        ranks.values(ranks.run(warm_training, plan, 4, [0, 1]))


def bad_epochs(rank, world, plan):
    model = models.tiny()
    optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, plan, timeout_s=30)
    refused = 0
    for epoch in (-1, 1.5, True, 2**32):
        with pytest.raises(SyncopateError, match="is not an epoch number"):
            optimizer.set_epoch(epoch)
        refused += 1
    optimizer.close()
    return refused


def test_set_epoch_refuses_bad_epochs(make_plan):
    plan = make_plan("wfbp", "dgc:0.001", "dgc")
    assert ranks.values(ranks.run(bad_epochs, plan)) == [4, 4]
