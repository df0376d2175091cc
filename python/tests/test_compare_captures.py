"""gpu/compare_captures.py: captured profiles beside the simulator's prediction for their GPU.

A shipped profile compared on its own GPU's cluster is its own prediction (0 % error); a capture
that matches no shipped model, or was made with TF32 on, fails naming it; an autocast capture is
left out, not failed.
"""

import json
import subprocess
import sys

from conftest import REPO, syncopate_bin

SCRIPT = REPO / "gpu" / "compare_captures.py"
MODELS = REPO / "profiles" / "models"


def compare(*args):
    return subprocess.run([sys.executable, str(SCRIPT), str(syncopate_bin()), *map(str, args)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)


def test_a_profile_on_its_own_gpu_is_its_own_prediction():
    done = compare("dgx1-v100", MODELS / "resnet50.json", MODELS / "bert-base.json")
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| resnet50 ") or line.startswith("| bert-base ")]
    assert len(rows) == 2 and all(row.endswith("| +0.0 % |") for row in rows), done.stdout
    assert "Median |error| 0.0 % over 2 models." in done.stdout


def test_a_capture_of_no_shipped_model_fails_and_autocast_is_left_out(tmp_path):
    profile = json.loads((MODELS / "resnet50.json").read_text())
    profile["tensors"].pop()
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps(profile))
    done = compare("dgx1-v100", odd)
    assert done.returncode == 1
    assert f"{odd}: not compared: no shipped profile has its 160 tensors at batch 32" in done.stderr

    profile = json.loads((MODELS / "resnet50.json").read_text())
    profile["timing"]["backward"]["method"] += ", autocast fp16"
    amp = tmp_path / "amp.json"
    amp.write_text(json.dumps(profile))
    done = compare("dgx1-v100", amp, MODELS / "resnet50.json")
    assert done.returncode == 0, done.stderr
    assert "an autocast capture" in done.stderr
    assert "Median |error| 0.0 % over 1 models." in done.stdout


def test_a_capture_with_tf32_on_is_not_compared(tmp_path):
    profile = json.loads((MODELS / "resnet50.json").read_text())
    profile["description"] += "; TF32 for fp32 matrix products off, for convolutions on"
    tf32 = tmp_path / "tf32.json"
    tf32.write_text(json.dumps(profile))
    done = compare("dgx1-v100", tf32)
    assert done.returncode == 1
    assert f"{tf32}: not compared: TF32 was on (capture with --tf32 off)" in done.stderr
