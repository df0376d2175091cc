"""Measures the rates a GPU reaches per class of operation, and the host's time per op.

The simulator carries a model profile to another GPU at one fraction of each GPU's peak
(sim/src/inputs/carry.rs). The H200's captures show that the fraction depends on the operation
and its size, and that a host time per operation shows once the GPU's work per operation is
short (profiles/README.md, "Captured on an H200"). This script measures those, forward and
backward (the input's and the weight's gradients):
- matrix products of transformer-layer shapes (768 to 768, 768 to 3072, 3072 to 768) at several
  token counts, and one square product;
- ResNet-50's convolutions at batch 32;
- each in fp32 with TF32 off, in TF32 and in bf16;
- a LayerNorm and an elementwise add, the memory-bound rest;
- the host's time per op: a tiny op launched alone, and a tiny layer's forward and backward.

    python gpu/measure/op_rates.py --out-dir DIR [--device cuda|cpu] [--quick] [--seconds S]

Writes DIR/op_rates.json (per op: its FLOPs or bytes, the median time of each pass with min and
max, and the rate) and prints `RESULT ` lines. Exit 77 when --device cuda finds no GPU, 2 for a
bad argument.
"""

import functools
import sys
import time

import measuring
from measuring import calibrate, environment, precision_settings, stats_ms, time_ops

torch = None  # set by main (measuring.import_torch), so that a bad flag fails before torch loads

# (tokens, in, out) of a transformer layer's products: BERT-base at 4 x 384 tokens is 1,536 and
# GPT-2 at 4 x 1,024 is 4,096 (the shipped profiles' batches), then smaller and larger.
MATMULS_FULL = [(t, i, o) for t in (512, 1536, 4096, 16384) for i, o in ((768, 768), (768, 3072), (3072, 768))] \
    + [(4096, 4096, 4096)]
# (in channels, out channels, kernel, stride, input size) of ResNet-50's convolutions at 224 x 224:
# the stem, then each stage's 1 x 1 and 3 x 3 layers.
CONVS_FULL = [(3, 64, 7, 2, 224), (64, 64, 1, 1, 56), (64, 64, 3, 1, 56), (64, 256, 1, 1, 56), (256, 64, 1, 1, 56),
              (128, 128, 3, 1, 28), (512, 128, 1, 1, 28), (256, 256, 3, 1, 14), (1024, 256, 1, 1, 14),
              (256, 1024, 1, 1, 14), (512, 512, 3, 1, 7), (2048, 512, 1, 1, 7), (512, 2048, 1, 1, 7)]
FULL = {"matmuls": MATMULS_FULL, "convs": CONVS_FULL, "batch": 32, "norm": (4096, 768), "add": 64 << 20,
        "target_ms": 20.0, "repeats": 3, "max_ops": 2000, "host_ops": 2000, "host_layers": 64}
QUICK = {"matmuls": [(64, 32, 32), (64, 32, 96)], "convs": [(3, 8, 3, 2, 16), (8, 8, 3, 1, 8)], "batch": 2,
         "norm": (64, 32), "add": 64 << 10, "target_ms": 3.0, "repeats": 2, "max_ops": 200, "host_ops": 200,
         "host_layers": 8}
# TF32 only exists on a GPU.
PRECISIONS = {"cuda": ("fp32", "tf32", "bf16"), "cpu": ("fp32", "bf16")}


def set_precision(precision):
    """fp32 with TF32 off, or TF32 on; bf16 tensors ignore the switches. Returns the dtype."""
    precision_settings(tf32=precision == "tf32")
    return torch.bfloat16 if precision == "bf16" else torch.float32


class Op:
    """One operation to time: `forward()` runs it, `backward()` its input's (where it has one)
    and weight's gradients from a kept graph; `flops` or `bytes` are per forward pass."""

    def __init__(self, name, klass, precision, settings, forward, backward, flops=None, bytes_moved=None):
        self.name, self.klass, self.precision, self.settings = name, klass, precision, settings
        self.forward, self.backward = forward, backward
        self.flops, self.bytes = flops, bytes_moved


