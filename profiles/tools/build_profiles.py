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
  * each profile's `arithmetic` and per-tensor `uses_per_sample` (forward multiply-adds), from which
    the time before the first gradient is estimated and the batch checked against the device's
    FP32 peak (profiles/devices/v100-sxm2-32gb.json), the rule `syncopate list models --check` applies.
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

def first_gradient_us(arith, span_us, batch, reference):
    """Backward time before the first gradient is ready, which a gradient-ready trace cannot see:
    the head's backward FLOPs at the rate the trace shows after the first gradient, plus the
    small-tensor floor for the loss's own kernels. When the rest of the trace holds less than a
    tenth of the backward FLOPs (NCF, whose first ready gradients are its input embeddings) it
    says nothing about the rate, and the reference rate is used instead. Returns (us, text)."""
    f, h = arith["forward_macs"], arith["head_macs"]
    head_flops = 4 * h * batch  # backward = input gradient + weight gradient = 2 x forward
    if 10 * (f - h) >= f:
        rate = 4 * (f - h) * batch / span_us
        how = "the trace's own rate after the first gradient, %.2f TFLOP/s" % (rate / 1e6)
    else:
        rate = reference["rate"]
        how = ("the reference rate %.2f TFLOP/s (the trace after the first gradient holds less than a "
               "tenth of the FLOPs, so it says nothing about the rate; %s)" % (rate / 1e6, reference["text"]))
    us = head_flops / rate + SMALL_TENSOR_FLOOR_US
    text = ("a gradient-ready trace starts at the first ready gradient, so the time before it is "
            "estimated from FLOPs: backward of the head (%s: %.4g GFLOP per iteration = 4 x %d MACs per "
            "sample x batch %d) at %s, plus %.0f us for the loss's own kernels = %.1f us"
            % (", ".join(arith["head"]), head_flops / 1e9, h, batch, how, SMALL_TENSOR_FLOOR_US, us))
    return us, text


def measured_backward(vd, esp_stem, inv):
    """Per-tensor gaps, mapped to the inventory by position (bwd order). Returns (gaps, notes);
    gaps[0] is Espresso's 0 (the first ready gradient), to be replaced by first_gradient_us."""
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
    return [e["gap"] for e in esp], notes

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


def flops_backward(inv, macs, total):
    """floor + share of (total - n*floor) proportional to the tensor's layer MACs."""
    rest = total - SMALL_TENSOR_FLOOR_US * len(inv)
    if rest <= 0:
        die("total backward too small for the per-tensor floor")
    s = sum(macs)
    return [SMALL_TENSOR_FLOOR_US + rest * m / s for m in macs]


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
# Arithmetic: forward multiply-adds per sample, what `syncopate list models --check` recomputes
# --------------------------------------------------------------------------------------------
# A tensor's `uses_per_sample` is how many forward multiply-adds each of its elements takes part in
# per sample: a conv weight's output height x width, a linear weight's tokens per sample, 0 for
# lookups, norms and biases (element-wise work is not counted). Forward MACs per sample = sum of
# numel x uses_per_sample + `parameter_free_macs_per_sample` (attention's Q K^T and P V). The
# check counts a training iteration as 3 x forward (backward = input + weight gradients).

def is_weight_of_conv_or_linear(t):
    return t["name"].endswith("weight") and len(t["shape"]) in (2, 4)


def resnet_hw(name):
    # torchvision ResNet (v1.5: the stride sits on the 3x3 conv, so block 0's conv1 still sees
    # the previous stage's resolution); 224x224 input, stem output 112.
    p = name.split(".")
    if p[0] == "conv1":
        return 112
    if p[0] == "fc":
        return 1
    stage, block = int(p[0][len("layer"):]), int(p[1])
    out = {1: 56, 2: 28, 3: 14, 4: 7}[stage]
    if block == 0 and p[2] == "conv1":
        return {1: 56, 2: 56, 3: 28, 4: 14}[stage]
    return out


def vgg_hw(stages):
    def hw(name):
        p = name.split(".")
        if p[0] == "classifier":
            return 1
        for s, convs in enumerate(stages):
            if int(p[1]) in convs:
                return 224 >> s
        die("vgg: no spatial size for %s" % name)
    return hw


def alexnet_hw(name):
    out_hw = {"features.0": 55, "features.3": 27, "features.6": 13, "features.8": 13, "features.10": 13}
    return out_hw.get(layer_of(name), 1)


