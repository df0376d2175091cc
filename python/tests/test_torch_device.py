"""syncopate.torch on a CUDA device: which plans run there, the device checks, the trace's marks,
and (with a GPU) training over NCCL with the check.

What needs no GPU runs here: the plans a device refuses, by name; parameters on an unsupported
device or on two devices; the recorder's spans. The training test needs a CUDA device and skips,
saying so, without one: two processes share GPU 0 as two NCCL hosts (NCCL_HOSTID).
"""

import json

import pytest
import torch

import models
import ranks
import training
from syncopate import SyncopateError, lower
from syncopate.torch.device import device_of, first_non_finite, refusal
from syncopate.torch.schedule import Layout, exchange_of
from syncopate.torch.timing import Recorder

CUDA = torch.device("cuda")


def layout(plan):
    schedule, _ = lower(str(plan), 2, None)
    return Layout(json.loads(schedule), schedule)


@pytest.mark.parametrize("strategy, scheme", [("horovod", None), ("ddp", None), ("horovod", "hierarchical")])
def test_uncompressed_plans_summed_by_an_allreduce_run_on_a_device(make_plan, strategy, scheme):
    path = make_plan(strategy, "none")
    if scheme is not None:
        plan = json.loads(path.read_text())
        plan["groups"] = [dict(group, scheme=scheme) for group in plan["groups"]]
        path = path.with_name(f"{path.stem}-{scheme}.json")
        path.write_text(json.dumps(plan))
    found = layout(path)
    assert found.pieces and refusal(CUDA, found, 1) is None
    if scheme is not None:
        assert {exchange_of(p["rounds"][0])[0] for p in found.pieces} == {"hierarchical-allreduce"}


@pytest.mark.parametrize("plan, says", [(("horovod", "fp16"), "compressor fp16"),
                                        (("wfbp", "topk:0.01", "residual"), "compressor topk:0.01, memory residual"),
                                        (("dear", "none"), "exchange reduce-scatter"),
                                        (("byteps", "none", None, 2, 1), "exchange push-pull")])
def test_plans_with_codecs_or_other_exchanges_are_refused_on_a_device_by_name(make_plan, plan, says):
    path = make_plan(*plan)
    why = refusal(CUDA, layout(path), 1)
    assert why is not None and says in why and "group 0" in why and "exec --backend cuda" in why, why
    # The CPU runs them all.
    assert refusal(torch.device("cpu"), layout(path), 1) is None


def test_several_communication_streams_or_updates_before_the_next_forward_are_refused_on_a_device(make_plan):
    found = layout(make_plan("horovod", "none"))
    assert "its 2 communication streams" in refusal(CUDA, found, 2)
    assert refusal(torch.device("cpu"), found, 2) is None
    # ByteScheduler's groups are allreduced uncompressed, each updated before its next forward.
    overlapping = layout(make_plan("bytescheduler", "none"))
    assert "updates each group before its next forward" in refusal(CUDA, overlapping, 1)
    assert refusal(torch.device("cpu"), overlapping, 1) is None


def test_parameters_on_two_devices_or_an_unsupported_one_are_refused_by_name():
    model = models.tiny()
    params = list(model.parameters())
    names = [n for n, _ in model.named_parameters()]
    assert device_of(params, names) == torch.device("cpu")
    meta = [torch.nn.Parameter(torch.empty(3, device="meta"))]
    with pytest.raises(SyncopateError, match=r"w is on meta: the CPU or a CUDA device only"):
        device_of(meta, ["w"])
    with pytest.raises(SyncopateError, match=r"parameter x is on meta, 1.weight on cpu: every parameter"):
        device_of(params[:1] + meta, ["1.weight", "x"])


def test_the_recorder_splits_a_span_into_equal_shares_and_keeps_the_rest():
    recorder = Recorder(0)
    recorder.span(5, 0, 0, 100, 400, part=1, parts=3)
    recorder.span(6, 0, 1, 400, 450)
    assert recorder.spans() == [(0, 5, 0, 0, 200, 300), (0, 6, 0, 1, 400, 450)]
    assert recorder.earlier(300, 200) == 200 and recorder.origin() == 0