def differentiable(forward, inputs):
    """(run forward, run backward) of `forward(*inputs)`: the backward takes the gradients of
    every input that requires one from a graph kept across runs, accumulating nothing."""
    out = forward(*inputs)
    grad = torch.randn_like(out)
    wanted = [x for x in inputs if x.requires_grad]

    def backward():
        torch.autograd.grad(out, wanted, grad, retain_graph=True)

    def run_forward():
        with torch.no_grad():
            forward(*inputs)

    return run_forward, backward


def matmul_op(tokens, d_in, d_out, precision, device):
    dtype = set_precision(precision)
    x = torch.randn(tokens, d_in, device=device, dtype=dtype, requires_grad=True)
    w = torch.randn(d_in, d_out, device=device, dtype=dtype, requires_grad=True)
    forward, backward = differentiable(torch.mm, (x, w))
    return Op(f"matmul {tokens}x{d_in}x{d_out} {precision}", "matmul", precision,
              {"tokens": tokens, "in": d_in, "out": d_out}, forward, backward, flops=2 * tokens * d_in * d_out)


def conv_op(batch, c_in, c_out, kernel, stride, size, precision, device):
    dtype = set_precision(precision)
    # The stem's input is the data: no gradient is taken for it in training.
    x = torch.randn(batch, c_in, size, size, device=device, dtype=dtype, requires_grad=c_in != 3)
    w = torch.randn(c_out, c_in, kernel, kernel, device=device, dtype=dtype, requires_grad=True)
    padding = kernel // 2

    def conv(x, w):
        return torch.nn.functional.conv2d(x, w, stride=stride, padding=padding)

    out_size = (size + 2 * padding - kernel) // stride + 1
    forward, backward = differentiable(conv, (x, w))
    flops = 2 * batch * out_size * out_size * c_out * c_in * kernel * kernel
    return Op(f"conv {c_in}->{c_out} {kernel}x{kernel}/{stride} @{size} b{batch} {precision}", "conv", precision,
              {"batch": batch, "in": c_in, "out": c_out, "kernel": kernel, "stride": stride, "size": size},
              forward, backward, flops=flops)


def memory_ops(sizes, device):
    """A LayerNorm (fp32; forward and backward) and an elementwise add, by the bytes they move."""
    tokens, width = sizes["norm"]
    x = torch.randn(tokens, width, device=device, requires_grad=True)
    norm = torch.nn.LayerNorm(width, device=device)
    forward, backward = differentiable(norm, (x,))
    # The forward reads x and writes y (4 bytes each); the backward reads x, y's gradient and the
    # saved statistics and writes x's: about 3 passes.
    ops = [Op(f"layernorm {tokens}x{width}", "memory", "fp32", {"tokens": tokens, "width": width},
              forward, backward, bytes_moved=2 * 4 * tokens * width)]
    a, b = (torch.randn(sizes["add"], device=device) for _ in range(2))
    c = torch.empty_like(a)
    ops.append(Op(f"add {sizes['add']}", "memory", "fp32", {"elements": sizes["add"]},
                  lambda: torch.add(a, b, out=c), None, bytes_moved=3 * 4 * sizes["add"]))
    return ops


def host_per_op(sizes, device, clock):
    """The host's time per op, with the GPU waiting on it: a 1-element add launched
    back to back (wall time of the launches, then a sync), and a chain of tiny linear layers
    run forward and backward (autograd's nodes, each launching a few kernels), per layer."""
    a = torch.ones(1, device=device)
    clock.sync()
    started = time.perf_counter()
    for _ in range(sizes["host_ops"]):
        a.add_(1.0)
    launched = time.perf_counter()
    clock.sync()
    done = time.perf_counter()
    layers = [torch.nn.Linear(4, 4, device=device) for _ in range(sizes["host_layers"])]
    x = torch.randn(1, 4, device=device)

    def step():
        y = x
        for layer in layers:
            y = layer(y)
        y.sum().backward()

    step()
    clock.sync()
    t0 = time.perf_counter()
    step()
    clock.sync()
    t1 = time.perf_counter()
    return {"launch_us_per_op": (launched - started) / sizes["host_ops"] * 1e6,
            "wall_us_per_op": (done - started) / sizes["host_ops"] * 1e6,
            "layer_forward_backward_us": (t1 - t0) / sizes["host_layers"] * 1e6}


