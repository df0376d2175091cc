"""Trains a small CNN on the vendored handwritten digits (data/digits.csv.gz).

It trains with syncopate.torch.DistributedOptimizer under a plan, or serially with plain SGD; logs
per-epoch wall time, train loss and test accuracy; and writes the wrapper's trace.

Run one process per rank with torchrun's variables (torchrun, or `syncopate lab run`):

    torchrun --nproc-per-node 2 experiments/digits/train.py --plan plan.json --epochs 5 --out log.json
    python experiments/digits/train.py --epochs 5 --out log.json        # serial: plain SGD, no wrapper

`--record-profile PROFILE.json` records the model's profile (syncopate.torch.model_profile) on
this rank's batch instead of training; under several ranks every rank computes at once, as in
training, and rank 0 writes the file.
"""

import argparse
import gzip
import json
import math
import os
import pathlib
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DATA = pathlib.Path(__file__).resolve().parent / "data" / "digits.csv.gz"
# The train/test split is fixed (it does not depend on --seed): 360 of the 1797 images (20 %),
# drawn with this seed, are the test set; the other 1437 the training set.
SPLIT_SEED = 20261124
TEST_IMAGES = 360


class DigitsNet(nn.Module):
    """Three 3×3 convolutions (32, 64, 128 channels; 2×2 max-pooling after the second and third)
    and two fully connected layers: 226 570 parameters, 0.9 MB of fp32 gradients."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.conv3 = nn.Conv2d(64, 128, 3, padding=1)
        self.fc1 = nn.Linear(128 * 2 * 2, 256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.max_pool2d(F.relu(self.conv3(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def load_digits():
    """(train images, train labels, test images, test labels): N×1×8×8 float32 standardized, int64."""
    with gzip.open(DATA, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    if table.shape != (1797, 65):
        raise ValueError(f"{DATA}: expected 1797 rows of 64 pixels and a label, got shape {table.shape}")
    images = torch.from_numpy(table[:, :64] / 16.0).reshape(-1, 1, 8, 8)
    labels = torch.from_numpy(table[:, 64].astype(np.int64))
    order = torch.from_numpy(np.random.default_rng(SPLIT_SEED).permutation(len(labels)))
    test = TEST_IMAGES
    train_x, test_x = images[order[test:]], images[order[:test]]
    # Standardized with the training set's mean and deviation: on the raw [0, 1] pixels SGD sat
    # on a plateau of loss 2.3 for several epochs, longer the larger the batch.
    mean, std = train_x.mean(), train_x.std()
    return (train_x - mean) / std, labels[order[test:]], (test_x - mean) / std, labels[order[:test]]


def shard(count, epoch, seed, rank, world, batch):
    """This rank's batches of the epoch: one shuffle shared by every rank (seeded by seed and
    epoch), dealt round-robin, each rank's share cut to the same whole number of batches so that
    every rank runs the same number of iterations."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(count, generator=generator)
    mine = order[rank::world][: (count // world) // batch * batch]
    return mine.view(-1, batch)


def accuracy(model, images, labels):
    model.eval()
    with torch.no_grad():
        correct = (model(images).argmax(1) == labels).sum().item()
    model.train()
    return correct / len(labels)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plan", help="plan file (syncopate simulate --save-plan / tune --out); required with several ranks")
    p.add_argument("--model-profile", help="the model profile the plan was made with (default: the one it records)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch", type=int, default=32, help="images per rank and iteration")
    p.add_argument("--lr", type=float, default=0.05, help="learning rate (see --lr-scaling)")
    p.add_argument("--lr-scaling", choices=("none", "sqrt", "linear"), default="none",
                   help="the learning rate at W ranks: lr (default), lr·√W or lr·W (Horovod's linear rule: with "
                        "momentum 0.9 it leaves this model stuck or diverging at 4 ranks in some seeds)")
    p.add_argument("--momentum", type=float, default=0.9,
                   help="the SGD optimizer's momentum, for every parameter but those a plan's dgc memory corrects "
                        "(its momentum correction is their momentum)")
    p.add_argument("--seed", type=int, default=0, help="model initialization, shuffling and codec seed")
    p.add_argument("--check", type=int, default=0, help="check the first N iterations' aggregation (DistributedOptimizer check=N)")
    p.add_argument("--out", help="write the per-epoch log (JSON) here (rank 0)")
    p.add_argument("--trace", help="write the wrapper's measured trace here (rank 0)")
    p.add_argument("--record-profile", help="record the model profile into this file instead of training")
    p.add_argument("--profile-device", default="host-2core",
                   help="the device profile the recorded timings belong to (its name; the cluster's device for no scaling)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    args = p.parse_args(argv)
    for name in ("epochs", "batch", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name}: {getattr(args, name)} is not a positive integer")
    if not (args.lr > 0 and np.isfinite(args.lr)):
        p.error(f"--lr: {args.lr} is not a positive number")
    if not 0 <= args.momentum < 1:
        p.error(f"--momentum: {args.momentum} is not in [0, 1)")
    return args


def record_profile(args, rank, world):
    from syncopate.torch import model_profile

    torch.manual_seed(args.seed)
    model = DigitsNet()
    images, labels, _, _ = load_digits()
    x, y = images[: args.batch], labels[: args.batch]
    profile = model_profile(model, lambda: F.cross_entropy(model(x), y), name="digits-cnn", batch_size=args.batch,
                            device=args.profile_device, iterations=30, warmup=5, rank_skew=world > 1)
    profile["description"] += f"; {world} rank(s) computing at once on this machine, {args.threads} torch thread(s) each"
    if rank == 0:
        pathlib.Path(args.record_profile).write_text(json.dumps(profile, indent=1) + "\n")


def train(args, rank, world):
    import torch.distributed as dist

    torch.manual_seed(args.seed)  # the same initial model on every rank
    model = DigitsNet()
    train_x, train_y, test_x, test_y = load_digits()
    lr = args.lr * {"none": 1, "sqrt": math.sqrt(world), "linear": world}[args.lr_scaling]
    if args.plan:
        from syncopate.torch import DistributedOptimizer
        from syncopate.torch.momentum import param_groups

        # Parameters that DGC's memory corrects take their momentum from it, the rest from SGD.
        sgd = torch.optim.SGD(param_groups(model, args.plan, args.momentum, model_profile=args.model_profile), lr=lr)
        optimizer = DistributedOptimizer(sgd, model, args.plan, model_profile=args.model_profile, seed=args.seed,
                                         check=args.check)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)
    log = {"world_size": world, "plan": args.plan, "epochs": [], "batch_per_rank": args.batch, "lr": lr,
           "momentum": args.momentum, "seed": args.seed, "threads": args.threads}
    elapsed = 0.0
    for epoch in range(args.epochs):
        if args.plan:
            optimizer.set_epoch(epoch)
        batches = shard(len(train_y), epoch, args.seed, rank, world, args.batch)
        start = time.perf_counter()
        total = 0.0
        for index in batches:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(train_x[index]), train_y[index])
            loss.backward()
            optimizer.step()
            total += loss.item()
        if args.plan:
            optimizer.flush()
        seconds = time.perf_counter() - start
        elapsed += seconds
        mean_loss = torch.tensor([total / len(batches)])
        if world > 1:
            dist.all_reduce(mean_loss)
            mean_loss /= world
        entry = {"epoch": epoch, "iterations": len(batches), "epoch_s": round(seconds, 6), "elapsed_s": round(elapsed, 6),
                 "train_loss": round(mean_loss.item(), 6), "test_accuracy": round(accuracy(model, test_x, test_y), 6)}
        log["epochs"].append(entry)
        if rank == 0:
            print(json.dumps(entry), flush=True)
    if args.plan and args.trace:
        optimizer.write_trace(args.trace)
    if rank == 0 and args.out:
        pathlib.Path(args.out).write_text(json.dumps(log, indent=1) + "\n")


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(args.threads)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        import datetime
        import torch.distributed as dist

        if not args.plan and not args.record_profile:
            raise SystemExit(f"world size {world}: pass --plan (the serial run alone trains without one)")
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    elif args.plan:
        raise SystemExit("--plan with one rank: the serial run trains with plain SGD (no plan)")
    if args.record_profile:
        record_profile(args, rank, world)
    else:
        train(args, rank, world)
    if world > 1:
        # No rank tears gloo down while another still gathers or writes. (After an error the
        # rank just exits: its peers' next collective fails instead of waiting here.)
        dist.barrier()
        dist.destroy_process_group()
        # Then leave without the interpreter's teardown: a gloo worker thread that releases its
        # last collective during it aborts the process ("terminate called without an active
        # exception", pytorch/pytorch#179291), which a 4-rank profile recording hit at exit
        # with everything written. Nothing is left to write: the outputs are closed files.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
