"""Measures what PyTorch DDP costs over plain training on one GPU, by bucket size.

Published DDP measurements show DDP several percent slower than no DDP even on one GPU, and 1 MB
buckets several percent slower than 25 MB; the simulator predicts too little of both. This script
trains one model per configuration (plain; DDP with world size 1 and bucket_cap_mb 1, 5, 25, 100;
25 with gradient_as_bucket_view; DDP's defaults, whose first bucket is 1 MiB where an explicit
bucket_cap_mb makes it the cap) from the same initial weights on the same synthetic batch, and
times their iterations round-robin, so that drift touches every configuration alike.

    python gpu/measure/ddp_overhead.py --out-dir DIR [--device cuda|cpu] [--quick] [--seconds S]

Writes DIR/ddp_overhead.json (per-iteration medians with min and max, overhead_vs_plain, DDP's
buckets) and prints `RESULT ` lines. Exit 77 when --device cuda finds no GPU, 2 for a bad argument.
"""

import datetime
import math
import statistics
import sys
import time

import measuring
from measuring import environment, precision_settings, stats_ms

torch = None  # set by main (measuring.import_torch), so that a bad flag fails before torch loads


DEFAULT = "default"  # bucket_cap_mb left out: 25 MiB buckets, the first one 1 MiB

# (name, bucket_cap_mb, gradient_as_bucket_view); bucket_cap_mb None is plain training without DDP.
CONFIGS = (("plain", None, False), ("ddp_cap1mb", 1, False), ("ddp_cap5mb", 5, False),
           ("ddp_cap25mb", 25, False), ("ddp_cap100mb", 100, False), ("ddp_cap25mb_gav", 25, True),
           ("ddp_default", DEFAULT, False))
FULL = {"warmup": 10, "iterations": 20, "repeats": 5}
QUICK = {"warmup": 2, "iterations": 3, "repeats": 2}
LEARNING_RATE, MOMENTUM = 1e-3, 0.9


# --- models: each returns (module, loss function, inputs, targets, description) ---

def bert_like_class():
    """A BERT-base-shaped encoder from torch.nn alone (no transformers, nothing to download)."""

    class BertLikeModel(torch.nn.Module):
        def __init__(self, vocab, d_model, heads, ff, layers, seq):
            super().__init__()
            self.tokens = torch.nn.Embedding(vocab, d_model)
            self.positions = torch.nn.Embedding(seq, d_model)
            layer = torch.nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.1, activation="gelu",
                                                     batch_first=True)
            self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.norm = torch.nn.LayerNorm(d_model)
            self.head = torch.nn.Linear(d_model, vocab)

        def forward(self, ids):
            positions = torch.arange(ids.shape[1], device=ids.device)
            return self.head(self.norm(self.encoder(self.tokens(ids) + self.positions(positions))))

    return BertLikeModel


