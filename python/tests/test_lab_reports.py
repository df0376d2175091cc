"""The lab experiments' reports: their committed tables and the statistics they report.

ddp-lab's and fsdp-lab's committed tables come back byte for byte from their committed runs and
predictions (`run.py --report-only`), and the rank correlation they share handles ties.
"""

import importlib.util
import shutil
import subprocess
import sys

import pytest

import conftest

EXPERIMENTS = conftest.REPO / "experiments"


def load_runner():
    sys.path.insert(0, str(EXPERIMENTS / "digits"))
    spec = importlib.util.spec_from_file_location("runner", EXPERIMENTS / "digits" / "runner.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("experiment", ["ddp-lab", "fsdp-lab"])
def test_report_only_rewrites_the_committed_tables(tmp_path, experiment):
    # A copy laid out as in the repository: run.py finds runner.py and svgplot.py two levels up.
    copy = tmp_path / "experiments"
    shutil.copytree(EXPERIMENTS / experiment, copy / experiment)
    (copy / "digits").mkdir()
    for helper in ("runner.py", "svgplot.py"):
        shutil.copy(EXPERIMENTS / "digits" / helper, copy / "digits")
    done = subprocess.run([sys.executable, copy / experiment / "run.py", "--report-only"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "median |error|" in done.stdout
    for name in ("README.md", "predicted-vs-measured.svg"):
        assert (copy / experiment / name).read_bytes() == (EXPERIMENTS / experiment / name).read_bytes(), name


def test_spearman_shares_ranks_between_ties():
    run = load_runner()
    assert run.ranks([3.0, 1.0, 3.0, 2.0]) == [3.5, 1.0, 3.5, 2.0]
    assert run.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert run.spearman([1, 2, 3, 4], [40, 30, 20, 10]) == -1.0
    assert run.spearman([1, 2, 3, 4], [5, 5, 5, 5]) is None
    assert abs(run.spearman([1, 2, 3, 4], [1, 3, 2, 4]) - 0.8) < 1e-12


def test_the_90th_percentile_interpolates_like_the_simulators():
    run = load_runner()
    assert run.p90([0.0, 10.0]) == 9.0
    assert run.p90([5.0]) == 5.0
    assert abs(run.p90(list(range(11))) - 9.0) < 1e-12
