#!/usr/bin/env python3
"""Records a Syncopate model profile (profiles/models/*.json schema, format_version 1) from a
PyTorch nn.Module: parameter tensors in gradient-ready order with their per-tensor gap in
backward, per-layer forward times, the optimizer step, and the batch size.

How it measures (one GPU, or the CPU when no GPU is present):
- Gradient-ready times: a hook on every parameter's AccumulateGrad node (via
  `Tensor.register_post_accumulate_grad_hook`) records a CUDA event on the current stream the
  moment that parameter's gradient is written; the gap between consecutive events is
  `backward_us`, and the first tensor's gap is measured from an event recorded right after the
  loss is computed (so it includes the loss's backward and the last layer's).
- Forward times: a forward hook on every module that owns parameters records an event when it
  finishes; the time since the previous such event (including parameter-less work in between,
  such as activations and pooling) is that module's, split among its parameters by element
  count, and the work after the last one (the loss) joins the last, so the per-tensor forward
  times add up to the whole forward pass.
- Optimizer: events around `optimizer.step()` (SGD with momentum unless --optimizer adam).
- Each quantity is the median over `--iterations` measured iterations after `--warmup`.
On the CPU, `time.perf_counter_ns` replaces CUDA events.

Usage:
  python3 profiles/capture/capture_profile.py --torchvision resnet50 --batch-size 32 --out resnet50-h100.json --device-name h100-sxm5-80gb
  python3 profiles/capture/capture_profile.py --hf bert-base-uncased --task sequence-classification --seq-len 128 --batch-size 32 --out bert.json
"""

import argparse
import json
import math
import statistics
import sys
import time


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--torchvision", metavar="NAME", help="a torchvision.models constructor, e.g. resnet50")
    source.add_argument("--hf", metavar="NAME_OR_PATH", help="a Hugging Face model id or local path (transformers)")
    p.add_argument("--task", default="sequence-classification",
                   choices=["sequence-classification", "causal-lm", "masked-lm", "question-answering"],
                   help="the Hugging Face head to train (default: sequence-classification)")
    p.add_argument("--hf-from-config", action="store_true",
                   help="build the HF model from its config with random weights (no weight download); "
                        "a bare model type such as bert or gpt2 needs no download at all")
    p.add_argument("--batch-size", type=int, required=True, help="samples per GPU")
    p.add_argument("--image-size", type=int, default=224, help="torchvision input height and width")
    p.add_argument("--seq-len", type=int, default=128, help="Hugging Face input length in tokens")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    p.add_argument("--amp", action="store_true", help="mixed precision (autocast to fp16)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--device-name", default=None,
                   help="device profile name the timings belong to (e.g. h100-sxm5-80gb); default: from the GPU name")
    p.add_argument("--name", default=None, help="the profile's name (default: the model's)")
    p.add_argument("--out", required=True, help="output JSON path")
    args = p.parse_args(argv)
    if args.batch_size < 1 or args.iterations < 1 or args.warmup < 0:
        p.error("--batch-size and --iterations must be ≥ 1, --warmup ≥ 0")
    return args


class Clock:
    """CUDA events on a GPU, perf_counter on the CPU; `mark()` returns an opaque mark and
    `elapsed_us(a, b)` the time between two marks, after `sync()`."""

    def __init__(self, torch, device):
        self.torch = torch
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter_ns()

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def elapsed_us(self, a, b):
        if self.cuda:
            return a.elapsed_time(b) * 1e3
        return (b - a) / 1e3