class Run(measuring.Run):
    def __init__(self, args):
        super().__init__(args)
        self.sizes = QUICK if args.quick else FULL
        self.records, self.host = {}, None

    def ops(self):
        """(label, builder) of every op, in the order they are timed."""
        s, device = self.sizes, self.device
        for precision in PRECISIONS[device]:
            for shape in s["matmuls"]:
                yield f"matmul {shape} {precision}", functools.partial(matmul_op, *shape, precision, device)
            for shape in s["convs"]:
                yield f"conv {shape} {precision}", functools.partial(conv_op, s["batch"], *shape, precision, device)
        yield "memory ops", functools.partial(memory_ops, s, device)

    def time_pass(self, run):
        s = self.sizes
        _, count = calibrate(run, self.clock, s["target_ms"], s["max_ops"])
        return stats_ms([time_ops(run, self.clock, count) for _ in range(s["repeats"])])

    def measure(self):
        for label, build in self.ops():
            if time.perf_counter() > self.deadline:
                self.skipped_for_time.append(f"{label} and every op after it (budget spent)")
                break
            try:
                built = build()
                for op in built if isinstance(built, list) else [built]:
                    self.records[op.name] = self.timed(op)
            except Exception as error:  # recorded, and the run goes on without it
                self.errors[label] = f"{type(error).__name__}: {error}"
            finally:
                set_precision("fp32")
        self.host = host_per_op(self.sizes, self.device, self.clock)

    def timed(self, op):
        record = {"class": op.klass, "precision": op.precision, "settings": op.settings,
                  "forward": self.time_pass(op.forward)}
        if op.backward is not None:
            record["backward"] = self.time_pass(op.backward)
        rate(record, op)
        return record


def rate(record, op):
    """Adds each pass's rate: TFLOP/s (the backward does twice the forward's FLOPs) or GB/s."""
    for name, work in (("forward", 1), ("backward", 2)):
        if name not in record:
            continue
        seconds = record[name]["median_ms"] / 1e3
        if op.flops is not None:
            record[name]["flops"] = work * op.flops
            record[name]["tflops"] = work * op.flops / seconds / 1e12
        else:
            record[name]["bytes"] = (1.5 if name == "backward" else 1) * op.bytes
            record[name]["gbytes_per_s"] = record[name]["bytes"] / seconds / 1e9


def summary_lines(records, host):
    lines = []
    for name, r in records.items():
        unit = "tflops" if "tflops" in r["forward"] else "gbytes_per_s"
        label = "TFLOP/s" if unit == "tflops" else "GB/s"
        passes = ", ".join(f"{p} {r[p][unit]:.3g} {label}" for p in ("forward", "backward") if p in r)
        lines.append(f"{name}: {passes}")
    if host:
        lines.append(f"host: {host['launch_us_per_op']:.1f} us per op launched, {host['wall_us_per_op']:.1f} us "
                     f"per op with the GPU, {host['layer_forward_backward_us']:.1f} us per tiny layer forward+backward")
    return [f"RESULT {line}" for line in lines]


def main(argv=None):
    args = measuring.parser(__doc__.splitlines()[0], "op_rates.json", "tiny sizes and 2 repeats (a CPU dry run)", 60.0,
                            "no op starts").parse_args(argv)
    global torch
    torch = measuring.import_torch(args.device)
    if torch is None:
        return measuring.SKIP_EXIT
    torch.manual_seed(0)
    run = Run(args)
    document = measuring.document("op_rates", __doc__.splitlines()[0])

    def work():
        document["environment"] = environment(args.device)
        document["settings"] = {"quick": args.quick, "seconds_budget": args.seconds, "sizes": run.sizes,
                                "precisions": list(PRECISIONS[args.device]), "precision": precision_settings(),
                                "timer": run.clock.what,
                                "backward": "torch.autograd.grad of the input (where training takes it) and the "
                                            "weight from a kept graph; its FLOPs are twice the forward's",
                                "timing": "per pass: calibrated to about target_ms of back-to-back runs, then "
                                          "median, min and max over repeats of that many"}
        run.measure()

    status = measuring.guarded(run.errors, work, lambda: None)
    document["measurements"] = run.records
    document["host"] = run.host
    measuring.finish(document, run, args.out_dir / "op_rates.json", summary_lines(run.records, run.host))
    return status


if __name__ == "__main__":
    sys.exit(main())