def densenet201_hw(n):
    if n.startswith("classifier"):
        return 1
    if n.startswith("features.conv0"):
        return 112
    for k, size in (("denseblock1", 56), ("transition1", 56), ("denseblock2", 28),
                    ("transition2", 28), ("denseblock3", 14), ("transition3", 14),
                    ("denseblock4", 7)):
        if n.startswith("features." + k + "."):
            return size
    die("densenet201: no spatial size for %s" % n)


def inception_v3_hw(n):
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
            return hw
    die("inception-v3: no spatial size for %s" % n)


def cnn_uses(hw_of):
    return lambda t: hw_of(t["name"]) ** 2 if is_weight_of_conv_or_linear(t) else 0


VGG16_STAGES = [[0, 2], [5, 7], [10, 12, 14], [17, 19, 21], [24, 26, 28]]
VGG19_STAGES = [[0, 2], [5, 7], [10, 12, 14, 16], [19, 21, 23, 25], [28, 30, 32, 34]]

CNN_HW = {
    "resnet50": resnet_hw, "resnet101": resnet_hw, "resnet152": resnet_hw,
    "vgg16": vgg_hw(VGG16_STAGES), "vgg19": vgg_hw(VGG19_STAGES),
    "alexnet": alexnet_hw, "densenet201": densenet201_hw, "inception-v3": inception_v3_hw,
}
CNN_HEAD = {"resnet50": "fc.weight", "resnet101": "fc.weight", "resnet152": "fc.weight",
            "vgg16": "classifier.6.weight", "vgg19": "classifier.6.weight",
            "alexnet": "classifier.6.weight", "densenet201": "classifier.weight",
            "inception-v3": "fc.weight"}
CNN_INPUT = {"inception-v3": 299}

BERT_SEQ = 384   # Espresso BERT run_baseline.sh --max_seq_length=384
GPT2_SEQ = 1024  # block_size = the GPT-2 tokenizer's 1024
# AWD-LSTM main.py draws each batch's sequence length from N(70, 5) (95 %) or N(35, 5) (5 %):
# mean 0.95 x 70 + 0.05 x 35 = 68.25 tokens.
LSTM_TOKENS = 68


def count_layers(inv, prefix):
    return len({t["name"][len(prefix):].split(".")[0] for t in inv if t["name"].startswith(prefix)})


def attention_macs(seq, d_model, n_layer):
    # Q K^T and P V: each seq x seq x d_model multiply-adds per layer; full matrices (HF computes
    # GPT-2's causal scores in full and masks them).
    return 2 * seq * seq * d_model * n_layer


def bert_arith(inv):
    d = next(t["numel"] for t in inv if t["name"].endswith("attention.output.LayerNorm.weight"))
    n_layer = count_layers(inv, "bert.encoder.layer.")
    return {
        "uses": lambda t: BERT_SEQ if (len(t["shape"]) == 2 and not t["name"].startswith("bert.embeddings.")) else 0,
        "parameter_free": attention_macs(BERT_SEQ, d, n_layer),
        "head": ["qa_outputs.weight"],
        "method": ("every encoder linear weight and qa_outputs multiply-add once per token, %d tokens per "
                   "sequence (--max_seq_length); embeddings are lookups; parameter_free = attention's Q K^T "
                   "and P V, 2 x %d^2 x d_model %d x %d layers; LayerNorm, GELU, softmax and biases not "
                   "counted. Head (backward before the first gradient): qa_outputs"
                   % (BERT_SEQ, BERT_SEQ, d, n_layer)),
    }


def gpt2_arith(inv):
    d = next(t["numel"] for t in inv if t["name"] == "transformer.ln_f.weight")
    n_layer = count_layers(inv, "transformer.h.")

    def uses(t):
        if t["name"] == "transformer.wte.weight":
            return GPT2_SEQ
        return GPT2_SEQ if (len(t["shape"]) == 2 and t["name"].startswith("transformer.h.")) else 0
    return {
        "uses": uses,
        "parameter_free": attention_macs(GPT2_SEQ, d, n_layer),
        "head": ["transformer.wte.weight"],
        "method": ("every block's Conv1D weight multiply-adds once per token, %d tokens per sequence; "
                   "transformer.wte.weight counts its use as the tied LM head (d_model x vocabulary per "
                   "token; the embedding lookup is no multiply-add); wpe is a lookup; parameter_free = "
                   "attention's Q K^T and P V over full %d x %d matrices (HF GPT-2 masks after computing "
                   "them), 2 x %d^2 x d_model %d x %d layers. The total equals the Megatron-LM count "
                   "24 l h^2 + 4 l s h + 2 h V forward FLOPs per token (Narayanan et al., SC'21) up to "
                   "the biases. Head (backward before the first gradient, ln_f): the LM head"
                   % (GPT2_SEQ, GPT2_SEQ, GPT2_SEQ, GPT2_SEQ, d, n_layer)),
    }


