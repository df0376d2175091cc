#!/usr/bin/env python3
"""Builds the shipped model profiles (profiles/models/*.json) from profiles/validation.

Python 3 standard library only. Deterministic: same inputs, same bytes out.

    python3 profiles/tools/build_profiles.py [--validation-data DIR] [--out DIR]

Sources (see profiles/README.md for the long form):
  * tensor inventories: validation-data/inventory_<model>.csv (exact sizes, gradient-ready order,
    registration index; computed from torchvision / HF transformers model definitions).
  * measured backward gaps: validation-data/espresso_v100_readygap_<model>.csv = Espresso
    (EuroSys'23) repository zhuangwang93/Espresso, byteps/torch/mergeComp/scheduler/model_tensor.py
    (one V100 32GB, PyTorch 1.8).
  * batch sizes: Espresso's benchmark scripts byteps/torch/examples/<model>/run_baseline.sh and the
    argument defaults of the training scripts they call (cited per model below).
  * FLOP counts for scaling: torchvision model docs (https://pytorch.org/vision/stable/models.html,
    "GFLOPS" column, 224x224 input except Inception-v3 at 299x299).
"""

import argparse
import csv
import json
import math
import os
import statistics
import sys

FORMAT_VERSION = 1
DEVICE = "v100-sxm2-32gb"
FRAMEWORK = "PyTorch 1.8"
ESPRESSO_SRC = ("Espresso (EuroSys'23) repository github.com/zhuangwang93/Espresso, "
                "byteps/torch/mergeComp/scheduler/model_tensor.py")

# torchvision docs, "GFLOPS" column (multiply-adds per image, forward).
TORCHVISION_GFLOPS = {
    "resnet50": 4.09,
    "resnet101": 7.80,
    "resnet152": 11.51,
    "vgg16": 15.47,
    "vgg19": 19.63,
    "alexnet": 0.71,
    "inception-v3": 5.71,
    "densenet201": 4.29,
}
TORCHVISION_CITE = "torchvision model docs (pytorch.org/vision/stable/models.html), GFLOPS column"

# V100 HBM2 peak bandwidth (NVIDIA Tesla V100 datasheet) and the fraction a streaming
# element-wise optimizer kernel reaches (stated assumption; STREAM-like kernels reach ~80-90%).
V100_HBM_GBPS = 900.0
MEM_EFFICIENCY = 0.8
# Small-tensor floor used when an estimated model's backward time is distributed by FLOPs:
# the typical measured gap between two small tensors of one layer in the Espresso traces
# (e.g. ResNet-50 bn.weight -> bn.bias: 4-5 us).
SMALL_TENSOR_FLOOR_US = 5.0

# Optimizer byte counts per element (fp32) and per-tensor host/launch overhead.
OPTIMIZERS = {
    "sgd_momentum": {
        "bytes": 20,
        "per_tensor_us": 5.0,
        "text": ("torch.optim.SGD with momentum (per-tensor loop, no foreach in PyTorch 1.8): "
                 "20 B/element (read param, grad, momentum; write momentum, param)"),
    },
    "sgd": {
        "bytes": 12,
        "per_tensor_us": 5.0,
        "text": ("torch.optim.SGD without momentum (AWD-LSTM script default): 12 B/element "
                 "(read param, grad; write param)"),
    },
    "adam": {
        "bytes": 28,
        "per_tensor_us": 10.0,
        "text": ("Adam-family per-tensor loop (torch.optim.Adam/AdamW, BertAdam): 28 B/element "
                 "(read param, grad, exp_avg, exp_avg_sq; write param, exp_avg, exp_avg_sq); "
                 "~5 small kernels per tensor, so 10 us/tensor"),
    },
}


def die(msg):
    sys.stderr.write("build_profiles.py: error: %s\n" % msg)
    sys.exit(1)


def read_inventory(vd, stem):
    path = os.path.join(vd, "inventory_%s.csv" % stem)
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            shape = [int(x) for x in r["shape"].split("x")]
            numel = int(r["numel"])
            if math.prod(shape) != numel:
                die("%s: %s shape %s does not match numel %d" % (path, r["name"], r["shape"], numel))
            rows.append({"name": r["name"], "shape": shape, "numel": numel,
                         "reg": int(r["reg_idx"]), "bwd": int(r["bwd_idx"])})
    # Tensors whose gradient the inventory's recording never saw carry bwd_idx -1 (Inception-v3's
    # AuxLogits head). They still are parameters (registration indices and sizes count), so they are
    # placed where autograd runs them when the auxiliary loss is used: the aux head was created after
    # Mixed_6e in forward, so its backward runs just before Mixed_6e's.
    unseen = [r for r in rows if r["bwd"] == -1]
    rows = [r for r in rows if r["bwd"] != -1]
    for i, r in enumerate(rows):
        if r["bwd"] != i:
            die("%s: bwd_idx not 0..n-1 in file order" % path)
    if unseen:
        order = UNSEEN_ORDER.get(stem)
        if order is None or sorted(order) != sorted(r["name"] for r in unseen):
            die("%s: no placement rule for tensors with bwd_idx -1" % path)
        by_name = {r["name"]: r for r in unseen}
        at = next(i for i, r in enumerate(rows) if r["name"].startswith(UNSEEN_BEFORE[stem]))
        rows[at:at] = [by_name[n] for n in order]
        for i, r in enumerate(rows):
            r["bwd"] = i
    return rows


