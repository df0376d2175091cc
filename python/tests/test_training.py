"""Training under plans of every scheme on 2 gloo ranks.

The check passes, every rank ends with the same parameters, and uncompressed plans match
single-process training on the averaged gradients.
"""

import json

import pytest
import torch

import conftest
import models
import ranks
import training

# (strategy, compressor, memory[, the groups' scheme[, comm streams[, codec calls]]]): every exchange the lowering produces,
# partitions and priorities (bytescheduler), updates overlapping the next forward (dear,
# bytescheduler), error feedback and multi-round codecs. A scheme set by hand covers what the
# strategies do not pick for a model this small (HiPress keeps its tiny gradients uncompressed);
# plan order on two streams has its collectives take the streams in turn, every rank alone;
# Horovod's Compression compresses each tensor before the fused collective (codec calls per tensor).
PLANS = [
    ("horovod", "none", None),
    ("horovod", "onebit", None, "compressed-ring"),
    ("horovod", "fp16", None, "hierarchical"),
    ("horovod", "terngrad", None, "ps"),
    ("horovod", "fp16", None),
    ("ddp", "bf16", None),
    ("wfbp", "dgc:0.01", "dgc"),
    ("wfbp", "topk:0.01", "residual"),
    ("wfbp", "randomk:0.01", None),
    ("mgwfbp", "efsignsgd", "efsignsgd:0.1"),
    ("fixed-groups:2", "powersgd:4", None),
    ("bytescheduler", "none", None),
    ("dear", "none", None),
    ("fixed-groups:3", "none", None, None, 2),
    ("byteps", "none", None),
    ("byteps", "qsgd:256", None),
    ("hipress", "onebit", None),
    ("horovod", "efsignsgd", "efsignsgd:0.1", None, None, "tensor"),
    ("horovod", "fp16", None, None, None, "tensor"),
]
ITERATIONS = 3


def edited(path, scheme=None, streams=None, calls=None):
    """The plan at `path` with its groups set to `scheme`, its policy to `streams`
    communication streams and its codec calls to `calls` (a copy next to it), or as it is."""
    if scheme is None and streams is None and calls is None:
        return path
    plan = json.loads(path.read_text())
    if scheme is not None:
        plan["groups"] = [dict(group, scheme=scheme) for group in plan["groups"]]
    if streams is not None:
        plan["policy"]["comm_streams"] = streams
    if calls is not None:
        plan["codec_calls"] = calls
    copy = path.with_name(f"{path.stem}-{scheme}-{streams}-{calls}.json")
    copy.write_text(json.dumps(plan))
    return copy


@pytest.fixture(scope="module")
def trained(make_plan, tmp_path_factory):
    plans = [edited(make_plan(*plan[:3]), *plan[3:]) for plan in PLANS]
    trace = tmp_path_factory.mktemp("trace") / "measured.json"
    outcomes = ranks.values(ranks.run(training.train_each, plans, iterations=ITERATIONS, check=2))
    # One more run writes a trace: the first plan's.
    ranks.values(ranks.run(training.train, plans[0], iterations=ITERATIONS, trace=str(trace)))
    return outcomes, json.loads(trace.read_text())


def test_every_plan_passes_the_check(trained):
    outcomes, _ = trained
    for (strategy, compressor, *_), result in zip(PLANS, outcomes[0]):
        assert result["checks"], f"{strategy}/{compressor}: nothing was checked"
        for group in result["checks"]:
            assert group["ok"] and group["checked"] >= 2, f"{strategy}/{compressor}: {group}"


def test_ranks_end_with_identical_parameters(trained):
    outcomes, _ = trained
    for plan, first, second in zip(PLANS, outcomes[0], outcomes[1]):
        assert first["params"] == second["params"], plan


@pytest.mark.parametrize("index", [i for i, p in enumerate(PLANS) if p[1] == "none"])
def test_uncompressed_plans_match_averaged_gradients(trained, index):
    outcomes, _ = trained
    expected = training.reference(2, ITERATIONS)
    for got, want in zip(outcomes[0][index]["params"], expected):
        assert torch.allclose(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-6), PLANS[index]


def test_casts_stay_close_to_averaged_gradients(trained):
    outcomes, _ = trained
    expected = training.reference(2, ITERATIONS)
    for index, (_, compressor, *_) in enumerate(PLANS):
        if compressor in ("fp16", "bf16"):
            for got, want in zip(outcomes[0][index]["params"], expected):
                assert torch.allclose(torch.tensor(got), torch.tensor(want), atol=1e-2), compressor


def test_trace_has_the_schedule_tasks_and_a_summary(trained):
    _, trace = trained
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    summary = trace["otherData"]
    assert summary["backend"] == "torch" and summary["world_size"] == 2
    # One warm-up iteration, and the one after it carries its tail (syncopate_sim::inputs::real_run).
    assert summary["measured_iterations"] == ITERATIONS - 2
    assert all(t > 0 for t in summary["iteration_times_ms"])
    parameters = {name for name, _ in models.tiny().named_parameters()}
    assert {n[4:] for n in names if n.startswith("bwd ")} == parameters
    assert {n[4:] for n in names if n.startswith("fwd ")} == parameters
    assert "optimizer" in names
    assert any(n.startswith("allreduce g0.0.0 ") for n in names), sorted(names)


def closed_and_released(rank, world, plan):
    import gc
    import weakref

    from syncopate.torch import DistributedOptimizer

    model = models.tiny()
    optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, plan, timeout_s=10)
    executor = weakref.ref(optimizer.executor)
    threads = list(optimizer.executor.threads)
    optimizer.close()
    del optimizer
    gc.collect()
    return executor() is None, [t.is_alive() for t in threads]


def test_a_closed_optimizer_ends_its_stream_threads_and_is_released(make_plan):
    # bytescheduler: several streams, rank 0 deciding for the other.
    plan = make_plan("bytescheduler", "none", None)
    for released, alive in ranks.values(ranks.run(closed_and_released, plan)):
        assert alive and not any(alive), alive
        assert released, "something still holds the closed optimizer's executor"


def test_a_trace_after_flush_measures_finished_iterations_only(make_plan, tmp_path):
    # DeAR's flush() runs the last iteration's updates, steps of an iteration that never finishes.
    trace = tmp_path / "dear.json"
    ranks.values(ranks.run(training.train, make_plan("dear", "none", None), iterations=4, trace=str(trace)))
    summary = json.loads(trace.read_text())["otherData"]
    assert summary["measured_iterations"] == 2
    assert all(t > 0 for t in summary["iteration_times_ms"])


def span_names(path):
    return {e["name"] for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"}


@pytest.mark.parametrize("scheme,compressor", [("hierarchical", "fp16"), ("compressed-ring", "onebit")])
def test_rings_run_the_steps_the_simulator_predicts(make_plan, profile_path, tmp_path, scheme, compressor):
    # The hierarchical allreduce on its node and cross-node groups, CaSync-Ring hop by hop: the
    # same tasks as the simulator's trace of the same plan.
    plan = edited(make_plan("horovod", compressor, None), scheme)
    measured, predicted = tmp_path / "measured.json", tmp_path / "predicted.json"
    ranks.values(ranks.run(training.train, plan, iterations=ITERATIONS, trace=str(measured)))
    conftest.cli("simulate", "--model", profile_path, "--cluster", "v100-10gbe", "--nodes", 1, "--gpus-per-node", 2,
                 "--plan", plan, "--iterations", ITERATIONS, "--trace", predicted, "--trace-ranks", 2)
    assert span_names(measured) == span_names(predicted)
