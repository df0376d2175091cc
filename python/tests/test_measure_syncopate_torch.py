"""profiles/tools/measure_syncopate_torch.py: the wrapper's own costs are measured from a real run.

A short run (2 gloo ranks, a model of 16 small parameters, 2 iterations) reports every hook and
every collective it timed, each cost positive, and the spread around its median.
"""

import json
import os
import subprocess
import sys

import conftest

TOOL = conftest.REPO / "profiles" / "tools" / "measure_syncopate_torch.py"


def test_a_short_run_reports_positive_costs_per_hook_and_per_call():
    env = dict(os.environ, SYNCOPATE_BIN=str(conftest.syncopate_bin()), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(TOOL), "--tensors", "16", "--iterations", "2", "--repeats", "1"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    # 16 hooks and at least one collective an iteration, on the 2 measured iterations.
    assert summary["hooks_per_repeat"] == 32 and summary["calls_per_repeat"] >= 2
    for key in ("hook_us", "call_us", "op_us", "decision_us"):
        spread = summary[key]
        assert 0 < spread["min"] <= spread["median"] <= spread["max"], (key, spread)


def test_bad_counts_are_refused():
    done = subprocess.run([sys.executable, str(TOOL), "--repeats", "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "at least 1" in done.stderr