UNSEEN_BEFORE = {"inception_v3": "Mixed_6e."}
UNSEEN_ORDER = {"inception_v3": [
    "AuxLogits.fc.bias", "AuxLogits.fc.weight",
    "AuxLogits.conv1.bn.weight", "AuxLogits.conv1.bn.bias", "AuxLogits.conv1.conv.weight",
    "AuxLogits.conv0.bn.weight", "AuxLogits.conv0.bn.bias", "AuxLogits.conv0.conv.weight",
]}


def read_espresso(vd, stem):
    path = os.path.join(vd, "espresso_v100_readygap_%s.csv" % stem)
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            rows.append({"name": r["name"], "numel": int(r["numel"]),
                         "gap": float(r["gap_us_since_prev_ready"])})
    return rows


def r3(x):
    """Rounds to 1 ns so the JSON is short and stable."""
    return round(x, 3)


# --------------------------------------------------------------------------------------------
# Backward timings
# --------------------------------------------------------------------------------------------

def first_gap_estimate(gaps):
    """Espresso's first gap is 0 by construction (measured from the first ready gradient)."""
    return statistics.median(gaps[1:])


FIRST_GAP_TEXT = ("Espresso measures gaps from the first ready gradient, so its first gap is 0; "
                  "the time from backward start to the first gradient (loss backward + last layer) "
                  "is estimated as the median of the model's other measured gaps")


def measured_backward(vd, esp_stem, inv):
    """Per-tensor gaps, mapped to the inventory by position (bwd order). Returns (gaps, notes)."""
    esp = read_espresso(vd, esp_stem)
    if len(esp) != len(inv):
        die("%s: %d Espresso tensors vs %d inventory tensors" % (esp_stem, len(esp), len(inv)))
    notes = []
    renamed, swapped, numel_diff = [], [], []
    inv_names = {r["name"]: r for r in inv}
    for i, (e, t) in enumerate(zip(esp, inv)):
        en = e["name"]
        if en == t["name"] and e["numel"] == t["numel"]:
            continue
        alt = en.replace("dense_act", "dense")
        if alt != en and alt == t["name"] and e["numel"] == t["numel"]:
            renamed.append(en)
            continue
        if en in inv_names or alt in inv_names:
            other = inv_names.get(en) or inv_names.get(alt)
            if other["numel"] != e["numel"]:
                numel_diff.append("%s (Espresso %d vs inventory %d)" % (en, e["numel"], other["numel"]))
            else:
                swapped.append("%d:%s<->%s" % (i, en, t["name"]))
            continue
        die("%s: Espresso tensor %d %s has no inventory counterpart" % (esp_stem, i, en))
    if renamed:
        notes.append("Espresso names %d tensors '*.intermediate.dense_act.*' (NVIDIA BERT modeling.py) "
                     "where HF has '*.intermediate.dense.*'" % len(renamed))
    if swapped:
        notes.append("ready order differs from the inventory at %d positions (%s%s); gaps are mapped "
                     "by position, i.e. the k-th ready gradient keeps Espresso's k-th ready time"
                     % (len(swapped), ", ".join(swapped[:4]), ", ..." if len(swapped) > 4 else ""))
    if numel_diff:
        notes.append("numel differs: %s (NVIDIA BERT pads the vocabulary to a multiple of 8); "
                     "sizes here are the inventory's" % "; ".join(numel_diff))
    gaps = [e["gap"] for e in esp]
    gaps[0] = first_gap_estimate(gaps)
    return gaps, notes


def scale_to_total(values, total):
    s = sum(values)
    return [v * total / s for v in values]


def analog_backward(src_names, src_gaps, inv, analog_of, total):
    """Each target tensor takes the measured gap of its analog tensor in the source model, then
    everything is scaled so that the sum equals `total`."""
    idx = {n: i for i, n in enumerate(src_names)}
    raw = []
    for t in inv:
        a = analog_of(t["name"])
        if a not in idx:
            die("no analog for %s (looked for %s)" % (t["name"], a))
        raw.append(src_gaps[idx[a]])
    return scale_to_total(raw, total)


