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
from syncopate import DeviceRank, NonFiniteError, Rank, SyncopateError, lower
from syncopate.torch.device import device_of, first_non_finite, refusal
from syncopate.torch.schedule import Layout, exchange_of
from syncopate.torch.timing import Recorder

CUDA = torch.device("cuda")


def with_scheme(path, scheme):
    """The plan at `path` with every group synchronized by `scheme`."""
    if scheme is None:
        return path
    plan = json.loads(path.read_text())
    plan["groups"] = [dict(group, scheme=scheme) for group in plan["groups"]]
    edited = path.with_name(f"{path.stem}-{scheme}.json")
    edited.write_text(json.dumps(plan))
    return edited


def layout(plan):
    schedule, _ = lower(str(plan), 2, None)
    return Layout(json.loads(schedule), schedule)


@pytest.mark.parametrize("strategy, scheme", [("horovod", None), ("ddp", None), ("horovod", "hierarchical")])
def test_uncompressed_plans_summed_by_an_allreduce_run_on_a_device(make_plan, strategy, scheme):
    found = layout(with_scheme(make_plan(strategy, "none"), scheme))
    assert found.pieces and refusal(CUDA, found, 1) is None
    if scheme is not None:
        assert {exchange_of(p["rounds"][0])[0] for p in found.pieces} == {"hierarchical-allreduce"}


@pytest.mark.parametrize("plan", [("horovod", "fp16"), ("wfbp", "topk:0.01", "residual"), ("dear", "none"),
                                  ("dear", "fp16"), ("horovod", "powersgd:2", "residual"), ("wfbp", "dgc:0.01", "dgc:0.9:0")])
def test_plans_with_gpu_codecs_and_collective_exchanges_run_on_a_device(make_plan, plan):
    assert refusal(CUDA, layout(make_plan(*plan)), 1) is None


@pytest.mark.parametrize("plan, scheme, says", [(("byteps", "none", None, 2, 1), None, "PushPull"),
                                                (("horovod", "onebit"), "compressed-ring", "CompressedRing"),
                                                (("horovod", "fp16", None, 1, 2, ("--codec-calls", "tensor")), None,
                                                 "tensor by tensor")])
def test_plans_a_device_cannot_run_as_priced_are_refused_by_name(make_plan, plan, scheme, says):
    path = with_scheme(make_plan(*plan), scheme)
    why = refusal(CUDA, layout(path), 1)
    assert why is not None and says in why, why
    # The CPU runs them all.
    assert refusal(torch.device("cpu"), layout(path), 1) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_without_a_driver_the_device_codecs_name_what_is_missing(make_plan):
    schedule, _ = lower(str(make_plan("horovod", "fp16")), 2, None)
    with pytest.raises(SyncopateError, match=r"needs a GPU, none available: libcuda not found"):
        DeviceRank(schedule, 0, 0, 0, [])
    with pytest.raises(SyncopateError, match=r"device -1: not a CUDA ordinal"):
        DeviceRank(schedule, 0, 0, -1, [])


def test_several_communication_streams_are_refused_on_a_device(make_plan):
    found = layout(make_plan("horovod", "none"))
    assert "its 2 communication streams" in refusal(CUDA, found, 2)
    assert refusal(torch.device("cpu"), found, 2) is None
    # ByteScheduler's groups are allreduced uncompressed, each updated before its next forward:
    # the forward's pre-hook joins the links' streams before the update.
    assert refusal(CUDA, layout(make_plan("bytescheduler", "none")), 1) is None


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
@pytest.mark.parametrize("plan, scheme", [(("horovod", "none"), None), (("horovod", "fp16"), None),
                                          (("wfbp", "topk:0.01", "residual"), None), (("dear", "fp16"), None),
                                          (("horovod", "powersgd:2", "residual"), None),
                                          (("horovod", "fp16"), "hierarchical")])
def test_training_on_a_gpu_over_nccl_passes_the_check_and_writes_a_trace(make_plan, tmp_path, plan, scheme):
    """Every collective exchange the device runs, its codecs the project's CUDA kernels: the
    check compares the aggregated gradients with exec's reference aggregation; uncompressed,
    the parameters are the exact average's."""
    path = with_scheme(make_plan(*plan), scheme)
    trace = tmp_path / "measured.json"
    outcomes = ranks.values(ranks.run(training.train, path, iterations=3, check=2, trace=str(trace), backend="nccl",
                                      device="cuda"))
    assert all(group["ok"] for outcome in outcomes for group in outcome["checks"])
    assert outcomes[0]["checks"] and outcomes[0]["params"] == outcomes[1]["params"]
    if plan == ("horovod", "none"):
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


