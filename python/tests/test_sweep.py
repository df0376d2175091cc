"""`python -m syncopate.torch.sweep`: every op and size timed on 2 gloo ranks.

The result is written as the CSV `collective --compare` reads; bad flags and a missing launcher end
in one-line errors.
"""

import csv
import os
import subprocess
import sys

import pytest

import ranks
from syncopate import SyncopateError
from syncopate.torch import sweep


def timed(rank, world, sizes, gathers="wrapper"):
    from syncopate.torch.link import Link

    try:
        return sweep.sweep(Link(rank, world, 30), sweep.OPS, sizes, iterations=2, rounds=2, gathers=gathers)
    finally:
        sweep.release_servers()


def sizes_of(collectives, push_pull):
    """Each op's sizes: the collectives' and the push-pull's."""
    collectives = sweep.parse_sizes("--sizes", collectives)
    push_pull = sweep.parse_sizes("--push-pull-sizes", push_pull)
    return {"allreduce": collectives, "allgather": collectives, "reduce-scatter": collectives, "push-pull": push_pull,
            "push-pull-all": push_pull, "allreduce-fp16": collectives}


@pytest.mark.parametrize("gathers", sweep.GATHERS)
def test_every_op_and_size_is_timed_alike_on_every_rank(tmp_path, gathers):
    outcomes = ranks.values(ranks.run(timed, sizes_of("4K,64K", "16K"), gathers))
    # Every rank reports the slowest rank's time: the same rows everywhere.
    assert outcomes[0] == outcomes[1]
    assert [(op, world, size) for op, world, size, _ in outcomes[0]] == [
        (op, 2, size) for op in ("allreduce", "allgather", "reduce-scatter") for size in (4096, 65536)] + [
        ("push-pull", 2, 16384), ("push-pull-all", 2, 16384), ("allreduce-fp16", 2, 4096), ("allreduce-fp16", 2, 65536)]
    assert all(t > 0 for *_, t in outcomes[0])
    path = tmp_path / "sweep.csv"
    sweep.write_csv(path, outcomes[0])
    rows = list(csv.DictReader(path.open()))
    assert list(rows[0]) == ["op", "gpus", "size_bytes", "time_us"]
    assert [r["op"] for r in rows] == ["allreduce", "allreduce", "allgather", "allgather", "reduce-scatter",
                                       "reduce-scatter", "push-pull", "push-pull-all", "allreduce-fp16", "allreduce-fp16"]


def called(rank, world, op, gathers):
    """What one sweep call of `op` leaves in its output, with the collective spied on."""
    import torch.distributed as dist

    from syncopate.torch.link import Link

    seen = []
    spied = ("all_gather_into_tensor", "all_gather", "reduce_scatter_tensor", "all_reduce")
    for name in spied:
        real = getattr(dist, name)
        setattr(sweep.dist, name, lambda *a, _real=real, _name=name, **k: (seen.append((_name, k.get("op"), a[0])),
                                                                          _real(*a, **k))[1])
    try:
        sweep.calls(op, Link(rank, world, 30), 64, gathers)()
    finally:
        for name in spied:
            setattr(sweep.dist, name, getattr(dist, name))
    # An allreduce's buffer by its type and elements; the others by their reduce op.
    return [(name, f"{first.dtype} {first.numel()}" if name == "all_reduce" else str(op)) for name, op, first in seen]


@pytest.mark.parametrize("op,gathers,expected", [
    ("allgather", "tensor", [("all_gather_into_tensor", "None")]),
    ("allgather", "wrapper", [("all_gather", "None"), ("all_gather", "None")]),
    ("reduce-scatter", "wrapper", [("reduce_scatter_tensor", "RedOpType.AVG")]),
    # 64 bytes: 16 floats, or 32 half floats as DDP's fp16 hook allreduces them.
    ("allreduce", "wrapper", [("all_reduce", "torch.float32 16")]),
    ("allreduce-fp16", "wrapper", [("all_reduce", "torch.float16 32")])])
def test_each_call_runs_the_collective_and_type_it_names(op, gathers, expected):
    outcomes = ranks.values(ranks.run(called, op, gathers))
    assert outcomes[0] == outcomes[1] == expected


