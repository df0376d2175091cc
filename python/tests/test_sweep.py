"""`python -m syncopate.torch.sweep`: every op and size timed on 2 gloo ranks and written as the CSV `collective --compare` reads; bad flags and a missing launcher end in one-line errors."""

import csv
import os
import subprocess
import sys

import pytest

import ranks
from syncopate import SyncopateError
from syncopate.torch import sweep


def timed(rank, world, sizes):
    from syncopate.torch.link import Link

    return sweep.sweep(Link(rank, world, 30), sweep.OPS, sizes, iterations=2, rounds=2)


def test_every_op_and_size_is_timed_alike_on_every_rank(tmp_path):
    sizes = sweep.parse_sizes("4K,64K")
    outcomes = ranks.values(ranks.run(timed, sizes))
    # Every rank reports the slowest rank's time: the same rows everywhere.
    assert outcomes[0] == outcomes[1]
    assert [(op, world, size) for op, world, size, _ in outcomes[0]] == [
        (op, 2, size) for op in ("allreduce", "allgather") for size in (4096, 65536)]
    assert all(t > 0 for *_, t in outcomes[0])
    path = tmp_path / "sweep.csv"
    sweep.write_csv(path, outcomes[0])
    rows = list(csv.DictReader(path.open()))
    assert list(rows[0]) == ["op", "gpus", "size_bytes", "time_us"]
    assert [r["op"] for r in rows] == ["allreduce", "allreduce", "allgather", "allgather"]


def timed_beside_compute(rank, world, sizes):
    import threading

    with sweep.Computing() as computing:
        rows = timed(rank, world, sizes)
        alive = computing.thread.is_alive()
    names = {t.name for t in threading.enumerate()}
    return rows, alive, "syncopate-sweep-compute" in names


def test_beside_compute_every_rank_computes_while_it_is_timed_and_stops_after():
    outcomes = ranks.values(ranks.run(timed_beside_compute, sweep.parse_sizes("64K")))
    for rows, alive, left_running in outcomes:
        assert [(op, size) for op, _, size, _ in rows] == [("allreduce", 65536), ("allgather", 65536)]
        assert alive and not left_running


@pytest.mark.parametrize("text, message", [
    ("4K,huge", "'HUGE' is not a size"),
    ("0", "positive multiple of 4"),
    ("6", "positive multiple of 4"),
    ("1G", "up to 256M"),
])
def test_bad_sizes_are_named(text, message):
    with pytest.raises(SyncopateError, match=message):
        sweep.parse_sizes(text)


def test_without_a_launcher_the_error_says_what_is_missing(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    run = subprocess.run([sys.executable, "-m", "syncopate.torch.sweep", "--out", str(tmp_path / "x.csv")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 1
    assert "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set" in run.stderr
    run = subprocess.run([sys.executable, "-m", "syncopate.torch.sweep", "--out", "x.csv", "--ops", "broadcast"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 1 and "--ops: unknown collective 'broadcast'" in run.stderr
