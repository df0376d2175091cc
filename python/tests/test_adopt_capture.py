"""profiles/tools/adopt_capture.py: the shipped H200 profiles are what the tool makes of the kept
captures, byte for byte, and a capture of other tensors or another batch is refused by name."""

import json
import subprocess
import sys

import pytest

from conftest import REPO

TOOL = REPO / "profiles" / "tools" / "adopt_capture.py"
KEPT = REPO / "gpu" / "results" / "h200-2026-11-29"


def adopt(captured, shipped, out, kept_at="kept.json"):
    return subprocess.run([sys.executable, str(TOOL), str(captured), shipped, "--from", kept_at, "--out", str(out)],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("model", ["resnet50", "bert-base", "gpt2"])
@pytest.mark.parametrize("mode", ["fp32", "amp"])
def test_the_shipped_profiles_are_the_kept_captures_adopted(tmp_path, model, mode):
    name = f"{model}-h200-{mode}"
    out = tmp_path / f"{name}.json"
    done = adopt(KEPT / f"{name}.json", model, out, f"gpu/results/h200-2026-11-29/{name}.json")
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == (REPO / "profiles" / "models" / f"{name}.json").read_bytes()


def test_a_capture_of_other_tensors_or_another_batch_is_refused(tmp_path):
    capture = json.loads((KEPT / "resnet50-h200-fp32.json").read_text())
    capture["tensors"].pop()
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps(capture))
    done = adopt(odd, "resnet50", tmp_path / "out.json")
    assert done.returncode == 1 and "do not hold the same tensors" in done.stderr, done.stderr

    capture = json.loads((KEPT / "resnet50-h200-fp32.json").read_text())
    capture["batch_size_per_gpu"] = 64
    odd.write_text(json.dumps(capture))
    done = adopt(odd, "resnet50", tmp_path / "out.json")
    assert done.returncode == 1 and "has batch 64, resnet50 32" in done.stderr, done.stderr
    assert not (tmp_path / "out.json").exists()
