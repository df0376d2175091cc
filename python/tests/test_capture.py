"""`python -m syncopate.capture` records a user's module (--module) as a profile the CLI accepts.

It records the module with its batch and thread counts, and rejects bad input with one line and exit
1, 2 or 3.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

import conftest

TESTS = pathlib.Path(__file__).resolve().parent


def capture(tmp_path, *args, blocked=()):
    """Runs `python -m syncopate.capture ARGS` from `tmp_path` with this directory's `models`
    importable; the packages in `blocked` fail to import, as when they are not installed."""
    command = ["-m", "syncopate.capture"]
    if blocked:
        command = ["-c", "import runpy, sys\n"
                         f"for name in {list(blocked)!r}: sys.modules[name] = None\n"
                         "runpy.run_module('syncopate.capture', run_name='__main__', alter_sys=True)\n"]
    paths = [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    return subprocess.run([sys.executable, *command, *map(str, args)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_module_capture_records_batch_and_threads_and_the_cli_accepts_it(tmp_path):
    out = tmp_path / "tiny.json"
    done = capture(tmp_path, "--module", "models:factory", "--batch-size", 8, "--threads", 1, "--warmup", 1,
                   "--iterations", 3, "--device", "cpu", "--device-name", "host-2core", "--out", out)
    assert done.returncode == 0, done.stderr
    profile = json.loads(out.read_text())
    assert profile["name"] == "factory" and profile["device"] == "host-2core"
    assert profile["batch_size_per_gpu"] == 8
    assert "--batch-size 8" in profile["timing"]["batch"]["method"]
    assert profile["threads"]["intra_op"] == 1 and profile["threads"]["inter_op"] >= 1
    assert profile["source"].startswith("recorded by python -m syncopate.capture --module models:factory")
    assert [t["name"] for t in profile["tensors"]][0].startswith("8.")  # the last layer's gradient first
    checked = conftest.cli("list", "models", "--check", out)
    assert "factory" in checked.stdout and "host-2core" in checked.stdout
    simulated = conftest.cli("simulate", "--model", out, "--cluster", "v100-10gbe", "--nodes", 1,
                             "--gpus-per-node", 2, "--strategy", "horovod", "--format", "json")
    assert json.loads(simulated.stdout)["iteration_time_ms"] > 0


def test_the_optimizer_and_autocast_are_the_ones_asked_for(tmp_path):
    out = tmp_path / "adam.json"
    done = capture(tmp_path, "--module", "models:factory", "--batch-size", 4, "--optimizer", "adam", "--amp",
                   "--warmup", 0, "--iterations", 1, "--device", "cpu", "--device-name", "host-2core",
                   "--name", "tiny-adam", "--out", out)
    assert done.returncode == 0, done.stderr
    profile = json.loads(out.read_text())
    assert profile["name"] == "tiny-adam" and profile["batch_size_per_gpu"] == 4
    assert profile["timing"]["optimizer"]["method"].startswith("Adam step")
    assert "autocast bf16" in profile["timing"]["backward"]["method"]


@pytest.mark.parametrize("args, blocked, code, message", [
    (["--module", "models:factory", "--batch-size", 0], (), 2, "argument --batch-size: must be 1 to"),
    (["--module", "models:factory", "--batch-size", "nan"], (), 2, "argument --batch-size: not an integer"),
    (["--module", "models:factory", "--batch-size", 8, "--iterations", 0], (), 2, "argument --iterations"),
    (["--module", "models", "--batch-size", 8], (), 2, "is not PACKAGE.MODULE:FACTORY"),
    (["--module", "models:factory", "--batch-size", 8, "--tf32", "maybe"], (), 2, "argument --tf32: invalid choice"),
    (["--module", "models:factory", "--batch-size", 8, "--device", "cpu"], (), 2, "--device-name is required"),
    (["--module", "models:factory", "--batch-size", 8, "--device", "tpu"], (), 2, "argument --device: 'tpu'"),
    (["--module", "no_such_package.models:factory", "--batch-size", 8], (), 1,
     "cannot import no_such_package.models"),
    (["--module", "models:no_such_factory", "--batch-size", 8], (), 1, "models has no attribute `no_such_factory`"),
    (["--module", "models:failing_factory", "--batch-size", 8], (), 1,
     "failing_factory(batch_size=8, device='cpu') raised RuntimeError: no model for batch 8"),
    (["--module", "models:module_only", "--batch-size", 8], (), 1, "it must return (module, loss_fn)"),
    (["--torchvision", "resnet50", "--batch-size", 8], ("torchvision",), 1,
     "--torchvision needs the `torchvision` package, which is not installed: pip install torchvision"),
    (["--hf", "bert", "--batch-size", 8], ("transformers",), 1,
     "--hf needs the `transformers` package, which is not installed: pip install transformers"),
    (["--module", "models:factory", "--batch-size", 8, "--out", "missing/x.json"], (), 1,
     "the directory"),
])
def test_bad_input_is_one_line_naming_it_and_an_exit_code(tmp_path, args, blocked, code, message):
    if "--device" not in args:
        args = [*args, "--device", "cpu", "--device-name", "host-2core"]
    if "--out" not in args:
        args = [*args, "--out", tmp_path / "x.json"]
    done = capture(tmp_path, *args, blocked=blocked)
    assert done.returncode == code, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "x.json").exists()


def test_a_gpu_capture_without_a_gpu_exits_3(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    done = capture(tmp_path, "--module", "models:factory", "--batch-size", 8, "--device", "cuda",
                   "--device-name", "h100-sxm5-80gb", "--out", tmp_path / "x.json")
    assert done.returncode == 3 and "needs a GPU" in done.stderr and "Traceback" not in done.stderr
