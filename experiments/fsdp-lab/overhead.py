"""What FSDP2 itself costs a CPU rank: the model under exported settings on one rank, beside it unsharded.

On one rank FSDP2 skips its collectives (a world of one gathers nothing and copies its
reduce-scatter input), so what the sharded model takes beyond the plain one is the framework's
own work on the host: its hooks, its copies and the optimizer over DTensors. Each setting is
exported as fsdp-lab's runs are (`syncopate simulate --save-plan`, `syncopate export --to
fsdp`) and timed beside the plain model, interleaved in seeded rounds, one torch thread; the
simulator's price of the same framework work is the plan predicted with `pytorch-fsdp` less
with `--framework none`.

    target/pyenv/bin/python experiments/fsdp-lab/overhead.py
"""

import argparse
import json
import os
import pathlib
import random
import statistics
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "experiments" / "digits"))
import rank  # noqa: E402
from runner import sh  # noqa: E402

# (blocks a unit, reshard after forward), as fsdp-lab's settings write them.
SETTINGS = [(1, True), (8, True), (1, False)]
SCRATCH = REPO / "target" / "fsdp-lab" / "overhead"


def flags(blocks, reshard, framework):
    return ["simulate", "--model", "profiles/gpt2-w2.json", "--cluster", "clusters/lab-2n-1g-gloo.json", "--nodes", 1,
            "--gpus-per-node", 1, "--strategy", "fsdp", "--blocks-per-unit", blocks, "--reshard-after-forward",
            str(reshard).lower(), "--framework", framework]


def exported(syncopate, blocks, reshard):
    """The settings file of the one-rank plan, and the framework's predicted cost (ms)."""
    SCRATCH.mkdir(parents=True, exist_ok=True)
    plan, settings = SCRATCH / f"u{blocks}-{reshard}.json", SCRATCH / f"u{blocks}-{reshard}.py"
    sh([syncopate, *flags(blocks, reshard, "pytorch-fsdp"), "--save-plan", plan], "plan", 300, cwd=HERE)
    sh([syncopate, "export", "--plan", plan, "--to", "fsdp", "--out", settings], "export", 300, cwd=HERE)
    priced = [json.loads(sh([syncopate, *flags(blocks, reshard, framework), "--format", "json"], "simulate", 300,
                            cwd=HERE))["iteration_time_ms"] for framework in ("pytorch-fsdp", "none")]
    return settings, priced[0] - priced[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--syncopate", default=str(REPO / "target" / "release" / "syncopate"))
    p.add_argument("--rounds", type=int, default=5)
    opts = p.parse_args()
    if opts.rounds < 1:
        p.error(f"--rounds: {opts.rounds} is not a positive integer")
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29611"), RANK="0",
                      WORLD_SIZE="1")
    dist.init_process_group("gloo")
    models, priced = {}, {}
    plain = rank.model()
    models["plain"] = (plain, torch.optim.SGD(plain.parameters(), lr=0.01))
    for blocks, reshard in SETTINGS:
        settings, priced[(blocks, reshard)] = exported(opts.syncopate, blocks, reshard)
        net = rank.model()
        rank.load_settings(settings).shard(net, mesh=init_device_mesh("cpu", (1,)))
        models[(blocks, reshard)] = (net, torch.optim.SGD(net.parameters(), lr=0.01))
    times = {key: [] for key in models}
    for r in range(opts.rounds):
        for key in random.Random(r).sample(list(models), len(models)):
            net, optimizer = models[key]
            times[key].append(statistics.median(rank.iteration_times(net, optimizer, 0, 2, 6, 4)))
    base = statistics.median(times["plain"])
    print(f"plain model: {base:.1f} ms an iteration (median of {opts.rounds} rounds)")
    print("| blocks a unit / reshard | ms an iteration (min–max) | FSDP2's own work, measured | priced |")
    print("|---|---|---|---|")
    for blocks, reshard in SETTINGS:
        t = times[(blocks, reshard)]
        print(f"| {blocks} / {'yes' if reshard else 'no'} | {statistics.median(t):.1f} ({min(t):.1f}–{max(t):.1f}) | "
              f"{statistics.median(t) - base:.1f} ms | {priced[(blocks, reshard)]:.1f} ms |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