def build(torch, args, device):
    """The model, a function producing (inputs, loss_fn) for one batch, the sample unit, and a
    description."""
    if args.torchvision:
        import torchvision

        constructor = getattr(torchvision.models, args.torchvision, None)
        if constructor is None:
            raise SystemExit(f"error: torchvision.models has no `{args.torchvision}`")
        kwargs = {"aux_logits": True, "init_weights": False} if args.torchvision == "inception_v3" else {}
        model = constructor(weights=None, **kwargs).to(device)
        size = args.image_size
        images = torch.randn(args.batch_size, 3, size, size, device=device)
        labels = torch.randint(0, 1000, (args.batch_size,), device=device)

        def loss():
            out = model(images)
            if isinstance(out, tuple) or hasattr(out, "logits"):
                out = out[0] if isinstance(out, tuple) else out.logits
            return torch.nn.functional.cross_entropy(out, labels)

        return model, loss, "images", f"{args.torchvision} (torchvision), {size}x{size}"
    import transformers

    heads = {
        "sequence-classification": transformers.AutoModelForSequenceClassification,
        "causal-lm": transformers.AutoModelForCausalLM,
        "masked-lm": transformers.AutoModelForMaskedLM,
        "question-answering": transformers.AutoModelForQuestionAnswering,
    }
    head = heads[args.task]
    if args.hf_from_config:
        # A bare model type ("bert", "gpt2") gives the library's default configuration, which
        # is the base model's architecture (bert-base-uncased, GPT-2 small), with no download:
        # GPU machines are often offline.
        if args.hf in transformers.CONFIG_MAPPING:
            config = transformers.AutoConfig.for_model(args.hf)
        else:
            config = transformers.AutoConfig.from_pretrained(args.hf)
        model = head.from_config(config)
    else:
        model = head.from_pretrained(args.hf)
    model = model.to(device)
    vocab = model.config.vocab_size
    tokens = torch.randint(0, vocab, (args.batch_size, args.seq_len), device=device)
    if args.task == "question-answering":
        # Answer spans as SQuAD fine-tuning has them: a start and an end position per sequence.
        start = torch.randint(0, args.seq_len, (args.batch_size,), device=device)
        end = torch.clamp(start + 8, max=args.seq_len - 1)
        labels = {"start_positions": start, "end_positions": end}
    elif args.task == "sequence-classification":
        labels = {"labels": torch.randint(0, model.config.num_labels, (args.batch_size,), device=device)}
    else:
        labels = {"labels": tokens}

    def loss():
        return model(input_ids=tokens, **labels).loss

    return model, loss, "sequences", f"{args.hf} ({args.task}, transformers), {args.seq_len} tokens"


