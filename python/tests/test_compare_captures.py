"""gpu/compare_captures.py: captured profiles beside the simulator's prediction for their GPU.

The H200 captures shipped in profiles/models are set beside the V100 profiles carried to the
H200 (never beside themselves); a capture that matches no shipped model, or was made with TF32
on, fails naming it; an autocast capture is left out, not failed.
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


def test_shipped_h200_captures_are_set_beside_the_v100_profiles_carried():
    done = compare("dgx-h200", MODELS / "resnet50-h200-fp32.json", MODELS / "bert-base-h200-fp32.json")
    assert done.returncode == 0, done.stderr
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in done.stdout.splitlines()
            if line.startswith("| resnet50-h200-fp32 ") or line.startswith("| bert-base-h200-fp32 ")}
    assert rows["resnet50-h200-fp32"][1] == "resnet50" and rows["bert-base-h200-fp32"][1] == "bert-base", done.stdout
    # The measured column is the capture's own forward, backward and optimizer time.
    for name, row in rows.items():
        profile = json.loads((MODELS / f"{name}.json").read_text())
        total = sum(t["forward_us"] + t["backward_us"] for t in profile["tensors"]) + profile["optimizer_us"]
        assert abs(float(row[2]) - total / 1e3) < 0.01, (name, row, total)
    assert "Median |error|" in done.stdout and "over 2 models." in done.stdout


def test_a_profile_is_never_its_own_prediction():
    # The V100 profile is set beside the H200 capture carried back to the V100; a model measured
    # on one GPU only has nothing to be compared with.
    done = compare("dgx1-v100", MODELS / "resnet50.json")
    assert done.returncode == 0, done.stderr
    assert "| resnet50 | resnet50-h200-fp32 |" in done.stdout, done.stdout
    done = compare("dgx1-v100", MODELS / "resnet152.json")
    assert done.returncode == 1
    assert "no shipped fp32 profile measured on another GPU has its 467 tensors at batch 32" in done.stderr


def test_a_capture_of_no_shipped_model_fails_and_autocast_is_left_out(tmp_path):
    profile = json.loads((MODELS / "resnet50.json").read_text())
    profile["tensors"].pop()
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps(profile))
    done = compare("dgx1-v100", odd)
    assert done.returncode == 1
    assert (f"{odd}: not compared: no shipped fp32 profile measured on another GPU has its 160 tensors at batch 32"
            in done.stderr)

    profile = json.loads((MODELS / "resnet50.json").read_text())
    profile["timing"]["backward"]["method"] += ", autocast fp16"
    amp = tmp_path / "amp.json"
    amp.write_text(json.dumps(profile))
    done = compare("dgx-h200", amp, MODELS / "resnet50-h200-fp32.json")
    assert done.returncode == 0, done.stderr
    assert "an autocast capture" in done.stderr
    assert "over 1 models." in done.stdout


def test_a_capture_with_tf32_on_is_not_compared(tmp_path):
    profile = json.loads((MODELS / "resnet50.json").read_text())
    profile["description"] += "; TF32 for fp32 matrix products off, for convolutions on"
    tf32 = tmp_path / "tf32.json"
    tf32.write_text(json.dumps(profile))
    done = compare("dgx1-v100", tf32)
    assert done.returncode == 1
    assert f"{tf32}: not compared: TF32 was on (capture with --tf32 off)" in done.stderr