def tiny_convnet(classes):
    """A small residual CNN, for --quick where torchvision is not installed."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, channels):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels),
                                      nn.ReLU(), nn.Conv2d(channels, channels, 3, padding=1, bias=False),
                                      nn.BatchNorm2d(channels))

        def forward(self, x):
            return torch.relu(x + self.body(x))

    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), Block(16),
                         nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
                         Block(32), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes))


class ModelSpec:
    """How to build one model type and its synthetic batch."""

    def __init__(self, name, what, build, batch, settings):
        self.name, self.what, self.build, self.batch, self.settings = name, what, build, batch, settings


def vision_spec(arch, batch, image, quick):
    try:
        import torchvision
    except ImportError:
        if not quick:
            raise
        torchvision = None
    classes = 1000
    if torchvision is None:
        name, build = "tiny_convnet", lambda: tiny_convnet(classes)
        what = (f"a small residual CNN built by hand ({arch} wanted, but torchvision is not installed), batch "
                f"{batch}, {image}x{image} images")
        source = "hand-built (torchvision missing)"
    else:
        name, build = arch, lambda: getattr(torchvision.models, arch)(weights=None)
        what = f"torchvision {arch}, batch {batch}, {image}x{image} images, fp32 (TF32 off)"
        source = f"torchvision {torchvision.__version__}"

    def batch_fn(device):
        return (torch.randn(batch, 3, image, image, device=device),
                torch.randint(0, classes, (batch,), device=device),
                torch.nn.functional.cross_entropy)

    return ModelSpec(name, what, build, batch_fn,
                     {"batch": batch, "image": image, "classes": classes, "source": source, "dtype": "float32"})


def bert_spec(name, layers, d_model, heads, ff, seq, batch, vocab):
    def build():
        return bert_like_class()(vocab, d_model, heads, ff, layers, seq)

    def batch_fn(device):
        ids = torch.randint(0, vocab, (batch, seq), device=device)
        targets = torch.randint(0, vocab, (batch, seq), device=device)
        return ids, targets, lambda logits, y: torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())

    what = (f"BERT-base-shaped encoder from torch.nn.TransformerEncoder: {layers} layers, d_model {d_model}, "
            f"{heads} heads, feed-forward {ff}, GELU, dropout 0.1, post-norm; token ({vocab}) and learned "
            f"position embeddings, a final LayerNorm and an untied linear head over the vocabulary; random "
            f"tokens and per-token targets, batch {batch}, sequence {seq}, fp32 (TF32 off)")
    return ModelSpec(name, what, build, batch_fn,
                     {"layers": layers, "d_model": d_model, "heads": heads, "ff": ff, "seq": seq, "batch": batch,
                      "vocab": vocab, "dtype": "float32"})


def model_specs(quick):
    if quick:
        return [lambda: vision_spec("resnet18", 2, 64, True),
                lambda: bert_spec("tiny_transformer", 2, 64, 4, 128, 16, 2, 1000)]
    return [lambda: vision_spec("resnet50", 32, 224, False),
            lambda: bert_spec("bert_like", 12, 768, 12, 3072, 128, 32, 30522)]


# --- DDP ---


def init_group(backend):
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{measuring.free_port()}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=120))


def destroy_group():
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def reported_buckets(ddp):
    """DDP's buckets as its own logging data reports them (sizes in bytes), after the rebuild that
    follows the first iteration; None where this torch does not report them."""
    try:
        data = ddp._get_ddp_logging_data()
    except Exception:
        return None
    key = "rebuilt_bucket_sizes" if data.get("has_rebuilt_buckets") else "bucket_sizes"
    text = data.get(key)
    if not isinstance(text, str) or not text.strip():
        return None
    sizes = [int(part) for part in text.split(",") if part.strip()]
    return {"count": len(sizes), "sizes_bytes": sizes, "source": "reported",
            "how": f"DistributedDataParallel._get_ddp_logging_data()['{key}'] after the warm-up"}


def bucket_limits(ddp):
    """(first bucket's limit, later buckets' limit) in bytes: DDP caps its first bucket at 1 MiB only
    when bucket_cap_mb is left at its default; an explicit bucket_cap_mb applies to every bucket."""
    import torch.distributed as dist

    cap = ddp.bucket_bytes_cap
    first = dist._DEFAULT_FIRST_BUCKET_BYTES if getattr(ddp, "bucket_bytes_cap_default", False) else cap
    return first, cap


def estimated_buckets(model, limits):
    """Buckets implied by parameter sizes, as DDP rebuilds them after its first iteration: gradients
    in the order they become ready (taken here as reverse parameter order), a bucket closed once it
    reaches its limit (the first bucket's, then the later buckets')."""
    limits, sizes, current = list(limits), [], 0
    for p in reversed([p for p in model.parameters() if p.requires_grad]):
        current += p.numel() * p.element_size()
        if current >= limits[min(len(sizes), 1)]:
            sizes.append(current)
            current = 0
    if current:
        sizes.append(current)
    return {"count": len(sizes), "sizes_bytes": sizes, "source": "estimated",
            "how": f"reverse parameter order, the first bucket closed at {limits[0]} bytes or more, later ones "
                   f"at {limits[1]}; computed here from parameter sizes, not read from DDP"}


# --- training ---

class Trainee:
    """One configuration: its own model instance, optimizer and step."""

    def __init__(self, name, cap_mb, gav, spec, device, batch):
        self.name, self.cap_mb, self.gav = name, cap_mb, gav
        torch.manual_seed(0)  # the same initial weights in every configuration
        with torch.device(device):  # initialised where it trains: a large model's CPU init is slow
            self.module = spec.build().train()
        self.model = self.module
        if cap_mb is not None:
            caps = {} if cap_mb == DEFAULT else {"bucket_cap_mb": cap_mb}
            self.model = torch.nn.parallel.DistributedDataParallel(
                self.module, device_ids=[0] if device == "cuda" else None, gradient_as_bucket_view=gav, **caps)
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)
        self.x, self.y, self.loss_fn = batch
        self.loss = None
        self.times = []  # per repeat, the list of per-iteration ms

    def step(self):
        self.optimizer.zero_grad(set_to_none=True)
        self.loss = self.loss_fn(self.model(self.x), self.y)
        self.loss.backward()
        self.optimizer.step()

    def run(self, clock, iterations):
        """Per-iteration milliseconds of `iterations` steps, timed back to back."""
        marks = [clock.mark()]
        for _ in range(iterations):
            self.step()
            marks.append(clock.mark())
        clock.sync()
        return [clock.elapsed(a, b) for a, b in zip(marks, marks[1:])]


def gradient_bytes(module):
    return sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)


class Run(measuring.Run):
    def __init__(self, args):
        super().__init__(args)
        self.counts = QUICK if args.quick else FULL
        self.models, self.measurements = {}, {}
        self.ddp_ready = False

    def remaining(self):
        return self.deadline - time.perf_counter()

    def measure_all(self):
        specs = model_specs(self.args.quick)
        backend = "nccl" if self.device == "cuda" else "gloo"
        try:
            init_group(backend)
            self.ddp_ready = True
        except Exception as error:  # plain training is still measured
            self.errors["init_process_group"] = f"{backend}: {type(error).__name__}: {error}"
        for index, make_spec in enumerate(specs):
            if self.remaining() <= 0:
                self.skipped_for_time.append(f"model {index + 1}: not started (budget spent)")
                continue
            try:
                spec = make_spec()
            except Exception as error:
                self.errors[f"model {index + 1}"] = f"{type(error).__name__}: {error}"
                continue
            # Each model type gets an equal share of what is left, so the last is not starved.
            share = self.remaining() / (len(specs) - index)
            try:
                self.measure_model(spec, time.perf_counter() + share)
            except Exception as error:
                self.errors[spec.name] = f"{type(error).__name__}: {error}"
            self.free()

    def free(self):
        import gc

        gc.collect()
        if self.device == "cuda":
            torch.cuda.empty_cache()

    def measure_model(self, spec, model_deadline):
        batch = spec.batch(self.device)
        configs = [c for c in CONFIGS if c[1] is None or self.ddp_ready]
        for name, _, _ in CONFIGS:
            if name not in [c[0] for c in configs]:
                self.skipped[f"{spec.name}/{name}"] = "no process group (see errors.init_process_group)"
        trainees = [Trainee(name, cap, gav, spec, self.device, batch) for name, cap, gav in configs]
        params = sum(p.numel() for p in trainees[0].module.parameters())
        info = {"what": spec.what, "settings": spec.settings, "parameters": params,
                "gradient_bytes": gradient_bytes(trainees[0].module)}
        self.models[spec.name] = info
        began = time.perf_counter()
        for trainee in trainees:
            trainee.run(self.clock, self.counts["warmup"])
        warm_s = time.perf_counter() - began
        info["warmup_s"] = round(warm_s, 3)
        # A repeat runs `iterations` steps of every configuration; the warm-up ran `warmup` of each.
        estimate = warm_s * self.counts["iterations"] / self.counts["warmup"]
        for r in range(self.counts["repeats"]):
            if time.perf_counter() + estimate > model_deadline and (r > 0 or self.remaining() < estimate):
                self.skipped_for_time.append(f"{spec.name}: repeats {r + 1}-{self.counts['repeats']}")
                break
            began = time.perf_counter()
            shift = r % len(trainees)  # a rotated order each repeat, so that no configuration always goes first
            for trainee in trainees[shift:] + trainees[:shift]:
                trainee.times.append(trainee.run(self.clock, self.counts["iterations"]))
            estimate = time.perf_counter() - began
        self.record(spec, trainees)
        del trainees, batch

    def record(self, spec, trainees):
        plain = next((t for t in trainees if t.cap_mb is None), None)
        plain_median = statistics.median(sum(plain.times, [])) if plain and plain.times else None
        for trainee in trainees:
            if not trainee.times:
                continue
            samples = sum(trainee.times, [])
            record = dict(stats_ms(samples), repeats=len(trainee.times), iterations=len(samples),
                          iterations_per_repeat=self.counts["iterations"],
                          repeat_medians_ms=[round(statistics.median(t), 6) for t in trainee.times],
                          ddp=trainee.cap_mb is not None, bucket_cap_mb=trainee.cap_mb,
                          gradient_as_bucket_view=trainee.gav if trainee.cap_mb is not None else None)
            loss = float(trainee.loss.detach()) if trainee.loss is not None else None
            record["final_loss"] = loss if loss is not None and math.isfinite(loss) else None
            if trainee.cap_mb is not None:
                limits = bucket_limits(trainee.model)
                record.update(first_bucket_cap_bytes=limits[0], bucket_cap_bytes=limits[1])
                record["buckets"] = reported_buckets(trainee.model) or estimated_buckets(trainee.module, limits)
            if plain_median:
                record["overhead_vs_plain"] = record["median_ms"] / plain_median - 1
                ratios = [statistics.median(t) / statistics.median(p) - 1 for t, p in zip(trainee.times, plain.times)]
                record["overhead_vs_plain_per_repeat"] = {"median": statistics.median(ratios), "min": min(ratios),
                                                          "max": max(ratios), "repeats": len(ratios)}
            self.measurements[f"{spec.name}/{trainee.name}"] = record


def summary_lines(measurements, models):
    lines = [f"{name}: {info['parameters']} parameters, {info['gradient_bytes'] / 2**20:.1f} MiB of gradients"
             for name, info in sorted(models.items())]
    for key, record in sorted(measurements.items()):
        line = (f"{key}: {record['median_ms']:.3f} ms per iteration ({record['min_ms']:.3f}-{record['max_ms']:.3f}, "
                f"{record['iterations']} iterations in {record['repeats']} repeats)")
        if "overhead_vs_plain" in record and record["ddp"]:
            line += f", {100 * record['overhead_vs_plain']:+.1f} % vs plain"
        if "buckets" in record:
            line += f", {record['buckets']['count']} buckets ({record['buckets']['source']})"
        lines.append(line)
    return [f"RESULT {line}" for line in lines]


def main(argv=None):
    args = measuring.parser(__doc__.splitlines()[0], "ddp_overhead.json",
                           "small models, 2 repeats of 3 iterations (a CPU dry run with gloo)", 120.0,
                           "no repeat starts").parse_args(argv)
    global torch
    torch = measuring.import_torch(args.device)
    if torch is None:
        return measuring.SKIP_EXIT
    if args.device == "cuda":
        torch.cuda.set_device(0)
    run = Run(args)
    document = measuring.document("ddp_overhead", __doc__.splitlines()[0])

    def work():
        document["environment"] = environment(args.device)
        document["settings"] = {
            "quick": args.quick, "seconds_budget": args.seconds, **run.counts, "precision": precision_settings(),
            "timer": run.clock.what, "configs": {name: {"bucket_cap_mb": cap, "gradient_as_bucket_view": gav}
                                                 for name, cap, gav in CONFIGS},
            "ddp": {"world_size": 1, "backend": "nccl" if args.device == "cuda" else "gloo",
                    "init": "tcp://127.0.0.1:<free port>", "device_ids": [0] if args.device == "cuda" else None,
                    "bucket_cap_mb_unit": "MiB (DDP multiplies by 1024 * 1024)",
                    "first_bucket": "an explicit bucket_cap_mb caps every bucket, the first too; only "
                                    "ddp_default (bucket_cap_mb left out) has a 1 MiB first bucket",
                    "note": "one rank: DDP's autograd hooks, bucket copies and collective launches run, but no "
                            "bytes travel between GPUs (NCCL's one-rank in-place SUM launches no kernel)"},
            "optimizer": f"torch.optim.SGD(lr={LEARNING_RATE}, momentum={MOMENTUM}), default implementation",
            "iteration": "zero_grad(set_to_none=True), forward, loss, backward, optimizer.step()",
            "data": "one synthetic batch, made once on the device",
            "order": "warm-up of every configuration, then per repeat each configuration's iterations in an "
                     "order rotated by one each repeat",
            "overhead_vs_plain": "median(ddp per-iteration ms) / median(plain per-iteration ms) - 1"}
        run.measure_all()

    status = measuring.guarded(run.errors, work, destroy_group)
    document.update(models=run.models, measurements=run.measurements)
    measuring.finish(document, run, args.out_dir / "ddp_overhead.json",
                     summary_lines(run.measurements, run.models))
    return status


if __name__ == "__main__":
    sys.exit(main())