def pulled(rank, world):
    import torch

    from syncopate.torch.exchange import PushPullMessages
    from syncopate.torch.link import Link

    link = Link(rank, world, 30)
    payload = torch.full((5 + rank,), rank + 1, dtype=torch.uint8)
    served = []

    def serve(pushed):
        served.extend(p.tolist() for p in pushed)
        return torch.arange(3, dtype=torch.uint8)

    return PushPullMessages(link, payload, 1, "test").finish(serve).tolist(), served


def test_a_push_pull_brings_every_payload_to_the_server_and_its_answer_to_every_worker():
    outcomes = ranks.values(ranks.run(pulled))
    assert outcomes[0] == ([0, 1, 2], [])
    assert outcomes[1] == ([0, 1, 2], [[1] * 5, [2] * 6])


def timed_beside_compute(rank, world, sizes):
    import threading

    from syncopate.torch.link import Link

    with sweep.Computing() as computing:
        try:
            rows = sweep.sweep(Link(rank, world, 30), ("allreduce", "push-pull"), sizes, iterations=2, rounds=2,
                               computing=computing)
        finally:
            sweep.release_servers()
        alive = computing.thread.is_alive()
    names = {t.name for t in threading.enumerate()}
    return rows, alive, "syncopate-sweep-compute" in names


def test_beside_compute_every_rank_computes_while_it_is_timed_and_stops_after():
    outcomes = ranks.values(ranks.run(timed_beside_compute, sizes_of("64K", "4K")))
    for rows, alive, left_running in outcomes:
        assert [(op, size) for op, _, size, _, _ in rows] == [("allreduce", 65536), ("push-pull", 4096)]
        # Every row says how much its calls slowed the compute: a positive ratio, the same on
        # every rank (their mean).
        assert all(slowdown > 0 for *_, slowdown in rows)
        assert alive and not left_running
    assert outcomes[0][0] == outcomes[1][0]


def test_a_sweep_beside_compute_writes_the_compute_slowdown_of_every_row(tmp_path):
    path = tmp_path / "busy.csv"
    sweep.write_csv(path, [("allreduce", 2, 1024, 12.34, 1.25)])
    assert path.read_text().splitlines() == ["op,gpus,size_bytes,time_us,compute_slowdown",
                                             "allreduce,2,1024,12.3,1.250"]


def fp16_values_after_a_round(rank, world, iterations):
    """The fp16 allreduce's buffer values after a warm-up, a reset and a round of `iterations`."""
    import torch.distributed as dist

    from syncopate.torch.link import Link

    buffers, real = [], dist.all_reduce
    sweep.dist.all_reduce = lambda tensor, *a, **k: (buffers.append(tensor), real(tensor, *a, **k))[1]
    try:
        call = sweep.calls("allreduce-fp16", Link(rank, world, 30), 64)
        call()
        call.reset()
        for _ in range(iterations):
            call()
    finally:
        sweep.dist.all_reduce = real
    return sorted({float(v) for v in buffers[-1]})


def test_fp16_rounds_sum_normal_numbers_and_a_round_that_would_overflow_is_refused(tmp_path):
    # Two ranks, 10 calls: from 2^-14 to 2^-4, far from float16's largest (65504) and its
    # infinities, whose software conversions take a shorter path.
    outcomes = ranks.values(ranks.run(fp16_values_after_a_round, 10))
    assert outcomes[0] == outcomes[1] == [2.0 ** -4]
    assert sweep.fp16_rounds_fit(4, 10) and not sweep.fp16_rounds_fit(16, 10)
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "16", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    done = subprocess.run([sys.executable, "-m", "syncopate.torch.sweep", "--out", str(tmp_path / "s.csv"), "--ops",
                           "allreduce-fp16"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "--iterations: 10 fp16 allreduces over 16 ranks overflow" in done.stderr


@pytest.mark.parametrize("text, message", [
    ("4K,huge", "'HUGE' is not a size"),
    ("0", "positive multiple of 4"),
    ("6", "positive multiple of 4"),
    ("1G", "up to 256M"),
])
def test_bad_sizes_are_named(text, message):
    with pytest.raises(SyncopateError, match=message):
        sweep.parse_sizes("--sizes", text)


def test_without_a_launcher_the_error_says_what_is_missing(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    run = subprocess.run([sys.executable, "-m", "syncopate.torch.sweep", "--out", str(tmp_path / "x.csv")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 1
    assert "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set" in run.stderr
    run = subprocess.run([sys.executable, "-m", "syncopate.torch.sweep", "--out", "x.csv", "--ops", "broadcast"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 1 and "--ops: unknown collective 'broadcast'" in run.stderr