def capture(argv):
    args = parse_args(argv)
    import torch

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model, compute_loss, unit, description = build(torch, args, device)
    model.train()
    clock = Clock(torch, device)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    registration = {id(p): i for i, (_, p) in enumerate(named)}
    optimizer = (torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9) if args.optimizer == "sgd"
                 else torch.optim.Adam(model.parameters(), lr=1e-4))
    scaler = torch.amp.GradScaler(device.type) if args.amp else None

    # Per iteration: the order parameters' gradients became ready, with their marks.
    ready = []
    for _, p in named:
        p.register_post_accumulate_grad_hook(lambda param: ready.append((registration[id(param)], clock.mark())))

    # Forward marks per parameterized leaf module, in execution order.
    owners = {}
    for module_name, module in model.named_modules():
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        if own:
            owners[module] = [registration[id(p)] for p in own]
    forward = []

    def post(module, _inputs, _output):
        forward.append((module, "end", clock.mark()))

    for module in owners:
        module.register_forward_hook(post)

    samples = []
    for step in range(args.warmup + args.iterations):
        ready.clear()
        forward.clear()
        optimizer.zero_grad(set_to_none=True)
        start = clock.mark()
        with torch.autocast(device.type, enabled=args.amp):
            loss = compute_loss()
        loss_done = clock.mark()
        (scaler.scale(loss) if scaler else loss).backward()
        backward_done = clock.mark()
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        step_done = clock.mark()
        clock.sync()
        if step < args.warmup:
            continue
        # Backward: gaps between consecutive gradient-ready marks.
        order, gaps, previous = [], [], loss_done
        seen = set()
        for index, mark in ready:
            if index in seen:  # a shared (tied) parameter accumulates twice: keep the last
                position = order.index(index)
                order.pop(position)
                gaps.pop(position)
            seen.add(index)
            order.append(index)
            gaps.append(max(clock.elapsed_us(previous, mark), 0.0))
            previous = mark
        # Forward: each parameterized module's span, plus the gap since the previous module's
        # end (parameter-less work in between), split over its parameters by element count.
        forward_us = {i: 0.0 for i in range(len(named))}

        def attribute(params, span):
            total = sum(named[i][1].numel() for i in params)
            for i in params:
                forward_us[i] += span * named[i][1].numel() / total

        previous_end, last_params = start, None
        for module, kind, mark in forward:
            if kind == "end":
                attribute(owners[module], clock.elapsed_us(previous_end, mark))
                previous_end, last_params = mark, owners[module]
        # Work after the last parameterized module (the head's activation, the loss) joins it.
        if last_params:
            attribute(last_params, max(clock.elapsed_us(previous_end, loss_done), 0.0))
        samples.append({
            "order": order,
            "backward": dict(zip(order, gaps)),
            "forward": forward_us,
            "optimizer": clock.elapsed_us(backward_done, step_done),
        })

    reference = samples[-1]["order"]
    if len(reference) != len(named):
        missing = sorted(set(range(len(named))) - set(reference))
        raise SystemExit(f"error: {len(missing)} parameters never received a gradient, e.g. "
                         f"{named[missing[0]][0]}; freeze them (requires_grad=False) or fix the loss")
    median = statistics.median
    tensors = []
    for index in reference:
        name, p = named[index]
        shape = list(p.shape) or [1]
        tensors.append({
            "name": name,
            "shape": shape,
            "numel": math.prod(shape),
            "dtype": "f32",
            "registration_index": index,
            "backward_us": round(median(s["backward"].get(index, 0.0) for s in samples), 3),
            "forward_us": round(median(s["forward"][index] for s in samples), 3),
        })
    device_name = args.device_name or default_device_name(torch, device)
    method = (f"{'CUDA events' if device.type == 'cuda' else 'perf_counter'}, median of {args.iterations} "
              f"iterations after {args.warmup} warm-up, batch {args.batch_size}"
              f"{', autocast fp16' if args.amp else ''}, PyTorch {torch.__version__}")
    profile = {
        "format_version": 1,
        "name": args.name or (args.torchvision or args.hf.rstrip("/").split("/")[-1]),
        "description": description,
        "source": f"recorded by profiles/capture/capture_profile.py {' '.join(argv)}",
        "device": device_name,
        "framework": f"PyTorch {torch.__version__}",
        "batch_size_per_gpu": args.batch_size,
        "sample_unit": unit,
        "timing": {
            "backward": {"status": "measured", "method": "post-accumulate-grad hooks, " + method},
            "forward": {"status": "measured",
                        "method": "forward hooks on parameterized modules, parameter-less work attributed to the "
                                  "next parameterized module, split by element count; " + method},
            "optimizer": {"status": "measured", "method": f"{args.optimizer} step, " + method},
        },
        "optimizer_us": round(median(s["optimizer"] for s in samples), 3),
        "tensors": tensors,
    }
    with open(args.out, "w") as f:
        json.dump(profile, f, indent=2)
        f.write("\n")
    total_bwd = sum(t["backward_us"] for t in tensors) / 1e3
    total_fwd = sum(t["forward_us"] for t in tensors) / 1e3
    print(f"wrote {args.out}: {len(tensors)} tensors, forward {total_fwd:.2f} ms, backward {total_bwd:.2f} ms, "
          f"optimizer {profile['optimizer_us'] / 1e3:.2f} ms on {device_name}", file=sys.stderr)


def default_device_name(torch, device):
    """A device-profile-like name from the GPU's marketing name (e.g. "NVIDIA H100 80GB HBM3" →
    "nvidia-h100-80gb-hbm3"); a CPU run must name its host profile with --device-name."""
    if device.type != "cuda":
        raise SystemExit("error: on the CPU, name the host's device profile with --device-name "
                         "(e.g. one measured by `syncopate profile --backend host`)")
    raw = torch.cuda.get_device_name(device)
    return "-".join("".join(c.lower() if c.isalnum() else " " for c in raw).split())


if __name__ == "__main__":
    capture(sys.argv[1:])