def lstm_arith(inv):
    return {
        "uses": lambda t: LSTM_TOKENS if len(t["shape"]) == 2 else 0,
        "parameter_free": 0,
        "head": ["encoder.weight"],
        "method": ("every LSTM weight (4 gates x hidden x input or hidden) and the tied decoder "
                   "(encoder.weight, 33278-word vocabulary: SplitCrossEntropyLoss has no splits below "
                   "75000 words, so it computes the full softmax) multiply-add once per token; %d tokens "
                   "per sequence = the mean of main.py's random sequence length (N(70, 5) 95 %% of the "
                   "time, N(35, 5) otherwise); the embedding lookup is no multiply-add. Head (backward "
                   "before decoder.bias, the first ready gradient): the decoder" % LSTM_TOKENS),
    }


def ncf_arith(inv):
    matmul = [t["name"] for t in inv if len(t["shape"]) == 2 and "embed" not in t["name"]]
    return {
        "uses": lambda t: 1 if t["name"] in matmul else 0,
        "parameter_free": 0,
        "head": matmul,
        "method": ("the MLP and final linear weights multiply-add once per user-item pair; the four "
                   "embeddings are lookups. Head: every linear layer, because the trace's first ready "
                   "gradients are the input embeddings, whose gradients exist only after the whole MLP "
                   "backward; the embeddings' dense gradient writes (memory-bound) are not counted"),
    }


# U-GAT-IT per iteration (Espresso UGATIT.py train()): each generator runs 4 times (once in the D
# update, whose loss is not detached from the generators, and 3 times in the G update: translation,
# cycle, identity) and each discriminator 3 times (real and fake in the D update, fake in the G
# update), each with backward.
UGATIT_GEN_RUNS = 4
UGATIT_DIS_RUNS = 3


def ugatit_uses(t):
    net, rest = t["name"].split(".", 1)
    # Spectral norm renames the discriminators' weights to `weight_orig`.
    if rest.rsplit(".", 1)[-1] not in ("weight", "weight_orig") or len(t["shape"]) not in (2, 4):
        return 0
    if net.startswith("gen"):
        # 256x256 input: DownBlock 7x7 at 256, stride-2 3x3s to 128 and 64; bottleneck, CAM 1x1
        # and UpBlock1 at 64; UpBlock2 upsamples to 128 and 256; FC/gamma/beta once per image.
        hw = 1
        for prefix, size in (("DownBlock.1.", 256), ("DownBlock.5.", 128), ("DownBlock.", 64),
                             ("conv1x1.", 64), ("UpBlock1_", 64), ("UpBlock2.2.", 128),
                             ("UpBlock2.7.", 256), ("UpBlock2.11.", 256)):
            if rest.startswith(prefix):
                hw = size
                break
        return UGATIT_GEN_RUNS * hw * hw
    # Discriminators (networks.py, reflection pad 1 before every 4x4 conv): stride-2 convs halve
    # 256 to 128, 64, ...; the last model conv has stride 1 (s -> s - 1), the CAM 1x1 keeps it and
    # the final conv takes one more off. Global (n_layers 7): 6 model convs; local (5): 4.
    n_model = 6 if net.startswith("disG") else 4
    last_stride2 = 256 >> (n_model - 1)
    if rest.startswith("model."):
        k = (int(rest.split(".")[1]) - 1) // 3
        hw = 128 >> k if k < n_model - 1 else last_stride2 - 1
    elif rest.startswith("conv1x1."):
        hw = last_stride2 - 1
    elif rest.startswith("conv."):
        hw = last_stride2 - 2
    else:  # gap_fc / gmp_fc
        hw = 1
    return UGATIT_DIS_RUNS * hw * hw


def ugatit_arith(inv):
    return {
        "uses": ugatit_uses,
        "parameter_free": 0,
        "head": [inv[0]["name"]],
        "method": ("one sample = one image pair at 256x256; conv weights multiply-add output height x width "
                   "times per run, linear weights once per run; each generator runs %d times per iteration "
                   "(once in the D update, whose loss is not detached from the generators, 3 times in the G "
                   "update: translation, cycle, identity) and each discriminator %d times (real and fake in "
                   "the D update, fake in the G update), each with backward; instance/layer norms, "
                   "spectral norm and the CAM weighting not counted. Head: the first ready gradient's own "
                   "layer" % (UGATIT_GEN_RUNS, UGATIT_DIS_RUNS)),
    }


