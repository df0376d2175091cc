#!/usr/bin/env python3
"""Writes profiles/synthetic/moe-10k.json: a synthetic mixture-of-experts model with about
10,000 gradient tensors (per-expert weights), for measuring how `syncopate tune` scales.

Nothing in it is measured: sizes follow a Mixtral-like layout scaled down (hidden 1024,
expert FFN 2816, 68 experts in each of 48 layers), and times are a flat 2.5e-4 us of backward
per element (forward half of that) on a V100-class device, so that ranking plans exercises the
search and not the data. Usage: python3 profiles/tools/synthetic_moe.py [OUT]
"""
import json
import os
import sys

LAYERS, EXPERTS, HIDDEN, FFN, VOCAB = 48, 68, 1024, 2816, 32000
US_PER_ELEMENT = 2.5e-4


def tensors():
    """(name, shape) in forward (registration) order."""
    yield "embed.weight", [VOCAB, HIDDEN]
    for layer in range(LAYERS):
        p = f"layers.{layer}"
        for w in ("q", "k", "v", "o"):
            yield f"{p}.attn.{w}.weight", [HIDDEN, HIDDEN]
        yield f"{p}.attn_norm.weight", [HIDDEN]
        yield f"{p}.router.weight", [EXPERTS, HIDDEN]
        for e in range(EXPERTS):
            yield f"{p}.experts.{e}.w1.weight", [FFN, HIDDEN]
            yield f"{p}.experts.{e}.w2.weight", [HIDDEN, FFN]
            yield f"{p}.experts.{e}.w3.weight", [FFN, HIDDEN]
        yield f"{p}.ffn_norm.weight", [HIDDEN]
    yield "norm.weight", [HIDDEN]
    yield "lm_head.weight", [VOCAB, HIDDEN]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "synthetic", "moe-10k.json")
    forward = list(tensors())
    n = len(forward)
    rows = []
    # Gradients become ready in reverse registration order.
    for reg in reversed(range(n)):
        name, shape = forward[reg]
        numel = 1
        for d in shape:
            numel *= d
        backward = round(numel * US_PER_ELEMENT, 3)
        rows.append({"name": name, "shape": shape, "numel": numel, "dtype": "f32",
                     "registration_index": reg, "backward_us": backward,
                     "forward_us": round(backward / 2, 3)})
    total = sum(r["numel"] for r in rows)
    model = {
        "format_version": 1,
        "name": "moe-10k",
        "description": f"synthetic mixture-of-experts, {n} tensors ({LAYERS} layers x {EXPERTS} experts), for scale tests of the tuner",
        "source": "synthetic: written by profiles/tools/synthetic_moe.py; no measurement",
        "device": "v100-sxm2-32gb",
        "framework": "synthetic",
        "batch_size_per_gpu": 1,
        "sample_unit": "sequences",
        "timing": {
            "backward": {"status": "estimated", "method": f"synthetic: {US_PER_ELEMENT} us per element"},
            "forward": {"status": "estimated", "method": "synthetic: half of backward"},
            "optimizer": {"status": "estimated", "method": "synthetic: 28 B per element at 720 GB/s"},
        },
        "optimizer_us": round(total * 28 / 720e3, 3),
        "tensors": rows,
    }
    with open(out, "w") as f:
        json.dump(model, f, indent=1)
        f.write("\n")
    print(f"wrote {out}: {n} tensors, {total} elements")


if __name__ == "__main__":
    main()
