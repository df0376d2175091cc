#!/usr/bin/env python3
"""Derives ResNet-50 for 32x32 CIFAR-10 images (profiles/models/resnet50-cifar10.json) from resnet50.

Python 3 standard library only. Deterministic: same input, same bytes out.

    python3 profiles/tools/derive_cifar_resnet50.py [--base profiles/models/resnet50.json] [--out FILE]

The model is the ResNet-50 of kuangliu/pytorch-cifar (`models/resnet.py`), which MergeComp's CIFAR-10
benchmark vendors (github.com/zhuangwang93/mergeComp at 82bc96c, examples/cifar10_benchmark/models/
resnet.py, `ResNet50()`): torchvision's bottleneck blocks [3, 4, 6, 3], but a 3x3 stride-1 stem without
max pooling, so the four stages see 32x32, 16x16, 8x8 and 4x4 feature maps (56x56 ... 7x7 at 224x224),
and a 10-way `linear` head. Its parameters are registered in torchvision's order with other names
(`shortcut` for `downsample`, `linear` for `fc`).

No source times this model on a V100, so its compute is derived from the measured ImageNet profile:
every tensor's backward gap and forward share are scaled by the ratio of its layer's multiply-adds at
32x32 to those at 224x224. That ratio is (32/56)^2 for every stage (each stage's side shrinks from
56/28/14/7 to 32/16/8/4), and the stem's and the head's follow from their shapes. Scaling time with
multiply-adds assumes each layer keeps the kernel efficiency it had at 224x224; smaller feature maps
fill a V100 less well, so the derived times are a lower bound of the real ones.
"""

import argparse
import json
import os
import sys

# Side of each stage's feature maps at 224x224 (torchvision) and at 32x32 (pytorch-cifar).
STAGE_RATIO = (32 / 56) ** 2
# The stem: torchvision's 7x7 stride-2 conv onto 112x112 against pytorch-cifar's 3x3 stride-1 onto 32x32.
STEM_IMAGENET = (7 * 7 * 3, 112 * 112)
STEM_CIFAR = (3 * 3 * 3, 32 * 32)
CLASSES = (1000, 10)
# The optimizer estimate of build_profiles.py: SGD with momentum, 20 B per element at 80 % of the
# V100's 900 GB/s, plus one 5 us launch per tensor.
OPTIMIZER_BYTES_PER_ELEMENT = 20
OPTIMIZER_GBYTES_PER_S = 900 * 0.80
LAUNCH_US = 5.0


def rename(name):
    """pytorch-cifar's name of a torchvision ResNet-50 parameter."""
    name = name.replace(".downsample.", ".shortcut.")
    return "linear." + name[len("fc."):] if name.startswith("fc.") else name


def ratio(name):
    """Multiply-adds of the tensor's layer at 32x32 over those at 224x224."""
    if name.startswith("conv1."):
        return (STEM_CIFAR[0] * STEM_CIFAR[1]) / (STEM_IMAGENET[0] * STEM_IMAGENET[1])
    if name.startswith("bn1."):
        return STEM_CIFAR[1] / STEM_IMAGENET[1]
    if name.startswith("fc."):
        return CLASSES[1] / CLASSES[0]
    return STAGE_RATIO