def cnn_arith(name):
    def arith(inv):
        size = CNN_INPUT.get(name, 224)
        return {
            "uses": cnn_uses(CNN_HW[name]),
            "parameter_free": 0,
            "head": [CNN_HEAD[name]],
            "method": ("every conv weight multiply-adds output height x width times per image and every "
                       "linear weight once (torchvision architecture at %dx%d input); batch norm, biases, "
                       "pooling and activations not counted. Head (backward before the first gradient): "
                       "the classifier's last linear layer" % (size, size)),
        }
    return arith


ARITH = {name: cnn_arith(name) for name in CNN_HW}
ARITH.update({"bert-base": bert_arith, "bert-large": bert_arith, "gpt2": gpt2_arith,
              "gpt2-medium": gpt2_arith, "gpt2-large": gpt2_arith, "gpt2-xl": gpt2_arith,
              "lstm": lstm_arith, "ncf": ncf_arith, "ugatit": ugatit_arith})


def arithmetic(name, inv):
    """The model's FLOP description: uses per tensor, parameter-free MACs, head tensors, totals."""
    a = ARITH[name](inv)
    uses = [a["uses"](t) for t in inv]
    a["uses_list"] = uses
    a["forward_macs"] = sum(t["numel"] * u for t, u in zip(inv, uses)) + a["parameter_free"]
    names = {t["name"] for t in inv}
    missing = [h for h in a["head"] if h not in names]
    if missing:
        die("%s: head tensors %s are not in the profile" % (name, missing))
    a["head_macs"] = sum(t["numel"] * u for t, u in zip(inv, uses) if t["name"] in a["head"])
    return a


def arithmetic_json(a, above_peak_reason=None):
    out = {
        "precision": "fp32",
        "parameter_free_macs_per_sample": a["parameter_free"],
        "head_tensors": a["head"],
        "method": (a["method"] + "; forward {:,} MACs per sample. Precision: FP32 (Espresso's scripts pass "
                   "no fp16/amp flag)".format(a["forward_macs"])),
    }
    if above_peak_reason:
        out["above_peak_reason"] = above_peak_reason
    return out


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


# --------------------------------------------------------------------------------------------
# Model catalog
# --------------------------------------------------------------------------------------------

MEASURED = {
    # name: (espresso stem, inventory stem or None, description, batch, unit, batch note, optimizer);
    # the batch is the script's where the note cites one (BATCH_FROM_SCRIPT), else assumed
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
                  "(batch_size=8, --max_seq_length=384, bert_base_config.json)", "adam"),
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


# Measured models whose batch their own Espresso script states (the others' is assumed).
BATCH_FROM_SCRIPT = {"resnet101", "vgg16", "bert-base", "gpt2", "lstm", "ugatit"}

# The rate a trace cannot show (NCF's, whose whole MLP backward precedes its first ready gradient)
# and the efficiency an inferred batch aims at: the mean rate of the traces whose batch their own
# script states and whose span after the first gradient is one plain backward pass of GEMMs and
# convolutions (VGG-16 is left out: see WINOGRAD; the LSTM is recurrent; U-GAT-IT's span includes
# an optimizer step and a forward pass).
REFERENCE_MODELS = ("resnet101", "gpt2")

WINOGRAD = ("Espresso's vgg16/main.py sets cudnn.benchmark = True, so cuDNN may run VGG's 3x3 "
            "convolutions with Winograd algorithms, which do 2.25x (F(2x2,3x3)) to 4x (F(4x4,3x3)) fewer "
            "multiplications than the direct convolution the check counts (Lavin and Gray, Fast Algorithms "
            "for Convolutional Neural Networks, CVPR 2016, report effective rates above the GPU's peak for "
            "VGG layers); the batch is the one Espresso's script states")
ABOVE_PEAK_REASON = {
    "vgg16": WINOGRAD,
    "vgg19": WINOGRAD.replace("the batch is the one Espresso's script states",
                              "VGG-19's timings are VGG-16's scaled by FLOPs"),
}


# The class of the module that registers each parameter of the Hugging Face transformers models
# (BertForQuestionAnswering, GPT2LMHeadModel), by the last components of its name: what
# torchao's float8 conversion takes is an nn.Linear (`module` in a profile's tensors). GPT-2's
# attention and MLP projections are transformers' Conv1D (pytorch_utils.Conv1D), not nn.Linear.
HF_MODULES = [
    (("query", "key", "value", "dense", "qa_outputs"), "Linear"),
    (("LayerNorm", "ln_1", "ln_2", "ln_f"), "LayerNorm"),
    (("word_embeddings", "position_embeddings", "token_type_embeddings", "wte", "wpe"), "Embedding"),
    (("c_attn", "c_proj", "c_fc"), "Conv1D"),
]


