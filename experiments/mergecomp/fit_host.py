"""Fits v100-pcie-mpi's two host rates on MergeComp's ResNet-50 FP32 rows, and only on them.

Usage: python3 experiments/mergecomp/fit_host.py [path/to/syncopate]

A grid over `library.host_staging_gbytes_per_s` and
`library.shared_memory.host_memory_gbytes_per_s`; every other number of
topologies/v100-pcie-mpi.json is kept. Each point simulates Horovod's FP32 plan of ResNet-50 at
2, 4 and 8 GPUs (framework horovod, as experiments/mergecomp runs it: the CIFAR-10 model of
MergeComp's cifar10_benchmark at its batch of 64) and scores the mean |error| of the scaling
factor against the paper's (published.json, block "ResNet-50, PCIe", row FP32). Prints the five
best points; the ResNet-101 rows (ImageNet, batch 64) are held out and only shown.
"""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STAGING = [1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0]
HOST = [10.0, 12.0, 14.0, 16.0, 18.0, 20.0, 25.0, 30.0, 40.0]
# MergeComp's scripts' --batch-size default (examples/cifar10_benchmark/cifar10_benchmark.py and
# examples/imagenet_benchmark/pytorch_imagenet.py at 82bc96c).
BATCH = 64
GPUS = [2, 4, 8]


def published(panel):
    with open(os.path.join(HERE, "published.json")) as f:
        blocks = json.load(f)["blocks"]
    block = next(b for b in blocks if b["panels"] == [panel])
    return dict(zip(block["gpus"], block["values"]["FP32"]))


def scaling(syncopate, cluster_path, model, gpus):
    out = subprocess.run(
        [syncopate, "simulate", "--model", model, "--cluster", cluster_path, "--nodes", "1",
         "--gpus-per-node", str(gpus), "--strategy", "horovod", "--framework", "horovod",
         "--batch-size", str(BATCH), "--format", "json"],
        capture_output=True, text=True, check=True).stdout
    return 100.0 * json.loads(out)["scaling_efficiency"]


def write(base, staging, host, path):
    """`base` with the two host rates set, written to `path`."""
    cluster = json.loads(json.dumps(base))
    cluster["library"]["host_staging_gbytes_per_s"] = staging
    cluster["library"]["shared_memory"]["host_memory_gbytes_per_s"] = host
    with open(path, "w") as f:
        json.dump(cluster, f)


def main():
    syncopate = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/syncopate")
    with open(os.path.join(ROOT, "topologies/v100-pcie-mpi.json")) as f:
        base = json.load(f)
    fitted, held = published("ResNet-50, PCIe"), published("ResNet-101, PCIe")
    points = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "cluster.json")
        for staging in STAGING:
            for host in HOST:
                write(base, staging, host, path)
                predicted = [scaling(syncopate, path, "resnet50-cifar10", g) for g in GPUS]
                error = sum(abs(p / fitted[g] - 1) for p, g in zip(predicted, GPUS)) / len(GPUS)
                points.append((error, staging, host, predicted))
        points.sort()
        for error, staging, host, predicted in points[:5]:
            shown = "/".join(f"{p:.1f}" for p in predicted)
            print(f"staging {staging} GB/s, host {host} GB/s: mean |error| {100 * error:.1f} % "
                  f"(predicted {shown} % against {'/'.join(str(fitted[g]) for g in GPUS)} %)")
        _, staging, host, _ = points[0]
        write(base, staging, host, path)
        rn101 = [scaling(syncopate, path, "resnet101", g) for g in GPUS]
        print("held out, ResNet-101 FP32: predicted "
              + "/".join(f"{p:.1f}" for p in rn101) + " % against "
              + "/".join(str(held[g]) for g in GPUS) + " %")


if __name__ == "__main__":
    main()