class CpuCodecsAsDevice:
    """`DeviceRank`'s interface over the CPU codecs (`Rank`) and CPU tensors: it drives
    syncopate.torch's device path (payloads encoded into the exchanges' buffers, next rounds in
    place, fixed-length all-gathers, results written by the state, finite checks at the
    iteration's end) where there is no GPU. The GPU kernels' bytes equal these codecs' (exec's
    GPU codec tests); what this checks is the Python side."""

    on_device = True

    def __init__(self, schedule_json, rank, seed, pieces):
        self.codecs = Rank(schedule_json, rank, seed)
        self.pieces = pieces
        self.failed = {}
        self.reduced = {}

    def __getattr__(self, name):
        # wire_dtype, set_epoch, schedule_json: the CPU state's.
        return getattr(self.codecs, name)

    def wire_bytes(self, piece):
        return max(r["bytes"] for r in self.pieces[piece]["rounds"])

    def compensate(self, piece, group_buffer, stream):
        self._deferred(piece, lambda: self.codecs.compensate(piece, group_buffer.numpy()))

    def encode(self, piece, out, stream):
        length = self.pieces[piece]["rounds"][0]["bytes"]
        if piece not in self.failed:
            length = self._deferred(piece, lambda: self.codecs.encode(piece)) or length
        if piece in self.failed:
            # The device sends what its kernels made of the bad input; zeros here.
            out[:length].zero_()
        else:
            self.codecs.copy_payload(piece, out[:length].numpy())
        self.reduced[piece] = length
        return length

    def _deferred(self, piece, body):
        """`body()`; a non-finite input is reported when checked, at the iteration's end, as
        the device reports it."""
        try:
            return body()
        except NonFiniteError as err:
            self.failed[piece] = err
            return None

    def next_round(self, piece, payload, stream):
        self.codecs.set_payload(piece, payload[: self.reduced[piece]].numpy())
        length = self.codecs.next_round(piece)
        self.codecs.copy_payload(piece, payload[:length].numpy())
        self.reduced[piece] = length
        return length

    def decode(self, piece, delivered, blocks, stream):
        if blocks > 1:
            self.codecs.set_gathered(piece, [block.numpy() for block in delivered.chunk(blocks)])
            self.codecs.decode(piece)
        else:
            self.codecs.decode(piece, delivered.numpy())

    def update_memory(self, piece, stream):
        self.codecs.update_memory(piece)

    def scale_output(self, piece, stream):
        self.codecs.scale_output(piece)

    def write_result(self, piece, group_buffer, scale, stream):
        self.codecs.write_result(piece, group_buffer.numpy(), scale)

    def copy_values(self, piece, out, result, stream):
        (self.codecs.copy_result if result else self.codecs.copy_compensated)(piece, out.numpy())

    def check_finite(self, piece, stream):
        error = self.failed.pop(piece, None)
        if error is not None:
            raise error


def on_the_device_path(function):
    """`function` with syncopate.torch's codec state replaced by CpuCodecsAsDevice."""
    from syncopate.torch import optimizer

    optimizer.codec_state = lambda device, layout, rank, seed: CpuCodecsAsDevice(
        layout.schedule_json, rank, seed, layout.pieces)
    return function


def train_on_the_device_path(rank, world, plan, **options):
    return on_the_device_path(training.train)(rank, world, plan, **options)


@pytest.mark.parametrize("plan, scheme", [(("horovod", "fp16"), None), (("wfbp", "topk:0.01", "residual"), None),
                                          (("dear", "fp16"), None), (("horovod", "powersgd:2", "residual"), None),
                                          (("wfbp", "dgc:0.01", "dgc:0.9:0"), None),
                                          (("horovod", "fp16", "residual"), "hierarchical")])
def test_the_device_path_trains_every_collective_exchange_and_passes_the_check(make_plan, plan, scheme):
    """Plans of every collective exchange the device runs (allreduce in fp16, top-k gathered,
    DeAR's reduce-scatter and all-gather, PowerSGD's two rounds, DGC, the hierarchical
    allreduce), with memory: the check compares every aggregated gradient with exec's reference
    aggregation, and every rank ends with the same parameters."""
    path = with_scheme(make_plan(*plan), scheme)
    outcomes = ranks.values(ranks.run(train_on_the_device_path, path, iterations=3, check=2))
    assert all(group["ok"] for outcome in outcomes for group in outcome["checks"])
    assert outcomes[0]["checks"]
    assert outcomes[0]["params"] == outcomes[1]["params"]


def nan_on_the_device_path(rank, world, plan):
    on_the_device_path(None)
    return nan_on_a_device(rank, world, plan)


def test_on_the_device_path_a_non_finite_input_is_named_at_step(make_plan):
    """Rank 1's NaN loss: its encode's input is not finite, which the device reports at the
    iteration's end, naming the tensor. (Rank 0 stops too when the sums it received are not
    finite; here rank 1's payload was sent zeroed, so it finishes.)"""
    errors = ranks.values(ranks.run(nan_on_the_device_path, make_plan("wfbp", "topk:0.01", "residual")))
    kind, message = errors[1]
    assert kind == "NonFiniteGradient" and message.startswith("gradient of ") and "(rank 1, iteration 1)" in message, message