def hf_module(name):
    """The class of the module that registers parameter `name` of a transformers model."""
    owner = name.rsplit(".", 2)[-2]
    for names, cls in HF_MODULES:
        if owner in names:
            return cls
    die("no module class for %s" % name)


def tensors_json(inv, bwd, fwd, uses, modules=False):
    """The profile's tensors; with `modules`, each one's module class (transformers models)."""
    out = []
    for t, b, f, u in zip(inv, bwd, fwd, uses):
        for v in (b, f):
            if not (math.isfinite(v) and v >= 0):
                die("bad timing for %s: %r" % (t["name"], v))
        row = {"name": t["name"], "shape": t["shape"], "numel": t["numel"]}
        if u:
            row["uses_per_sample"] = u
        row.update({
            "dtype": "f32",
            "registration_index": t["reg"],
            "backward_us": r3(b),
            "forward_us": r3(f),
        })
        if modules:
            row["module"] = hf_module(t["name"])
        out.append(row)
    return out


def profile(p, inv, bwd, fwd):
    """The profile's JSON from its parts: p holds name, description, source, batch, unit, the
    timing provenances, the optimizer kind and the arithmetic."""
    opt_us, opt_text = optimizer_estimate(inv, p["optimizer"])
    return {
        "format_version": FORMAT_VERSION,
        "name": p["name"],
        "description": p["description"],
        "source": p["source"],
        "device": DEVICE,
        "framework": FRAMEWORK,
        "batch_size_per_gpu": p["batch"],
        "sample_unit": p["unit"],
        "timing": {
            "backward": p["backward"],
            "forward": p["forward"],
            "optimizer": {"status": "estimated", "method": opt_text},
            "first_gradient": p["first_gradient"],
            "batch": p["batch_provenance"],
        },
        "arithmetic": arithmetic_json(p["arithmetic"], ABOVE_PEAK_REASON.get(p["name"])),
        "optimizer_us": r3(opt_us),
        "tensors": tensors_json(inv, bwd, fwd, p["arithmetic"]["uses_list"],
                                modules=p["name"].startswith(("bert", "gpt2"))),
    }


# --------------------------------------------------------------------------------------------
# The FLOP/s check (the same rule as `syncopate list models --check`) and the batch it implies
# --------------------------------------------------------------------------------------------

# Above this fraction of the peak the check calls a profile suspicious (possible, but rare for
# whole training iterations); above 1 impossible unless the profile says why.
SUSPICIOUS = 0.70


def implied_fraction_of_peak(a, batch, bwd, fwd, peak_flops_per_us):
    """Training FLOPs per iteration (3 x forward) over forward + backward time, as a fraction of
    the device's FP32 peak."""
    return 6 * a["forward_macs"] * batch / (sum(bwd) + sum(fwd)) / peak_flops_per_us


def checked_batch(name, a, bwd, fwd, batch, reference, peak_flops_per_us):
    """The batch the timings belong to, its provenance, and a sentence for `source` when the
    stated or assumed batch is impossible (the timings would beat the device's peak)."""
    frac = implied_fraction_of_peak(a, batch, bwd, fwd, peak_flops_per_us)
    from_script = name in BATCH_FROM_SCRIPT
    if frac <= 1.0 or name in ABOVE_PEAK_REASON:
        status = "measured" if from_script else "estimated"
        how = ("stated by the Espresso script that ran the trace (the trace itself does not record it)"
               if from_script else "assumed (see source)")
        return batch, {"status": status, "method": "batch %d per GPU, %s; at this batch the timings imply "
                       "%.0f %% of the V100's FP32 peak" % (batch, how, 100 * frac)}, None
    ref_frac = reference["rate"] / peak_flops_per_us
    halvings = [batch >> k for k in range(1, batch.bit_length())]
    best = min(halvings, key=lambda b: abs(frac * b / batch - ref_frac))
    text = ("batch %d per GPU, inferred from FLOPs: at the %s batch %d the timings imply %.0f %% of the V100's "
            "FP32 peak (%.1f TFLOP/s), impossible for a model of GEMMs, for which no algorithm does fewer "
            "multiplications; the trace was therefore taken at a smaller batch (or in mixed precision, "
            "which the script does not enable). Batch %d is the halving of %d whose implied rate "
            "(%.0f %%) is closest to the reference %.0f %% (%s)"
            % (best, "script's" if from_script else "assumed", batch, 100 * frac,
               frac * peak_flops_per_us / 1e6, best, batch, 100 * frac * best / batch, 100 * ref_frac,
               reference["text"]))
    return best, {"status": "estimated", "method": text}, text


