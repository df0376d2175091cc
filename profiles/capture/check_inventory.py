#!/usr/bin/env python3
"""Compares a captured model profile's tensor inventory (names, shapes, element counts, in
gradient-ready order) with a shipped profile's, so that a capture can stand in for it.

Usage: python3 profiles/capture/check_inventory.py [--any-order] CAPTURED.json profiles/models/NAME.json
Exit status 0 when the inventories are equal, 1 with the first difference otherwise, 2 for bad
usage or a file that cannot be read. --any-order accepts the same tensors in another order and
says how many moved: under autocast, casts put some gradients ready in another order (a layer's
weight before its bias), which a profile of mixed-precision training keeps.
"""

import json
import sys


def inventory(path):
    """The (name, shape, numel) of each tensor of the profile at `path`; exits 2 naming the file
    when it cannot be read or is not a model profile."""
    try:
        with open(path) as f:
            profile = json.load(f)
        return [(t["name"], tuple(t["shape"]), t["numel"]) for t in profile["tensors"]]
    except OSError as failed:
        fail(f"error: {path}: {failed.strerror}")
    except (ValueError, KeyError, TypeError) as failed:
        fail(f"error: {path} is not a model profile ({type(failed).__name__}: {failed})")


def fail(message):
    print(message, file=sys.stderr)
    sys.exit(2)


def main(argv):
    any_order = argv[1:2] == ["--any-order"]
    if any_order:
        argv = argv[:1] + argv[2:]
    if len(argv) != 3:
        fail(next(line for line in __doc__.splitlines() if line.startswith("Usage:")))
    captured, shipped = inventory(argv[1]), inventory(argv[2])
    if any_order and sorted(captured) == sorted(shipped):
        moved = sum(1 for a, b in zip(captured, shipped) if a != b)
        print(f"{argv[1]}: the same {len(captured)} tensors as {argv[2]}, {moved} of them in another order")
        return 0
    for i, (a, b) in enumerate(zip(captured, shipped)):
        if a != b:
            print(f"tensor {i}: captured {a}, shipped {b}")
            return 1
    if len(captured) != len(shipped):
        print(f"captured {len(captured)} tensors, shipped {len(shipped)}")
        return 1
    print(f"{argv[1]}: the same {len(captured)} tensors as {argv[2]}, in the same order")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
