"""README's "Training with a plan in PyTorch" example runs as written: profile, plan, 2 ranks under torchrun."""

import json
import re
import shlex
import subprocess
import sys

import conftest


def section():
    text = (conftest.REPO / "README.md").read_text()
    start = text.index("## Training with a plan in PyTorch")
    return text[start: text.index("\n## ", start + 3)]


def test_readme_example_trains_and_writes_a_checked_trace(tmp_path):
    blocks = re.findall(r"```(python|sh)\n(.*?)```", section(), re.S)
    scripts = [code for kind, code in blocks if kind == "python"]
    commands = [code for kind, code in blocks if kind == "sh"][-1]
    for code in scripts:
        name = re.match(r"# (\S+\.py):", code).group(1)
        (tmp_path / name).write_text(code)
    for line in commands.strip().splitlines():
        words = shlex.split(line)
        if words[0] == "python":
            words[0] = sys.executable
        elif words[0] == "syncopate":
            words[0] = str(conftest.syncopate_bin())
        elif words[0] == "torchrun":
            words[:1] = [sys.executable, "-m", "torch.distributed.run", "--master-port", str(conftest.free_port())]
        done = subprocess.run(words, cwd=tmp_path, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{line}: {done.stderr[-3000:]}"
    summary = json.loads((tmp_path / "measured.json").read_text())["otherData"]
    assert summary["strategy"] == "dear" and summary["world_size"] == 2
    assert summary["checks"] and all(c["ok"] for c in summary["checks"])
    # The trace of real training is compared with the plan's prediction on a CPU cluster file.
    lab = conftest.REPO / "experiments/lab-validation/clusters/lab-2n-1g.json"
    report = json.loads(conftest.cli("validate", "--plan", tmp_path / "plan.json", "--model", tmp_path / "mlp.json",
                                      "--measured", tmp_path / "measured.json", "--cluster", lab, "--format", "json").stdout)
    assert report["backend"] == "torch" and report["measured_iteration_ms"] == summary["iteration_time_ms"]
    assert any(row["task"].startswith("reduce-scatter") for row in report["largest_tasks"])