def measured_inputs(vd, name):
    """(inventory, Espresso gaps, notes, size source) of a measured model."""
    esp, inv_stem = MEASURED[name][0], MEASURED[name][1]
    if inv_stem is not None:
        inv = read_inventory(vd, inv_stem)
        gaps, notes = measured_backward(vd, esp, inv)
        return inv, gaps, notes, "tensor inventory: profiles/validation/inventory_%s.csv" % inv_stem
    shape_fn = {"lstm": lstm_shape, "ncf": ncf_shape, "ugatit": ugatit_shape}[name]
    inv, fallback = inventory_from_espresso(vd, esp, shape_fn)
    gaps = [e["gap"] for e in read_espresso(vd, esp)]
    size_src = ("tensor names/numel: the Espresso CSV itself (no inventory); shapes inferred from "
                "the layer definitions in Espresso's example code%s; registration_index = reverse "
                "gradient-ready order (an approximation: the true named_parameters() order is not "
                "in the source)" % ("" if not fallback else
                                    "; shape [numel] for %s (ambiguous)" % ", ".join(fallback)))
    return inv, gaps, [], size_src


def span_rate(name, inv, gaps):
    """FLOP/us of a measured trace after its first ready gradient, at the model's stated batch."""
    a = arithmetic(name, inv)
    return 4 * (a["forward_macs"] - a["head_macs"]) * MEASURED[name][3] / sum(gaps[1:])


def reference_rate(inputs, peak_flops_per_us):
    rates = [span_rate(n, inputs[n][0], inputs[n][1]) for n in REFERENCE_MODELS]
    rate = statistics.mean(rates)
    text = ("reference = mean rate after the first gradient of %s at their scripts' batches: %s TFLOP/s "
            "= %.0f %% of FP32 peak" % (" and ".join(REFERENCE_MODELS),
                                         " and ".join("%.2f" % (r / 1e6) for r in rates),
                                         100 * rate / peak_flops_per_us))
    return {"rate": rate, "text": text}


def finish(p, inv, rest, override, reference, peak_flops_per_us, sources):
    """Adds the time before the first gradient to the gaps after it (`rest`), derives forward,
    checks the batch against the device's peak, completes provenance and source, builds the JSON.
    `override` replaces backward gaps before forward is derived from them (U-GAT-IT)."""
    def timings(batch):
        t0, text = first_gradient_us(p["arithmetic"], sum(rest), batch, reference)
        bwd = [t0] + rest
        return bwd, forward_from_backward(inv, bwd, override), text

    bwd, fwd, _ = timings(p["batch"])
    batch, p["batch_provenance"], inferred = checked_batch(
        p["name"], p["arithmetic"], bwd, fwd, p["batch"], reference, peak_flops_per_us)
    bwd, fwd, t0_text = timings(batch)
    p["first_gradient"] = {"status": "estimated", "method": t0_text}
    frac = implied_fraction_of_peak(p["arithmetic"], batch, bwd, fwd, peak_flops_per_us)
    if inferred:
        sources.append(inferred)
    elif frac > 1.0:
        sources.append("the FLOP/s check finds %.0f %% of the V100's FP32 peak, counting direct "
                       "convolutions; why that is possible: %s" % (100 * frac, ABOVE_PEAK_REASON[p["name"]]))
    elif frac > SUSPICIOUS:
        sources.append("the FLOP/s check finds %.0f %% of the V100's FP32 peak: high but possible, "
                       "kept as measured" % (100 * frac))
    p["batch"] = batch
    p["source"] = "; ".join(sources)
    return profile(p, inv, bwd, fwd)