def flops_backward(inv, macs_of, total):
    """floor + share of (total - n*floor) proportional to the tensor's layer MACs."""
    macs = [macs_of(t) for t in inv]
    rest = total - SMALL_TENSOR_FLOOR_US * len(inv)
    if rest <= 0:
        die("total backward too small for the per-tensor floor")
    s = sum(macs)
    return [SMALL_TENSOR_FLOOR_US + rest * m / s for m in macs], sum(macs)


# --------------------------------------------------------------------------------------------
# Forward and optimizer
# --------------------------------------------------------------------------------------------

def layer_of(name):
    return name.rsplit(".", 1)[0] if "." in name else name


def forward_from_backward(inv, bwd, override=None):
    """Layer forward = half the layer's backward gaps, split over the layer's tensors by numel."""
    basis = list(bwd)
    if override:
        for i, v in override.items():
            basis[i] = v
    layers = {}
    for i, t in enumerate(inv):
        layers.setdefault(layer_of(t["name"]), []).append(i)
    fwd = [0.0] * len(inv)
    for members in layers.values():
        layer_fwd = 0.5 * sum(basis[i] for i in members)
        n = sum(inv[i]["numel"] for i in members)
        for i in members:
            fwd[i] = layer_fwd * inv[i]["numel"] / n
    return fwd


FORWARD_TEXT = ("no source measures forward per tensor: forward = backward / 2 (backward ~ 2x forward); "
                "each layer (module = tensor name without its last component) gets half of the backward "
                "gaps of its tensors, split among the layer's tensors in proportion to numel")


def optimizer_estimate(inv, kind):
    o = OPTIMIZERS[kind]
    numel = sum(t["numel"] for t in inv)
    mem_us = numel * o["bytes"] / (V100_HBM_GBPS * 1e3 * MEM_EFFICIENCY)
    us = mem_us + o["per_tensor_us"] * len(inv)
    text = ("memory-bound estimate: %s; %d elements x %d B / (%.0f GB/s V100 HBM2 peak x %.2f efficiency) "
            "= %.1f us, plus %.0f us per tensor x %d tensors for the per-tensor kernel launches = %.1f us"
            % (o["text"], numel, o["bytes"], V100_HBM_GBPS, MEM_EFFICIENCY, mem_us,
               o["per_tensor_us"], len(inv), us))
    return us, text


# --------------------------------------------------------------------------------------------
# Shapes for models without an inventory (Espresso CSV only)
# --------------------------------------------------------------------------------------------

def lstm_shape(name, numel):
    # byteps/torch/examples/lstm/main.py defaults: emsize=nhid=1500, nlayers=2, tied weights;
    # WikiText-2 vocabulary 33278 (= decoder.bias numel). LSTM gates: 4*1500 = 6000 rows.
    table = {
        "encoder.weight": [33278, 1500],
        "decoder.bias": [33278],
    }
    if name in table:
        return table[name]
    if ".weight_ih_l0" in name or ".weight_hh_l0" in name:
        return [6000, 1500]
    if ".bias_ih_l0" in name or ".bias_hh_l0" in name:
        return [6000]
    return [numel]


