"""docs/guide/training.md's example (it was README's "Training with a plan in PyTorch") trains as
written: profile, plan, 2 ranks under torchrun; its trace is checked and compared with the plan.
test_docs.run_page runs the page once per session, for this test and test_docs alike."""

import json

import conftest
import test_docs

PAGE = "docs/guide/training.md"


def test_training_page_example_trains_and_writes_a_checked_trace():
    work = test_docs.run_page(PAGE)
    summary = json.loads((work / "measured.json").read_text())["otherData"]
    assert summary["strategy"] == "dear" and summary["world_size"] == 2
    assert summary["checks"] and all(c["ok"] for c in summary["checks"])
    # The trace of real training is compared with the plan's prediction on a CPU cluster file.
    lab = conftest.REPO / "experiments/lab-validation/clusters/lab-2n-1g.json"
    report = json.loads(conftest.cli("validate", "--plan", work / "plan.json", "--model", work / "mlp.json",
                                      "--measured", work / "measured.json", "--cluster", lab, "--format", "json").stdout)
    assert report["backend"] == "torch" and report["measured_iteration_ms"] == summary["iteration_time_ms"]
    assert any(row["task"].startswith("reduce-scatter") for row in report["largest_tasks"])