def build_all(vd, peak_flops_per_us):
    models = {}
    inputs = {name: measured_inputs(vd, name) for name in MEASURED}
    reference = reference_rate(inputs, peak_flops_per_us)
    measured_bwd = {}  # name -> (inv, Espresso gaps); gaps[0] is Espresso's 0 for the first gradient
    for name, (esp, _, desc, batch, unit, batch_note, opt) in MEASURED.items():
        inv, gaps, notes, size_src = inputs[name]
        a = arithmetic(name, inv)
        override = None
        method = ("measured per-tensor gradient-ready gaps (Espresso gap_us_since_prev_ready, one V100 32GB, "
                  "PyTorch 1.8), mapped to tensors by position in gradient-ready order; the first tensor's "
                  "gap is the estimated time before the first gradient (timing.first_gradient)")
        fwd_text = FORWARD_TEXT
        if name == "ugatit":
            big = max(range(len(gaps)), key=lambda i: gaps[i])
            med = statistics.median(gaps[1:])
            override = {big: med}
            method += ("; note: the %.0f us gap before %s is the switch from the discriminator update to the "
                       "generator update (D optimizer step, generator forward, losses), not backward compute of "
                       "that layer; it is kept as measured because gradients wait through it"
                       % (gaps[big], inv[big]["name"]))
            fwd_text += ("; for U-GAT-IT the %.0f us D->G switch gap of %s is replaced by the median gap "
                         "after the first gradient (%.1f us) before halving" % (gaps[big], inv[big]["name"], med))
        if name == "ncf":
            method += ("; note: Espresso's NCF trace has all four embedding gradients ready first and "
                       "only 79 us between first and last gradient, so it reflects hook order rather than "
                       "the layer-by-layer backward of the model; use with care")
        sources = [size_src,
                   "backward timings: %s, via profiles/validation/espresso_v100_readygap_%s.csv"
                   % (ESPRESSO_SRC, esp),
                   batch_note] + notes
        p = {"name": name, "description": desc, "batch": batch, "unit": unit, "optimizer": opt,
             "arithmetic": a,
             "backward": {"status": "measured", "method": method},
             "forward": {"status": "estimated", "method": fwd_text}}
        models[name] = finish(p, inv, gaps[1:], override, reference, peak_flops_per_us, sources)
        measured_bwd[name] = (inv, gaps)

    def span(name):
        return sum(measured_bwd[name][1][1:])

    for name in ESTIMATED:
        inv = read_inventory(vd, INV_STEM[name])
        a = arithmetic(name, inv)
        size_src = "tensor inventory: profiles/validation/inventory_%s.csv" % INV_STEM[name]
        if name == "resnet152":
            src = "resnet101"
            ratio = TORCHVISION_GFLOPS[name] / TORCHVISION_GFLOPS[src]
            tot = span(src) * ratio
            src_inv = measured_bwd[src][0]
            blocks = {}
            for t in src_inv:
                p = t["name"].split(".")
                if p[0].startswith("layer"):
                    blocks[p[0]] = max(blocks.get(p[0], 0), int(p[1]) + 1)
            rest = analog_backward([t["name"] for t in src_inv], measured_bwd[src][1], inv[1:],
                                   resnet_analog(blocks), tot)
            method = ("estimated from measured ResNet-101 (Espresso): each tensor after the first takes the "
                      "measured gap of the same-named tensor of ResNet-101 (extra layer2/layer3 bottleneck blocks "
                      "cycle through ResNet-101's non-first blocks of that stage), then those gaps are scaled so "
                      "their total equals ResNet-101's after its first gradient x GFLOPs ratio %.2f/%.2f (%s) = "
                      "%.1f ms; the first tensor's gap is the estimated time before the first gradient"
                      % (TORCHVISION_GFLOPS[name], TORCHVISION_GFLOPS[src], TORCHVISION_CITE, tot / 1e3))
            batch, unit, opt = 32, "images", "sgd_momentum"
            batch_note = "batch 32 per GPU assumed (the batch of the measured ResNet-101 profile it is scaled from)"
        elif name == "vgg19":
            src = "vgg16"
            ratio = TORCHVISION_GFLOPS[name] / TORCHVISION_GFLOPS[src]
            tot = span(src) * ratio
            src_inv = measured_bwd[src][0]
            rest = analog_backward([t["name"] for t in src_inv], measured_bwd[src][1], inv[1:], vgg19_analog, tot)
            method = ("estimated from measured VGG-16 (Espresso): each tensor after the first takes the measured "
                      "gap of the tensor at the same place in VGG-16 (same stage and position in stage; the 4th "
                      "conv of stages 3-5 takes the 3rd conv's gap), then those gaps are scaled so their total "
                      "equals VGG-16's after its first gradient x GFLOPs ratio %.2f/%.2f (%s) = %.1f ms; the "
                      "first tensor's gap is the estimated time before the first gradient"
                      % (TORCHVISION_GFLOPS[name], TORCHVISION_GFLOPS[src], TORCHVISION_CITE, tot / 1e3))
            batch, unit, opt = 32, "images", "sgd_momentum"
            batch_note = "batch 32 per GPU assumed (the batch of the measured VGG-16 profile it is scaled from)"
        elif name in ("alexnet", "inception-v3", "densenet201"):
            src = "resnet50"
            ratio = TORCHVISION_GFLOPS[name] / TORCHVISION_GFLOPS[src]
            tot = span(src) * ratio
            macs = [t["numel"] * u for t, u in zip(inv, a["uses_list"])]
            rest = flops_backward(inv[1:], macs[1:], tot)
            method = ("estimated: the time after the first gradient = measured ResNet-50's (Espresso) x GFLOPs "
                      "ratio %.2f/%.2f (%s) = %.2f ms, distributed over the tensors after the first as %.0f us "
                      "per tensor plus the rest in proportion to the forward multiply-adds of the tensor "
                      "(arithmetic: conv weight numel x output H x W, linear weight numel; bias/BN tensors get "
                      "only the floor); these sum to %.2f GMAC/image (published %.2f); the first tensor's gap is "
                      "the estimated time before the first gradient. FLOP scaling ignores memory-bound layers, so "
                      "it likely underestimates DenseNet-201 and Inception-v3 (many small layers)"
                      % (TORCHVISION_GFLOPS[name], TORCHVISION_GFLOPS[src], TORCHVISION_CITE, tot / 1e3,
                         SMALL_TENSOR_FLOOR_US, sum(macs) / 1e9, TORCHVISION_GFLOPS[name]))
            batch, unit, opt = 32, "images", "sgd_momentum"
            batch_note = ("batch 32 per GPU assumed (the batch of the measured ResNet-50 profile it is scaled "
                          "from)")
        else:  # gpt2-medium / large / xl
            src = "gpt2"
            src_inv = measured_bwd[src][0]
            a_src = arithmetic(src, src_inv)
            body_src = a_src["forward_macs"] - a_src["head_macs"]
            body_tgt = a["forward_macs"] - a["head_macs"]
            tot = span(src) * body_tgt / body_src
            n_layer = count_layers(inv, "transformer.h.")
            rest = analog_backward([t["name"] for t in src_inv], measured_bwd[src][1], inv[1:],
                                   gpt2_analog(n_layer), tot)
            method = ("estimated from measured GPT-2 small (Espresso): block L's tensors take the measured gaps "
                      "of the same tensors in GPT-2 block round(L*11/(%d-1)); ln_f/wte/wpe map to themselves; then "
                      "the gaps after the first are scaled so their total equals GPT-2 small's x the ratio of "
                      "forward multiply-adds per token outside the LM head (arithmetic: every block weight once "
                      "per token plus attention's Q K^T and P V): %.4g / %.4g = x%.2f -> %.1f ms at the same "
                      "batch; the first tensor's gap is the estimated time before the first gradient (the tied "
                      "LM head)" % (n_layer, body_tgt, body_src, body_tgt / body_src, tot / 1e3))
            batch, unit, opt = 4, "sequences", "adam"
            batch_note = ("batch 4 sequences x 1024 tokens per GPU assumed (same as the measured GPT-2 small "
                          "run it is scaled from); for the larger models this batch may not fit a 32 GB V100 "
                          "in FP32 without activation checkpointing")
        sources = [size_src,
                   "timings scaled from the measured %s profile (%s) by published FLOP counts" % (src, ESPRESSO_SRC),
                   batch_note]
        p = {"name": name, "description": DESCRIPTIONS[name], "batch": batch, "unit": unit, "optimizer": opt,
             "arithmetic": a,
             "backward": {"status": "estimated", "method": method},
             "forward": {"status": "estimated", "method": FORWARD_TEXT}}
        models[name] = finish(p, inv, rest, None, reference, peak_flops_per_us, sources)
    return models