def ncf_shape(name, numel):
    # Linear layers: out features = the bias numel, in = numel / out. final.weight (128) = MF dim
    # (64) + last MLP width (64) -> MF embedding dim 64; mlp.0 input 256 = 2 x MLP embedding dim 128.
    table = {
        "mlp.0.weight": [256, 256], "mlp.0.bias": [256],
        "mlp.1.weight": [128, 256], "mlp.1.bias": [128],
        "mlp.2.weight": [64, 128], "mlp.2.bias": [64],
        "final.weight": [1, 128], "final.bias": [1],
    }
    if name in table:
        return table[name]
    if name.startswith("mf_"):
        return [numel // 64, 64]
    if name.startswith("mlp_") and name.endswith("embed.weight"):
        return [numel // 128, 128]
    return [numel]


def ugatit_shape(name, numel, bias_numel):
    # byteps/torch/examples/ugatit/networks.py with main.py defaults ch=64, n_res=4, img_size=256,
    # light=False; discriminators have n_layers 7 (global) and 5 (local), 4x4 kernels.
    parts = name.split(".")
    net, rest = parts[0], ".".join(parts[1:])
    if net.startswith("gen"):
        gen = {
            "DownBlock.1.weight": [64, 3, 7, 7],
            "DownBlock.5.weight": [128, 64, 3, 3],
            "DownBlock.9.weight": [256, 128, 3, 3],
            "gap_fc.weight": [1, 256],
            "gmp_fc.weight": [1, 256],
            "conv1x1.weight": [256, 512, 1, 1],
            "conv1x1.bias": [256],
            "FC.0.weight": [256, 1048576],
            "FC.2.weight": [256, 256],
            "gamma.weight": [256, 256],
            "beta.weight": [256, 256],
            "UpBlock2.2.weight": [128, 256, 3, 3],
            "UpBlock2.7.weight": [64, 128, 3, 3],
            "UpBlock2.11.weight": [3, 64, 7, 7],
        }
        if rest in gen:
            return gen[rest]
        if "conv_block" in rest or (rest.startswith("UpBlock1_") and ".conv" in rest):
            return [256, 256, 3, 3]
        if rest.startswith("UpBlock1_") and rest.endswith(".rho"):
            return [1, 256, 1, 1]
        if rest.startswith("UpBlock2.3."):
            return [1, 128, 1, 1]
        if rest.startswith("UpBlock2.8."):
            return [1, 64, 1, 1]
        return [numel]
    # discriminators
    if rest.endswith(".bias"):
        return [numel]
    if rest in ("gap_fc.weight_orig", "gmp_fc.weight_orig"):
        return [1, numel]
    if rest == "conv.weight_orig":
        return [1, numel // 16, 4, 4]
    if rest == "conv1x1.weight":
        out = bias_numel[net + ".conv1x1.bias"]
        return [out, numel // out, 1, 1]
    if rest.startswith("model.") and rest.endswith(".weight_orig"):
        out = bias_numel[net + "." + rest.replace(".weight_orig", ".bias")]
        return [out, numel // (out * 16), 4, 4]
    return [numel]


def inventory_from_espresso(vd, stem, shape_fn):
    esp = read_espresso(vd, stem)
    bias_numel = {e["name"]: e["numel"] for e in esp}
    inv, fallback = [], []
    for i, e in enumerate(esp):
        if shape_fn is ugatit_shape:
            shape = ugatit_shape(e["name"], e["numel"], bias_numel)
        else:
            shape = shape_fn(e["name"], e["numel"])
        if math.prod(shape) != e["numel"]:
            shape = [e["numel"]]
        if len(shape) == 1 and "bias" not in e["name"].rsplit(".", 1)[-1]:
            fallback.append(e["name"])
        inv.append({"name": e["name"], "shape": shape, "numel": e["numel"], "bwd": i, "reg": None})
    # Registration order: unknown without the model source; reverse gradient-ready order is the
    # standard approximation (backward visits layers in reverse registration order).
    n = len(inv)
    for i, t in enumerate(inv):
        t["reg"] = n - 1 - i
    return inv, fallback


# --------------------------------------------------------------------------------------------
# Per-layer MACs for FLOP-distributed CNN estimates (forward MACs per image)
# --------------------------------------------------------------------------------------------

def is_weight_of_conv_or_linear(t):
    return t["name"].endswith("weight") and len(t["shape"]) in (2, 4)


def alexnet_macs(t):
    if not is_weight_of_conv_or_linear(t):
        return 0
    out_hw = {"features.0": 55, "features.3": 27, "features.6": 13, "features.8": 13, "features.10": 13}
    layer = layer_of(t["name"])
    hw = out_hw.get(layer, 1)
    return t["numel"] * hw * hw


def densenet201_macs(t):
    if not is_weight_of_conv_or_linear(t):
        return 0
    n = t["name"]
    if n.startswith("classifier"):
        hw = 1
    elif n.startswith("features.conv0"):
        hw = 112
    else:
        hw = None
        for k, size in (("denseblock1", 56), ("transition1", 56), ("denseblock2", 28),
                        ("transition2", 28), ("denseblock3", 14), ("transition3", 14),
                        ("denseblock4", 7)):
            if n.startswith("features." + k + "."):
                hw = size
        if hw is None:
            die("densenet201: no spatial size for %s" % n)
    return t["numel"] * hw * hw


def inception_v3_macs(t):
    if not is_weight_of_conv_or_linear(t):
        return 0
    n = t["name"]
    sizes = [
        ("Conv2d_1a_3x3.", 149), ("Conv2d_2a_3x3.", 147), ("Conv2d_2b_3x3.", 147),
        ("Conv2d_3b_1x1.", 73), ("Conv2d_4a_3x3.", 71),
        ("Mixed_5b.", 35), ("Mixed_5c.", 35), ("Mixed_5d.", 35),
        ("Mixed_6a.branch3x3.", 17), ("Mixed_6a.branch3x3dbl_3.", 17), ("Mixed_6a.", 35),
        ("Mixed_6b.", 17), ("Mixed_6c.", 17), ("Mixed_6d.", 17), ("Mixed_6e.", 17),
        ("AuxLogits.conv0.", 5), ("AuxLogits.conv1.", 1), ("AuxLogits.fc.", 1),
        ("Mixed_7a.branch3x3_2.", 8), ("Mixed_7a.branch7x7x3_4.", 8), ("Mixed_7a.", 17),
        ("Mixed_7b.", 8), ("Mixed_7c.", 8), ("fc.", 1),
    ]
    for prefix, hw in sizes:
        if n.startswith(prefix):
            return t["numel"] * hw * hw
    die("inception-v3: no spatial size for %s" % n)


# --------------------------------------------------------------------------------------------
# Analog maps for same-family scaling
# --------------------------------------------------------------------------------------------

def resnet_analog(src_blocks):
    def f(name):
        p = name.split(".")
        if p[0].startswith("layer") and len(p) > 2:
            stage, block = p[0], int(p[1])
            nsrc = src_blocks[stage]
            if block >= nsrc:
                # Extra blocks are identical to the source's non-first blocks: cycle through them.
                block = 1 + (block - 1) % (nsrc - 1)
            p[1] = str(block)
        return ".".join(p)
    return f


VGG16_STAGES = [[0, 2], [5, 7], [10, 12, 14], [17, 19, 21], [24, 26, 28]]
VGG19_STAGES = [[0, 2], [5, 7], [10, 12, 14, 16], [19, 21, 23, 25], [28, 30, 32, 34]]


def vgg19_analog(name):
    p = name.split(".")
    if p[0] != "features":
        return name
    idx = int(p[1])
    for s, convs in enumerate(VGG19_STAGES):
        if idx in convs:
            pos = convs.index(idx)
            src = VGG16_STAGES[s]
            # The 4th conv of a VGG19 stage has the same shape as the 2nd/3rd: use the last.
            p[1] = str(src[min(pos, len(src) - 1)])
            return ".".join(p)
    die("vgg19: unknown feature index in %s" % name)


def gpt2_analog(n_layer_target, n_layer_src=12):
    def f(name):
        p = name.split(".")
        if len(p) > 2 and p[0] == "transformer" and p[1] == "h":
            L = int(p[2])
            p[2] = str(int(round(L * (n_layer_src - 1) / max(1, n_layer_target - 1))))
        return ".".join(p)
    return f


def gpt2_dims(inv):
    d = next(t["numel"] for t in inv if t["name"] == "transformer.ln_f.weight")
    vocab = next(t["shape"][0] for t in inv if t["name"] == "transformer.wte.weight")
    n_layer = len({t["name"].split(".")[2] for t in inv if t["name"].startswith("transformer.h.")})
    n_nonemb = sum(t["numel"] for t in inv if t["name"] not in ("transformer.wte.weight", "transformer.wpe.weight"))
    return d, vocab, n_layer, n_nonemb


GPT2_CTX = 1024


def gpt2_flops_per_token(inv):
    # Kaplan et al. 2020 (arXiv:2001.08361) Table 1: forward ~ 2N + 2 n_layer n_ctx d_model,
    # plus the tied LM head (2 d_model n_vocab), which Kaplan leaves out of N.
    d, vocab, n_layer, n_nonemb = gpt2_dims(inv)
    return 2 * n_nonemb + 2 * n_layer * GPT2_CTX * d + 2 * d * vocab


# --------------------------------------------------------------------------------------------
# Model catalog
# --------------------------------------------------------------------------------------------

MEASURED = {
    # name: (espresso stem, inventory stem or None, description, batch, unit, batch note, optimizer)
    "resnet50": ("resnet50", "resnet50", "ResNet-50 (torchvision), ImageNet 224x224", 32, "images",
                 "batch 32 per GPU assumed: Espresso ships no ResNet-50 script; 32 is the batch of its "
                 "other CNN scripts (resnet101/vgg16 run_baseline.sh --batch-size 32)", "sgd_momentum"),
    "resnet101": ("resnet101", "resnet101", "ResNet-101 (torchvision), ImageNet 224x224", 32, "images",
                  "batch 32 per GPU: Espresso byteps/torch/examples/resnet101/run_baseline.sh --batch-size 32",
                  "sgd_momentum"),
    "vgg16": ("vgg16", "vgg16", "VGG-16 (torchvision, no BN), ImageNet 224x224", 32, "images",
              "batch 32 per GPU: Espresso byteps/torch/examples/vgg16/run_baseline.sh --batch-size 32",
              "sgd_momentum"),
    "bert-base": ("bert", "bert_base_squad_hf",
                  "BERT-base fine-tuning on SQuAD v1.1 (question-answering head, no pooler), sequence length 384",
                  8, "sequences",
                  "batch 8 sequences x 384 tokens per GPU: Espresso byteps/torch/examples/BERT/run_baseline.sh "
                  "(batch_size=8, --max_seq_length=384, bert_base_config.json). Caveat: 8x384 tokens in the "
                  "measured 66 ms backward implies ~17 TFLOP/s, above the V100's 15.7 TFLOP/s FP32 peak, so "
                  "the trace was probably taken at a smaller batch or with mixed precision", "adam"),
    "bert-large": ("bert_large", "bert_large_squad_hf",
                   "BERT-large fine-tuning on SQuAD v1.1 (question-answering head, no pooler), sequence length 384",
                   8, "sequences",
                   "batch 8 sequences x 384 tokens per GPU assumed: Espresso's BERT run_baseline.sh is set up for "
                   "BERT-base with batch_size=8 and carries the BERT-large checkpoint/config as commented-out "
                   "alternatives in the same script", "adam"),
    "gpt2": ("gpt2", "gpt2_small_lmhead_hf", "GPT-2 small (124M) with tied LM head, WikiText-2 fine-tuning, 1024 tokens",
             4, "sequences",
             "batch 4 sequences x 1024 tokens per GPU: Espresso byteps/torch/examples/gpt-2/run_baseline.sh "
             "(--per_gpu_train_batch_size 4; block_size defaults to the tokenizer's 1024)", "adam"),
    "lstm": ("LSTM", None, "2-layer LSTM language model (AWD-LSTM code, emsize=nhid=1500, tied weights), WikiText-2",
             80, "sequences",
             "batch 80 sequences x 70 tokens (bptt) per GPU: defaults of Espresso byteps/torch/examples/lstm/main.py "
             "(--batch-size 80, --bptt 70), which run_baseline.sh does not override", "sgd"),
    "ugatit": ("ugatit", None, "U-GAT-IT (full version, 256x256), two generators + four discriminators, selfie2anime",
               1, "image pairs",
               "batch 1 per GPU: default of Espresso byteps/torch/examples/ugatit/main.py (--batch_size 1), "
               "not overridden by run_baseline.sh", "adam"),
    "ncf": ("ncf", None, "Neural Collaborative Filtering (NeuMF: MF dim 64, MLP 256-128-64)", 65536, "user-item pairs",
            "batch size assumed: Espresso has no NCF script; 65536 per GPU is an assumed value of the order "
            "of NVIDIA DeepLearningExamples' NCF (global batch 2^20 across 8-16 GPUs)", "adam"),
}

ESTIMATED = ["resnet152", "vgg19", "alexnet", "inception-v3", "densenet201",
             "gpt2-medium", "gpt2-large", "gpt2-xl"]

INV_STEM = {
    "resnet152": "resnet152", "vgg19": "vgg19", "alexnet": "alexnet", "inception-v3": "inception_v3",
    "densenet201": "densenet201", "gpt2-medium": "gpt2_medium_lmhead_hf", "gpt2-large": "gpt2_large_lmhead_hf",
    "gpt2-xl": "gpt2_xl_lmhead_hf",
}

DESCRIPTIONS = {
    "resnet152": "ResNet-152 (torchvision), ImageNet 224x224",
    "vgg19": "VGG-19 (torchvision, no BN), ImageNet 224x224",
    "alexnet": "AlexNet (torchvision), ImageNet 224x224",
    "inception-v3": "Inception-v3 (torchvision, aux logits on), ImageNet 299x299",
    "densenet201": "DenseNet-201 (torchvision), ImageNet 224x224",
    "gpt2-medium": "GPT-2 medium (355M) with tied LM head, 1024 tokens",
    "gpt2-large": "GPT-2 large (774M) with tied LM head, 1024 tokens",
    "gpt2-xl": "GPT-2 XL (1.5B) with tied LM head, 1024 tokens",
}


def tensors_json(inv, bwd, fwd):
    out = []
    for t, b, f in zip(inv, bwd, fwd):
        for v in (b, f):
            if not (math.isfinite(v) and v >= 0):
                die("bad timing for %s: %r" % (t["name"], v))
        out.append({
            "name": t["name"],
            "shape": t["shape"],
            "numel": t["numel"],
            "dtype": "f32",
            "registration_index": t["reg"],
            "backward_us": r3(b),
            "forward_us": r3(f),
        })
    return out


def profile(name, description, source, batch, unit, bwd_prov, fwd_prov, opt_kind, inv, bwd, fwd):
    opt_us, opt_text = optimizer_estimate(inv, opt_kind)
    return {
        "format_version": FORMAT_VERSION,
        "name": name,
        "description": description,
        "source": source,
        "device": DEVICE,
        "framework": FRAMEWORK,
        "batch_size_per_gpu": batch,
        "sample_unit": unit,
        "timing": {
            "backward": bwd_prov,
            "forward": fwd_prov,
            "optimizer": {"status": "estimated", "method": opt_text},
        },
        "optimizer_us": r3(opt_us),
        "tensors": tensors_json(inv, bwd, fwd),
    }


def build_all(vd):
    models = {}
    measured_bwd = {}  # name -> (inv, bwd)
    for name, (esp, inv_stem, desc, batch, unit, batch_note, opt) in MEASURED.items():
        notes = []
        if inv_stem is not None:
            inv = read_inventory(vd, inv_stem)
            bwd, notes = measured_backward(vd, esp, inv)
            size_src = "tensor inventory: profiles/validation/inventory_%s.csv" % inv_stem
        else:
            shape_fn = {"lstm": lstm_shape, "ncf": ncf_shape, "ugatit": ugatit_shape}[name]
            inv, fallback = inventory_from_espresso(vd, esp, shape_fn)
            gaps = [e["gap"] for e in read_espresso(vd, esp)]
            gaps[0] = first_gap_estimate(gaps)
            bwd = gaps
            size_src = ("tensor names/numel: the Espresso CSV itself (no inventory); shapes inferred from "
                        "the layer definitions in Espresso's example code%s; registration_index = reverse "
                        "gradient-ready order (an approximation: the true named_parameters() order is not "
                        "in the source)" % ("" if not fallback else
                                            "; shape [numel] for %s (ambiguous)" % ", ".join(fallback)))
        override = None
        method = ("measured per-tensor gradient-ready gaps (Espresso gap_us_since_prev_ready, one V100 32GB, "
                  "PyTorch 1.8), mapped to tensors by position in gradient-ready order; " + FIRST_GAP_TEXT
                  + " (%.1f us)" % bwd[0])
        fwd_text = FORWARD_TEXT
        if name == "ugatit":
            big = max(range(len(bwd)), key=lambda i: bwd[i])
            med = statistics.median(bwd)
            override = {big: med}
            method += ("; note: the %.0f us gap before %s is the switch from the discriminator update to the "
                       "generator update (D optimizer step, generator forward, losses), not backward compute of "
                       "that layer; it is kept as measured because gradients wait through it"
                       % (bwd[big], inv[big]["name"]))
            fwd_text += ("; for U-GAT-IT the %.0f us D->G switch gap of %s is replaced by the median gap "
                         "(%.1f us) before halving" % (bwd[big], inv[big]["name"], med))
        if name == "ncf":
            method += ("; note: Espresso's NCF trace has all four embedding gradients ready first and "
                       "only 79 us between first and last gradient, so it reflects hook order rather than "
                       "the layer-by-layer backward of the model; use with care")
        fwd = forward_from_backward(inv, bwd, override)
        source = "; ".join([size_src,
                            "backward timings: %s, via profiles/validation/espresso_v100_readygap_%s.csv"
                            % (ESPRESSO_SRC, esp),
                            batch_note] + notes)
        models[name] = profile(name, desc, source, batch, unit,
                               {"status": "measured", "method": method},
                               {"status": "estimated", "method": fwd_text},
                               opt, inv, bwd, fwd)
        measured_bwd[name] = (inv, bwd)

    def total(name):
        return sum(measured_bwd[name][1])

    for name in ESTIMATED:
        inv = read_inventory(vd, INV_STEM[name])
        size_src = "tensor inventory: profiles/validation/inventory_%s.csv" % INV_STEM[name]
        if name == "resnet152":
            src = "resnet101"
            ratio = TORCHVISION_GFLOPS[name] / TORCHVISION_GFLOPS[src]
            tot = total(src) * ratio
            src_inv = measured_bwd[src][0]
            blocks = {}
            for t in src_inv:
                p = t["name"].split(".")
                if p[0].startswith("layer"):
                    blocks[p[0]] = max(blocks.get(p[0], 0), int(p[1]) + 1)
            bwd = analog_backward([t["name"] for t in src_inv], measured_bwd[src][1], inv,
                                  resnet_analog(blocks), tot)
            method = ("estimated from measured ResNet-101 (Espresso): each tensor takes the measured gap of the "
                      "same-named tensor of ResNet-101 (extra layer2/layer3 bottleneck blocks cycle through "
                      "ResNet-101's non-first blocks of that stage), then all gaps are scaled so the total equals "
                      "ResNet-101's total x GFLOPs ratio %.2f/%.2f (%s) = %.1f ms"
                      % (TORCHVISION_GFLOPS[name], TORCHVISION_GFLOPS[src], TORCHVISION_CITE, tot / 1e3))
            batch, unit, opt = 32, "images", "sgd_momentum"
            batch_note = "batch 32 per GPU assumed (the batch of the measured ResNet-101 profile it is scaled from)"
        elif name == "vgg19":
            src = "vgg16"
            ratio = TORCHVISION_GFLOPS[name] / TORCHVISION_GFLOPS[src]
            tot = total(src) * ratio
            src_inv = measured_bwd[src][0]
            bwd = analog_backward([t["name"] for t in src_inv], measured_bwd[src][1], inv, vgg19_analog, tot)
            method = ("estimated from measured VGG-16 (Espresso): each tensor takes the measured gap of the tensor "
                      "at the same place in VGG-16 (same stage and position in stage; the 4th conv of stages 3-5 "
                      "takes the 3rd conv's gap), then all gaps are scaled so the total equals VGG-16's total x "
                      "GFLOPs ratio %.2f/%.2f (%s) = %.1f ms"
                      % (TORCHVISION_GFLOPS[name], TORCHVISION_GFLOPS[src], TORCHVISION_CITE, tot / 1e3))
            batch, unit, opt = 32, "images", "sgd_momentum"
            batch_note = "batch 32 per GPU assumed (the batch of the measured VGG-16 profile it is scaled from)"
        elif name in ("alexnet", "inception-v3", "densenet201"):
            src = "resnet50"
            ratio = TORCHVISION_GFLOPS[name] / TORCHVISION_GFLOPS[src]
            tot = total(src) * ratio
            macs_fn = {"alexnet": alexnet_macs, "inception-v3": inception_v3_macs,
                       "densenet201": densenet201_macs}[name]
            bwd, macs = flops_backward(inv, macs_fn, tot)
            method = ("estimated: total = measured ResNet-50 backward (Espresso, incl. first-gap estimate) x GFLOPs "
                      "ratio %.2f/%.2f (%s) = %.2f ms; distributed as %.0f us per tensor plus the rest in "
                      "proportion to the forward multiply-adds of the tensor's layer (conv weight numel x output "
                      "H x W, linear weight numel; bias/BN tensors get only the floor). Per-layer MACs computed "
                      "here sum to %.2f GMAC/image (published %.2f). FLOP scaling ignores memory-bound layers, so "
                      "it likely underestimates DenseNet-201 and Inception-v3 (many small layers)"
                      % (TORCHVISION_GFLOPS[name], TORCHVISION_GFLOPS[src], TORCHVISION_CITE, tot / 1e3,
                         SMALL_TENSOR_FLOOR_US, macs / 1e9, TORCHVISION_GFLOPS[name]))
            batch, unit, opt = 32, "images", "sgd_momentum"
            batch_note = ("batch 32 per GPU assumed (the batch of the measured ResNet-50 profile it is scaled "
                          "from)")
        else:  # gpt2-medium / large / xl
            src = "gpt2"
            src_inv = measured_bwd[src][0]
            f_src = gpt2_flops_per_token(src_inv)
            f_tgt = gpt2_flops_per_token(inv)
            tot = total(src) * f_tgt / f_src
            d, vocab, n_layer, n_nonemb = gpt2_dims(inv)
            bwd = analog_backward([t["name"] for t in src_inv], measured_bwd[src][1], inv,
                                  gpt2_analog(n_layer), tot)
            method = ("estimated from measured GPT-2 small (Espresso): block L's tensors take the measured gaps "
                      "of the same tensors in GPT-2 block round(L*11/(%d-1)); ln_f/wte/wpe map to themselves; then "
                      "all gaps are scaled so the total equals GPT-2 small's total x the ratio of training FLOPs "
                      "per token, 2N + 2 n_layer n_ctx d_model + 2 d_model n_vocab (Kaplan et al. 2020, Table 1, "
                      "plus the tied LM head; N = non-embedding parameters from the inventory, n_ctx=1024): "
                      "%.3g / %.3g = x%.2f -> %.1f ms at the same batch"
                      % (n_layer, f_tgt, f_src, f_tgt / f_src, tot / 1e3))
            batch, unit, opt = 4, "sequences", "adam"
            batch_note = ("batch 4 sequences x 1024 tokens per GPU assumed (same as the measured GPT-2 small "
                          "run it is scaled from); for the larger models this batch may not fit a 32 GB V100 "
                          "in FP32 without activation checkpointing")
        fwd = forward_from_backward(inv, bwd)
        source = "; ".join([size_src,
                            "timings scaled from the measured %s profile (%s) by published FLOP counts" % (src, ESPRESSO_SRC),
                            batch_note])
        models[name] = profile(name, DESCRIPTIONS[name], source, batch, unit,
                               {"status": "estimated", "method": method},
                               {"status": "estimated", "method": FORWARD_TEXT},
                               opt, inv, bwd, fwd)
    return models


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo_root = os.path.normpath(os.path.join(here, "..", ".."))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--validation-data", default=os.path.join(repo_root, "profiles", "validation"),
                    help="directory holding the validation-data CSVs (default: profiles/validation "
                         "relative to the repository root)")
    ap.add_argument("--out", default=os.path.join(repo_root, "profiles", "models"),
                    help="output directory (default: profiles/models)")
    args = ap.parse_args()
    vd = os.path.normpath(args.validation_data)
    if not os.path.isdir(vd):
        die("validation data directory not found: %s" % vd)
    models = build_all(vd)
    os.makedirs(args.out, exist_ok=True)
    for name in sorted(models):
        path = os.path.join(args.out, name + ".json")
        text = json.dumps(models[name], indent=2, ensure_ascii=False) + "\n"
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        m = models[name]
        bwd = sum(t["backward_us"] for t in m["tensors"])
        print("%-13s %4d tensors %12d elements  backward %9.3f ms  optimizer %7.3f ms  (%s)"
              % (name, len(m["tensors"]), sum(t["numel"] for t in m["tensors"]), bwd / 1e3,
                 m["optimizer_us"] / 1e3, m["timing"]["backward"]["status"]))


if __name__ == "__main__":
    main()
