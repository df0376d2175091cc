"""gpu/check.sh on a machine without a GPU: every step fails fast, naming its cause.

The bundle is this build's CLI alone (no GPU test binary, no wheel), given with --bundle so that
nothing is rebuilt; each step then fails for its own reason within the deadline, and OUT holds
at most 8 flat files.
"""

import shutil
import subprocess
import sys
import time

import pytest

from conftest import REPO, syncopate_bin

STEPS = ("env", "gpu-tests", "nccl2", "torch", "capture:package", "capture:resnet50-fp32", "capture:compare",
         "profile", "ddp", "contention", "op-rates")


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has an NVIDIA driver")
def test_without_a_gpu_every_step_fails_fast_naming_its_cause(tmp_path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "syncopate").symlink_to(syncopate_bin())
    (bundle / "COMMIT").write_text("a test bundle\n")
    out = tmp_path / "out"
    start = time.monotonic()
    done = subprocess.run(["bash", str(REPO / "gpu" / "check.sh"), "--bundle", str(bundle), "--out", str(out),
                           "--deadline", "300"], capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "HOME": str(tmp_path)})
    took = time.monotonic() - start
    assert done.returncode == 1, done.stdout + done.stderr
    lines = (out / "check.log").read_text().splitlines()
    by_step = {line.split()[1].rstrip(":"): line for line in lines if line.split()[0] in ("PASS", "FAIL", "SKIP")}
    for step in STEPS:
        assert by_step[step].startswith("FAIL"), by_step.get(step, lines)
    assert "nvidia-smi" in by_step["env"]
    assert "exec-tests" in by_step["gpu-tests"]
    assert "libcuda not found" in by_step["profile"] and "libcuda not found" in by_step["nccl2"]
    for measure in ("ddp", "contention", "op-rates"):
        assert "SKIP: no CUDA device" in by_step[measure], by_step[measure]
    assert "no fp32 capture to compare" in by_step["capture:compare"]
    assert lines[-1].startswith(f"{len(by_step) - sum(l.startswith('PASS') for l in by_step.values())} step(s) failed")
    files = list(out.iterdir())
    assert len(files) <= 8 and all(f.is_file() for f in files), files
    assert took < 300, f"{took:.0f} s"