def device_peak_flops_per_us(repo_root):
    """The FP32 peak of the device the profiles belong to, from its shipped device profile."""
    path = os.path.join(repo_root, "profiles", "devices", DEVICE + ".json")
    try:
        with open(path, encoding="utf-8") as f:
            tflops = json.load(f)["peak_fp32_tflops"]
    except (OSError, ValueError, KeyError) as e:
        die("%s: cannot read peak_fp32_tflops: %s" % (path, e))
    return tflops * 1e6


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
    peak = device_peak_flops_per_us(repo_root)
    models = build_all(vd, peak)
    os.makedirs(args.out, exist_ok=True)
    for name in sorted(models):
        path = os.path.join(args.out, name + ".json")
        text = json.dumps(models[name], indent=2, ensure_ascii=False) + "\n"
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        m = models[name]
        bwd = sum(t["backward_us"] for t in m["tensors"])
        print("%-13s %4d tensors %12d elements  batch %5d  backward %9.3f ms (first gradient %8.3f)  "
              "optimizer %7.3f ms  (%s)"
              % (name, len(m["tensors"]), sum(t["numel"] for t in m["tensors"]), m["batch_size_per_gpu"],
                 bwd / 1e3, m["tensors"][0]["backward_us"] / 1e3, m["optimizer_us"] / 1e3,
                 m["timing"]["backward"]["status"]))


if __name__ == "__main__":
    main()
