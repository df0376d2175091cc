"""Shared pieces of the Python tests: a model, its profile, CLI-made plans and a rank launcher.

The model is a small torch one, the plans are made by the syncopate CLI, and the launcher starts
gloo ranks in separate processes.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))


def syncopate_bin():
    """The CLI the plans are made with: $SYNCOPATE_BIN, else the workspace's debug build."""
    path = pathlib.Path(os.environ.get("SYNCOPATE_BIN", REPO / "target" / "debug" / "syncopate"))
    if not path.exists():
        pytest.fail(f"{path} is missing: build it with `cargo build` (or set SYNCOPATE_BIN)")
    return path


def cli(*args, check=True):
    """Runs `syncopate ARGS`; returns the completed process."""
    done = subprocess.run([str(syncopate_bin()), *map(str, args)], capture_output=True, text=True, timeout=300)
    if check and done.returncode != 0:
        raise AssertionError(f"syncopate {' '.join(map(str, args))} failed: {done.stderr}")
    return done


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def profile_path(tmp_path_factory):
    """The profile of models.tiny(), recorded with syncopate.torch.model_profile."""
    import torch

    import models
    from syncopate.torch import model_profile

    torch.manual_seed(0)
    model = models.tiny()
    x, y = models.batch(0, 0)
    profile = model_profile(model, lambda: torch.nn.functional.cross_entropy(model(x), y), name="tiny",
                            batch_size=len(x), iterations=2, warmup=1)
    path = tmp_path_factory.mktemp("profile") / "tiny.json"
    path.write_text(json.dumps(profile))
    return path


@pytest.fixture(scope="session")
def make_plan(profile_path, tmp_path_factory):
    """make_plan(strategy, compressor, memory, nodes, ranks_per_node, extra) → a plan file for the
    tiny model, made by `syncopate simulate --save-plan`."""
    directory = tmp_path_factory.mktemp("plans")

    def make(strategy, compressor="none", memory=None, nodes=1, ranks_per_node=2, extra=()):
        name = "-".join(str(part).replace(":", "_") for part in (strategy, compressor, memory, nodes, ranks_per_node, *extra))
        path = directory / f"{name}.json"
        args = ["simulate", "--model", profile_path, "--cluster", "v100-10gbe", "--nodes", nodes,
                "--gpus-per-node", ranks_per_node, "--strategy", strategy, "--compressor", compressor,
                "--save-plan", path, *extra]
        if memory:
            args += ["--memory", memory]
        cli(*args)
        return path

    return make
