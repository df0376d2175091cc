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
    """The tool run on `captured`, with the FLOP counts of `shipped`, or none where it is None."""
    named = [shipped] if shipped else []
    return subprocess.run([sys.executable, str(TOOL), str(captured), *named, "--from", kept_at, "--out", str(out)],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("model", ["resnet50", "bert-base", "gpt2"])
@pytest.mark.parametrize("mode", ["fp32", "amp"])
def test_the_shipped_profiles_are_the_kept_captures_adopted(tmp_path, model, mode):
    name = f"{model}-h200-{mode}"
    out = tmp_path / f"{name}.json"
    done = adopt(KEPT / f"{name}.json", model, out, f"gpu/results/h200-2026-11-29/{name}.json")
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == (REPO / "profiles" / "models" / f"{name}.json").read_bytes()


KEPT_DEAR = REPO / "gpu" / "results" / "h200-2026-12-01"


@pytest.mark.parametrize("name,shipped", [("resnet101-h200-fp32", "resnet101"), ("vgg16-h200-fp32", "vgg16"),
                                          ("bert-large-h200-fp32", "bert-large"),
                                          ("dear-resnet50-h200-fp32", None), ("dear-densenet201-h200-fp32", None),
                                          ("dear-inception-v4-h200-fp32", None), ("dear-bert-base-h200-fp32", None),
                                          ("dear-bert-large-h200-fp32", None)])
def test_the_captures_of_december_are_adopted_with_or_without_flop_counts(tmp_path, name, shipped):
    out = tmp_path / f"{name}.json"
    done = adopt(KEPT_DEAR / f"{name}.json", shipped, out, f"gpu/results/h200-2026-12-01/{name}.json")
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == (REPO / "profiles" / "models" / f"{name}.json").read_bytes()
    adopted = json.loads(out.read_text())
    # Without a shipped profile of the same model and batch there are no FLOP counts, so the
    # simulator carries it by the devices' compute_speed_vs_v100.
    assert ("arithmetic" in adopted) == bool(shipped)
    assert any("uses_per_sample" in t for t in adopted["tensors"]) == bool(shipped)


def test_without_flop_counts_only_an_fp32_capture_is_adopted(tmp_path):
    done = adopt(KEPT / "resnet50-h200-amp.json", None, tmp_path / "out.json")
    assert done.returncode == 1 and "resnet50-h200-amp was captured in fp16" in done.stderr, done.stderr
    assert not (tmp_path / "out.json").exists()


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