class FakeEvent:
    """A CUDA event's reading interface: done or not, ms since another event."""

    def __init__(self, ms, done=True):
        self.ms, self.done = ms, done

    def query(self):
        return self.done

    def elapsed_time(self, other):
        return other.ms - self.ms


def test_the_recorder_reads_and_lets_go_of_the_events_that_completed():
    recorder = Recorder(0)
    recorder.cuda, recorder.epoch_event = True, FakeEvent(0.0)
    pending = FakeEvent(0.004, done=False)
    recorder.span(1, 0, 0, recorder.origin(), FakeEvent(0.001))
    recorder.span(2, 0, 1, FakeEvent(0.001), pending)
    recorder.span(3, 0, 0, FakeEvent(0.002), FakeEvent(0.003))
    recorder.settle()
    # The first and the third are read (ns since the epoch); the second waits for its end.
    assert recorder.records[0][4:6] == (0, 1000) and recorder.records[2][4:6] == (2000, 3000)
    assert recorder.records[1][5] is pending and recorder.settled == 1
    pending.done = True
    recorder.settle()
    assert recorder.settled == 3 and all(isinstance(r[5], int) for r in recorder.records)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (and NCCL)")
def test_training_on_a_gpu_over_nccl_passes_the_check_and_writes_a_trace(make_plan, tmp_path):
    plan = make_plan("horovod", "none")
    trace = tmp_path / "measured.json"
    outcomes = ranks.values(ranks.run(training.train, plan, iterations=3, check=2, trace=str(trace), backend="nccl",
                                      device="cuda"))
    assert all(group["ok"] for outcome in outcomes for group in outcome["checks"])
    assert outcomes[0]["params"] == outcomes[1]["params"]
    for mine, exact in zip(outcomes[0]["params"], training.reference(2)):
        assert mine == pytest.approx(exact, rel=1e-4, abs=1e-5)
    events = json.loads(trace.read_text())["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    assert spans and all(e["dur"] >= 0 for e in spans)


def test_the_first_non_finite_element_is_found_in_the_spans_sent():
    buffers = [torch.zeros(6), torch.zeros(8)]
    buffers[1][5] = float("nan")
    buffers[0][1] = float("inf")
    # Only the spans sent are searched, in the order they were sent.
    assert first_non_finite(buffers, [(1, slice(0, 4)), (1, slice(4, 8)), (0, slice(0, 6))]) == (1, 5)
    assert first_non_finite(buffers, [(1, slice(0, 4))]) is None


def nan_on_a_device(rank, world, plan):
    """Trains with the codecs' device path on the CPU's tensors (what a CUDA device runs), rank 1's
    loss NaN in iteration 1; returns the error each rank's step raised."""
    import torch.nn.functional as F

    from syncopate.torch import DistributedOptimizer, codecs

    built = codecs.Codecs.__init__

    def on_device(self, *args, **kwargs):
        built(self, *args, **kwargs)
        self.on_device = True

    codecs.Codecs.__init__ = on_device
    torch.manual_seed(0)
    model = models.tiny()
    optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, plan, timeout_s=20)
    for k in range(2):
        optimizer.zero_grad()
        x, y = models.batch(rank, k)
        loss = F.cross_entropy(model(x), y) * (float("nan") if rank == 1 and k == 1 else 1.0)
        loss.backward()
        try:
            optimizer.step()
        except Exception as error:
            return type(error).__name__, str(error)
    return None


def test_on_a_device_a_non_finite_gradient_stops_every_rank_at_step(make_plan):
    errors = ranks.values(ranks.run(nan_on_a_device, make_plan("horovod", "none")))
    for rank, (kind, message) in enumerate(errors):
        assert kind == "NonFiniteGradient", (rank, kind, message)
        assert message.startswith("averaged gradient of ") and f"(rank {rank}, iteration 1)" in message, message
