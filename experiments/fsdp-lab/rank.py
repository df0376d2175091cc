"""One rank of the fsdp-lab experiment: a small GPT-2 trained under PyTorch FSDP2 as an export says.

The model is GPT-2's architecture (pre-norm blocks of causal self-attention and a 4x MLP with
GELU, learned positions, a final LayerNorm and a separate head) scaled to this machine. Each run
loads the settings file that `syncopate export --to fsdp` wrote for a plan, shards the model with
its `shard`, trains with SGD and prints rank 0's median step time as one JSON line; it then times
the same steps on an unsharded copy on every rank at once, the compute each rank got during the
run. `--profile OUT` records the model's profile instead (every rank at once under torchrun). An HSDP
export shards on the 2-D mesh its `hybrid_mesh` builds.
"""

import argparse
import importlib.util
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "digits"))
from steps import step_times  # noqa: E402

# GPT-2's layout at a size whose iteration computes in about the time its parameters take to
# cross a 1 Gb/s link three times (FSDP gathers them for forward and backward and reduce-scatters
# the gradients): 8 blocks of 0.79 M parameters (3.1 MB of fp32 each), 7.4 M in all.
VOCAB, CONTEXT, WIDTH, HEADS, BLOCKS = 2048, 128, 256, 4, 8


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        batch, length, _ = x.shape
        q, k, v = self.qkv(x).split(WIDTH, dim=2)
        heads = [t.view(batch, length, HEADS, WIDTH // HEADS).transpose(1, 2) for t in (q, k, v)]
        y = F.scaled_dot_product_attention(*heads, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, length, WIDTH))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(WIDTH)
        self.attn = Attention()
        self.ln_2 = torch.nn.LayerNorm(WIDTH)
        self.fc = torch.nn.Linear(WIDTH, 4 * WIDTH)
        self.out = torch.nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.out(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class Gpt(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(VOCAB, WIDTH)
        self.wpe = torch.nn.Embedding(CONTEXT, WIDTH)
        self.h = torch.nn.ModuleList(Block() for _ in range(BLOCKS))
        self.ln_f = torch.nn.LayerNorm(WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1]))
        for block in self.h:
            x = block(x)
        return self.head(self.ln_f(x))


def model():
    torch.manual_seed(0)
    net = Gpt()
    # GPT-2's initialization: normal(0, 0.02), the residual projections scaled by depth.
    for name, p in net.named_parameters():
        if p.dim() > 1:
            std = 0.02 / math.sqrt(2 * BLOCKS) if name.endswith(("proj.weight", "out.weight")) else 0.02
            torch.nn.init.normal_(p, 0.0, std)
    return net


def batch(rank, step, size):
    generator = torch.Generator().manual_seed(rank * 100_003 + step)
    tokens = torch.randint(0, VOCAB, (size, CONTEXT + 1), generator=generator)
    return tokens[:, :-1], tokens[:, 1:]


def loss_of(net, x, y):
    return F.cross_entropy(net(x).flatten(0, 1), y.flatten())


def iteration_times(net, optimizer, rank, warmup, iterations, size):
    """Wall-clock time of each measured step on this rank, after a barrier (ms)."""
    return step_times(optimizer, lambda step: loss_of(net, *batch(rank, step, size)), warmup, iterations)


def load_settings(path):
    spec = importlib.util.spec_from_file_location("fsdp_settings", path)
    settings = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(settings)
    return settings


def record_profile(args):
    """The model's profile (syncopate.torch.model_profile) written to args.profile by rank 0,
    every rank of the torchrun world recording at once."""
    from syncopate.torch import model_profile

    dist.init_process_group("gloo")
    net = model()
    x, y = batch(0, 0, args.batch)
    profile = model_profile(net, lambda: loss_of(net, x, y), name=f"gpt2-{BLOCKS}x{WIDTH}", batch_size=args.batch,
                            device=args.profile_device, iterations=args.iterations, warmup=args.warmup,
                            rank_skew=True)
    profile["description"] += (f"; {dist.get_world_size()} ranks computing at once on this machine, one torch thread "
                               "each")
    if dist.get_rank() == 0:
        with open(args.profile, "w") as f:
            json.dump(profile, f, indent=1)
    leave()


def leave():
    """Every rank done, then the process group torn down (gloo's worker threads need a moment to
    release the last collectives)."""
    dist.barrier()
    time.sleep(0.1)
    dist.destroy_process_group()


def main(argv):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--settings", help="the settings file `syncopate export --to fsdp` wrote")
    p.add_argument("--batch", type=int, default=4, help=f"sequences of {CONTEXT} tokens per rank and iteration")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iterations", type=int, default=12)
    p.add_argument("--compute-iterations", type=int, default=4,
                   help="then time this many steps of an unsharded copy on every rank at once")
    p.add_argument("--profile", metavar="OUT", help="record the model's profile to OUT (every rank at once)")
    p.add_argument("--profile-device", default="host-2core", help="the device profile the recorded timings belong to")
    args = p.parse_args(argv)
    for name in ("batch", "iterations", "compute_iterations"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: {getattr(args, name)} is not a positive integer")
    if (args.settings is None) == (args.profile is None):
        p.error("pass one of --settings and --profile")
    torch.set_num_threads(1)
    if args.profile:
        record_profile(args)
        return
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    net = model()
    settings = load_settings(args.settings)
    # An HSDP export builds its own 2-D mesh (the nodes replicate, each node's ranks shard).
    hybrid = getattr(settings, "hybrid_mesh", None)
    settings.shard(net, mesh=hybrid("cpu") if hybrid else init_device_mesh("cpu", (world,)))
    times = iteration_times(net, torch.optim.SGD(net.parameters(), lr=0.01), rank, args.warmup, args.iterations,
                       args.batch)
    # The same steps without FSDP (no gathers, no reduce-scatters) on every rank at once, right after
    # the measured ones: the compute each rank got during this run on this shared machine.
    plain = model()
    compute = iteration_times(plain, torch.optim.SGD(plain.parameters(), lr=0.01), rank, 1, args.compute_iterations,
                         args.batch)
    if rank == 0:
        print("RESULT " + json.dumps({"iteration_ms": statistics.median(times), "times_ms": times,
                                      "compute_ms": statistics.median(compute)}), flush=True)
    leave()


if __name__ == "__main__":
    main(sys.argv[1:])