def derive(base):
    tensors = []
    for i, t in enumerate(base["tensors"]):
        name = t["name"]
        k = ratio(name)
        out = dict(t)
        out["name"] = rename(name)
        if name == "conv1.weight":
            out["shape"] = [64, 3, 3, 3]
            out["uses_per_sample"] = STEM_CIFAR[1]
        elif name.startswith("fc."):
            out["shape"] = [CLASSES[1]] + t["shape"][1:]
        elif t.get("uses_per_sample"):
            out["uses_per_sample"] = round(t["uses_per_sample"] * STAGE_RATIO)
        numel = 1
        for d in out["shape"]:
            numel *= d
        out["numel"] = numel
        if i == 0:
            # The time before the first gradient: the loss's own kernels, then the head's backward.
            out["backward_us"] = round(LAUNCH_US + (t["backward_us"] - LAUNCH_US) * k, 3)
        else:
            out["backward_us"] = round(t["backward_us"] * k, 3)
        out["forward_us"] = round(t["forward_us"] * k, 3)
        # Keep the base's key order.
        tensors.append({key: out[key] for key in t})
    elements = sum(t["numel"] for t in tensors)
    optimizer_us = elements * OPTIMIZER_BYTES_PER_ELEMENT / (OPTIMIZER_GBYTES_PER_S * 1e3) + LAUNCH_US * len(tensors)
    macs = sum(t["numel"] * t.get("uses_per_sample", 0) for t in tensors)
    scaled = ("derived from the resnet50 profile: each tensor's backward gap and forward share scaled by its layer's "
              "multiply-adds at 32x32 over those at 224x224 ((32/56)^2 = 0.3265 for every stage; the stem "
              f"{STEM_CIFAR[0] * STEM_CIFAR[1]}/{STEM_IMAGENET[0] * STEM_IMAGENET[1]} MACs per output channel, "
              "bn1 by its feature map, the 10-way head by 10/1000); a lower bound: smaller feature maps fill a V100 "
              "less well (profiles/tools/derive_cifar_resnet50.py)")
    timing = {
        "backward": {"status": "estimated", "method": f"{scaled}; the base's: {base['timing']['backward']['method']}"},
        "forward": {"status": "estimated", "method": f"scaled as backward; the base's: {base['timing']['forward']['method']}"},
        "optimizer": {
            "status": "estimated",
            "method": (f"as the base's: SGD with momentum, {OPTIMIZER_BYTES_PER_ELEMENT} B/element, {elements} elements at "
                       f"{OPTIMIZER_GBYTES_PER_S:.0f} GB/s plus {LAUNCH_US:.0f} us per tensor x {len(tensors)} tensors = "
                       f"{optimizer_us:.1f} us"),
        },
        "first_gradient": {"status": "estimated", "method": f"the base's less its {LAUNCH_US:.0f} us for the loss's kernels, scaled by the head's 10/1000, plus those {LAUNCH_US:.0f} us; the base's: {base['timing']['first_gradient']['method']}"},
        "batch": base["timing"]["batch"],
    }
    arithmetic = dict(base["arithmetic"])
    arithmetic["head_tensors"] = [rename(n) for n in base["arithmetic"]["head_tensors"]]
    arithmetic["method"] = (
        "every conv weight multiply-adds output height x width times per image and every linear weight once "
        f"(pytorch-cifar's ResNet-50 at 32x32 input); batch norm, biases, pooling and activations not counted. "
        f"Head (backward before the first gradient): the 10-way linear layer; forward {macs:,} MACs per sample. "
        "Precision: FP32, as the base")
    profile = dict(base)
    profile.update({
        "name": "resnet50-cifar10",
        "description": "ResNet-50 for CIFAR-10 (kuangliu/pytorch-cifar, as MergeComp's cifar10_benchmark), 32x32",
        "source": ("model: github.com/zhuangwang93/mergeComp@82bc96c examples/cifar10_benchmark/models/resnet.py "
                   "(kuangliu/pytorch-cifar's ResNet50); compute: " + scaled),
        "timing": timing,
        "arithmetic": arithmetic,
        "optimizer_us": round(optimizer_us, 3),
        "tensors": tensors,
    })
    return profile


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    models = os.path.join(here, "..", "models")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=os.path.join(models, "resnet50.json"))
    parser.add_argument("--out", default=os.path.join(models, "resnet50-cifar10.json"))
    args = parser.parse_args()
    try:
        with open(args.base, encoding="utf-8") as f:
            base = json.load(f)
    except (OSError, ValueError) as err:
        sys.exit(f"derive_cifar_resnet50: cannot read --base {args.base}: {err}")
    if base.get("name") != "resnet50" or len(base.get("tensors", [])) != 161:
        sys.exit(f"derive_cifar_resnet50: --base {args.base} is not the 161-tensor resnet50 profile")
    text = json.dumps(derive(base), indent=2, ensure_ascii=False) + "\n"
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    main()
