"""Measures how GPU compute slows beside SM-holding, memory-bound, codec and NCCL kernels.

The simulator slows compute beside a collective because NCCL's channels each hold an SM (one
persistent block per channel, NVIDIA/nccl#689) and NCCL's reads and writes cost memory bandwidth,
and it slows compute beside gradient-compression kernels. One GPU cannot run a real inter-GPU
collective, so this script measures those mechanisms one by one: each compute loop ("victim") is
timed alone and beside each "companion" that keeps another stream busy for the whole loop
(spinning kernels holding SM slots, a copy loop, fp16 casts, top-k, NCCL with one rank).

    python gpu/measure/contention.py --out-dir DIR [--device cuda|cpu] [--quick] [--seconds S]

Writes DIR/contention.json (slowdowns as medians of per-repeat ratios, with min and max) and prints
`RESULT ` lines. Exit 77 when --device cuda finds no GPU, 2 for a bad argument.
"""

import datetime
import math
import os
import sys
import threading
import time

import measuring
from measuring import CudaClock, calibrate, environment, precision_settings, stats, stats_ms, time_ops

torch = None  # set by main (measuring.import_torch), so that a bad flag fails before torch loads


SPIN_COUNTS = (1, 8, 16, 32)
HOLD_COUNTS = (8, 16, 32)
# A whole-SM block: 1024 threads and 200 KiB of shared memory, more than half of an H100/H200
# SM's 228 KiB, so no other block that needs shared memory fits beside it on that SM.
HOLD_THREADS = 1024
HOLD_SHARED = 200 << 10
HOLD_SOURCE = r"""
extern "C" __global__ void hold_sm(long long cycles) {
    extern __shared__ int scratch[];
    volatile int *mine = scratch;
    long long start = clock64();
    while (clock64() - start < cycles) {
        mine[threadIdx.x] += 1;
    }
}
"""

# The full run sizes the work for an H200; --quick sizes it for a 2-core CPU dry run.
FULL = {"gemm_bf16": 8192, "gemm_fp32": 4096, "conv": (32, 256, 14), "resnet_batch": 32,
        "copy_bytes": 256 << 20, "cast_elements": 64 << 20, "topk_elements": 16 << 20,
        "nccl_bytes": 64 << 20, "victim_ms": 60.0, "chunk_ms": 10.0, "repeats": 5, "max_ops": 2000}
QUICK = {"gemm_bf16": 256, "gemm_fp32": 128, "conv": (2, 16, 14), "resnet_batch": None,
         "copy_bytes": 1 << 20, "cast_elements": 64 << 10, "topk_elements": 64 << 10,
         "nccl_bytes": 1 << 20, "victim_ms": 15.0, "chunk_ms": 3.0, "repeats": 2, "max_ops": 500}


# --- victims: compute loops of K back-to-back ops on the victim stream ---

class Victim:
    def __init__(self, name, what, op, settings):
        self.name, self.what, self.op, self.settings = name, what, op, settings
        self.ops = self.op_ms = None

    def loop(self, clock):
        start = clock.mark()
        for _ in range(self.ops):
            self.op()
        return start, clock.mark()


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def gemm_victim(name, n, dtype, device):
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    c = torch.empty(n, n, device=device, dtype=dtype)
    tf32 = "" if dtype == torch.bfloat16 else ", TF32 off"
    return Victim(name, f"torch.mm of two {n}x{n} {dtype_name(dtype)} matrices{tf32}",
                  lambda: torch.mm(a, b, out=c), {"n": n, "dtype": dtype_name(dtype)})


def conv_victim(batch, channels, size, device):
    x = torch.randn(batch, channels, size, size, device=device)
    w = torch.randn(channels, channels, 3, 3, device=device) / math.sqrt(9 * channels)
    shape = {"input": [batch, channels, size, size], "weight": [channels, channels, 3, 3], "padding": 1,
             "dtype": "float32"}
    return Victim("conv_fp32", f"F.conv2d {shape['input']} * {shape['weight']}, padding 1, fp32, TF32 off "
                  "(a ResNet-50 stage-3 3x3 layer)", lambda: torch.nn.functional.conv2d(x, w, padding=1), shape)


def resnet50_victim(batch, device):
    import torchvision  # only the full GPU run needs it

    model = torchvision.models.resnet50(weights=None).to(device).train()
    x = torch.randn(batch, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)

    def step():
        model.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()

    return Victim("resnet50_step", f"one forward and backward of torchvision resnet50, batch {batch}, 224x224, "
                  "fp32, TF32 off, train mode, no optimizer", step,
                  {"batch": batch, "image": 224, "dtype": "float32", "torchvision": torchvision.__version__})


# --- companions: work that keeps other streams busy for the whole victim loop ---

class ChunkedCompanion:
    """An op run from its own thread on its own stream in chunks of `per_chunk` ops, at most two
    chunks queued, until stop(): the stream stays busy however long the victim takes, and no
    chunk waits at the head of a hardware queue behind a long backlog."""

    def __init__(self, name, what, op, work, unit, clock, stream, settings):
        self.name, self.what, self.op, self.work, self.unit = name, what, op, work, unit
        self.clock, self.stream, self.settings = clock, stream, settings
        self.per_chunk = self.op_ms = None
        self.marks = []

    def chunk(self):
        start = self.clock.mark()
        for _ in range(self.per_chunk):
            self.op()
        return start, self.clock.mark()

    def _run(self):
        try:
            with self.clock.on(self.stream):
                while True:
                    if len(self.marks) >= 2:
                        self.clock.wait(self.marks[-2][2])
                    if self._stop.is_set():
                        break
                    start, end = self.chunk()
                    self.marks.append((0, start, end))
                    # On the GPU the first chunk runs while the second waits; on the CPU it has run.
                    if len(self.marks) >= (2 if isinstance(self.clock, CudaClock) else 1):
                        self._ready.set()
        except BaseException as error:  # handed to the main thread by stop()
            self.error = error
        finally:
            self._ready.set()

    def start(self, duration_ms):
        self.marks, self.error = [], None
        self._stop, self._ready = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        self._ready.wait(timeout=120)
        if self.error is not None:
            raise self.error

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=300)
        if self.error is not None:
            raise self.error

    def alone(self, chunks=3):
        """Milliseconds of `chunks` chunks run back to back with nothing beside them."""
        with self.clock.on(self.stream):
            marks = [self.chunk() for _ in range(chunks)]
        self.clock.sync()
        return [self.clock.elapsed(start, end) for start, end in marks]

    def throughput(self, chunk_ms):
        """G(unit)/s of one chunk that took chunk_ms."""
        return self.work * self.per_chunk / chunk_ms / 1e6


class SpinCompanion:
    """K torch.cuda._sleep kernels, one per stream, each as long as start() is told."""

    def __init__(self, k, streams, cycles_per_ms, clock):
        self.name, self.k, self.streams = f"spin_sms_{k}", k, streams[:k]
        self.cycles_per_ms, self.clock = cycles_per_ms, clock
        self.unit = None
        self.what = (f"{k} concurrent torch.cuda._sleep kernels on {k} streams: each is one block of one thread "
                     "spinning on the SM clock, so together they hold K block slots on up to K SMs, standing in "
                     "for the persistent blocks of K NCCL channels (one block per channel, NVIDIA/nccl#689). An "
                     "NCCL channel block has hundreds of threads and shared memory; a one-thread block leaves "
                     "most of its SM to other kernels, so this is a lower bound of the channels' footprint")
        self.settings = {"kernels": k, "streams": k}

    def start(self, duration_ms):
        cycles = int(duration_ms * self.cycles_per_ms)
        self.marks = []
        for group, stream in enumerate(self.streams):
            with torch.cuda.stream(stream):
                start = self.clock.mark()
                torch.cuda._sleep(cycles)
                self.marks.append((group, start, self.clock.mark()))

    def stop(self):
        pass


class HoldCompanion:
    """K whole-SM blocks (CuPy RawKernel on the companion's stream), each as long as start() is told."""

    def __init__(self, k, kernel, stream, cycles_per_ms, clock):
        self.name, self.k, self.kernel, self.stream = f"hold_sms_{k}", k, kernel, stream
        self.cycles_per_ms, self.clock = cycles_per_ms, clock
        self.unit = None
        self.what = (f"{k} blocks of {HOLD_THREADS} threads with {HOLD_SHARED >> 10} KiB of shared memory each, "
                     "spinning on the SM clock (one CuPy RawKernel launch): each block takes a whole SM's threads "
                     "and most of its shared memory, so together they take K SMs from the victim. An upper bound of "
                     "what K NCCL channels' blocks (one per channel, NVIDIA/nccl#689) occupy; spin_sms_K is the "
                     "lower bound")
        self.settings = {"blocks": k, "threads": HOLD_THREADS, "shared_bytes": HOLD_SHARED}

    def start(self, duration_ms):
        import cupy

        cycles = int(duration_ms * self.cycles_per_ms)
        with torch.cuda.stream(self.stream), cupy.cuda.ExternalStream(self.stream.cuda_stream):
            start = self.clock.mark()
            self.kernel((self.k,), (HOLD_THREADS,), (cupy.int64(cycles),), shared_mem=HOLD_SHARED)
            self.marks = [(0, start, self.clock.mark())]

    def stop(self):
        pass


def hold_kernel():
    """The whole-SM kernel, compiled by CuPy (NVRTC) and allowed its shared memory."""
    import cupy

    kernel = cupy.RawKernel(HOLD_SOURCE, "hold_sm")
    kernel.max_dynamic_shared_size_bytes = HOLD_SHARED
    return kernel


def spin_cycles_per_ms(clock):
    """SM clock cycles per millisecond, from timing one long torch.cuda._sleep (the clock boosts)."""
    torch.cuda._sleep(1_000_000)
    cycles = 20_000_000
    return cycles / time_ops(lambda: torch.cuda._sleep(cycles), clock, 1)


def copy_companion(nbytes, device, clock, stream):
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    return ChunkedCompanion("copy_GBps", f"device-to-device copy of a {nbytes >> 20} MiB fp32 buffer "
                            "(dst.copy_(src)) in a loop: memory traffic like NCCL's reads and writes; GB/s "
                            "counts bytes read plus bytes written", lambda: dst.copy_(src), 2 * nbytes, "GB/s",
                            clock, stream, {"bytes": nbytes})


def cast_companion(elements, device, clock, stream):
    x = torch.randn(elements, device=device)
    half = torch.empty(elements, device=device, dtype=torch.float16)
    back = torch.empty_like(x)

    def op():
        half.copy_(x)
        back.copy_(half)

    return ChunkedCompanion("fp16_cast", f"gradient compression by casting {elements} fp32 elements to fp16 and "
                            "back (two copy_ kernels) in a loop; GB/s counts 12 bytes read and written per "
                            "element", op, 12 * elements, "GB/s", clock, stream, {"elements": elements})


def topk_companion(elements, device, clock, stream):
    x = torch.randn(elements, device=device)
    magnitude = torch.empty_like(x)
    k = max(1, elements // 100)
    values = torch.empty(k, device=device)
    indices = torch.empty(k, device=device, dtype=torch.long)

    def op():
        torch.abs(x, out=magnitude)
        torch.topk(magnitude, k, sorted=False, out=(values, indices))

    return ChunkedCompanion("topk_1pct", f"torch.topk(abs(x), k={k}, sorted=False) on {elements} fp32 elements "
                            "(1 %, DGC-style sparsification) in a loop; throughput in input elements per "
                            "second", op, elements, "Gelem/s", clock, stream, {"elements": elements, "k": k})


def nccl_companion(nbytes, clock, stream):
    import torch.distributed as dist

    tensor = torch.randn(nbytes // 4, device="cuda")
    what = (f"torch.distributed all_reduce(op=AVG) of a {nbytes >> 20} MiB fp32 tensor in a loop, NCCL process "
            "group of world size 1. With one rank NCCL moves nothing between GPUs: an in-place SUM launches no "
            "kernel at all, and AVG (used here for that reason) launches NCCL's one-rank kernel (up to 32 "
            "blocks of 512 threads, src/device/onerank.cu) that scales the buffer in place, one read and one "
            "write. So this is a lower bound of a real collective's interference. Launched op by op from a "
            "Python thread; GB/s is the tensor's bytes per op")
    return ChunkedCompanion("nccl_world1", what, lambda: dist.all_reduce(tensor, op=dist.ReduceOp.AVG), nbytes,
                            "GB/s", clock, stream, {"bytes": nbytes, "op": "AVG", "world_size": 1})


def init_nccl():
    import torch.distributed as dist

    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{measuring.free_port()}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=120))


def destroy_nccl():
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


# --- one measurement ---

def overlap(span, window):
    return max(0.0, min(span[1], window[1]) - max(span[0], window[0]))


def measure_alone(victim, clock):
    start, end = victim.loop(clock)
    clock.sync()
    return clock.elapsed(start, end)


def measure_beside(victim, companion, clock, duration_ms):
    """(victim ms, companion cover, companion G(unit)/s beside): cover is the smallest share of the
    victim's loop during which each of the companion's streams was busy."""
    ref = clock.mark()
    clock.wait(ref)  # every later mark is timed from here
    companion.start(duration_ms)
    try:
        start, end = victim.loop(clock)
        clock.wait(end)
    finally:
        companion.stop()
        clock.sync()
    window = (clock.elapsed(ref, start), clock.elapsed(ref, end))
    length = max(window[1] - window[0], 1e-9)
    spans = {}
    for group, s, e in companion.marks:
        spans.setdefault(group, []).append((clock.elapsed(ref, s), clock.elapsed(ref, e)))
    cover = min((sum(overlap(span, window) for span in group) / length for group in spans.values()), default=0.0)
    inside = [span for span in spans.get(0, []) if span[0] >= window[0] and span[1] <= window[1]]
    rate = None
    if companion.unit and inside:
        rate = companion.throughput(sum(e - s for s, e in inside) / len(inside))
    return clock.elapsed(start, end), min(cover, 1.0), rate


# --- the run ---

class Run(measuring.Run):
    def __init__(self, args):
        super().__init__(args)
        self.sizes = QUICK if args.quick else FULL
        self.victims, self.companions = [], []
        self.alone, self.beside, self.companion_alone = {}, {}, {}
        self.cover_factor = {}

    def over_budget(self, needed_s=0.0):
        return time.perf_counter() + needed_s > self.deadline

    def try_build(self, name, build):
        if self.over_budget():
            self.skipped_for_time.append(f"{name}: not set up (budget spent)")
            return None
        try:
            return build()
        except Exception as error:  # recorded, and the run goes on without it
            self.errors[name] = f"{type(error).__name__}: {error}"
            return None

    def setup_victims(self):
        s, device = self.sizes, self.device
        batch, channels, size = s["conv"]
        builders = [("gemm_bf16", lambda: gemm_victim("gemm_bf16", s["gemm_bf16"], torch.bfloat16, device)),
                    ("gemm_fp32", lambda: gemm_victim("gemm_fp32", s["gemm_fp32"], torch.float32, device)),
                    ("conv_fp32", lambda: conv_victim(batch, channels, size, device))]
        if self.quick:
            self.skipped["resnet50_step"] = "--quick: a ResNet-50 step is too slow for the dry run"
        else:
            builders.append(("resnet50_step", lambda: resnet50_victim(s["resnet_batch"], device)))
        for name, build in builders:
            victim = self.try_build(name, build)
            if victim is None:
                continue

            def fit(victim=victim):
                victim.op_ms, victim.ops = calibrate(victim.op, self.clock, s["victim_ms"], s["max_ops"])
                return victim

            if self.try_build(name, fit) is not None:
                self.victims.append(victim)

    def setup_companions(self):
        s, device, clock = self.sizes, self.device, self.clock
        stream = torch.cuda.Stream() if device == "cuda" else None
        builders = [("copy_GBps", lambda: copy_companion(s["copy_bytes"], device, clock, stream)),
                    ("fp16_cast", lambda: cast_companion(s["cast_elements"], device, clock, stream)),
                    ("topk_1pct", lambda: topk_companion(s["topk_elements"], device, clock, stream))]
        if device == "cuda":
            builders.append(("nccl_world1", lambda: (init_nccl(), nccl_companion(s["nccl_bytes"], clock, stream))[1]))
        else:
            self.skipped["nccl_world1"] = "--device cpu: NCCL needs a GPU"
        for name, build in builders:
            companion = self.try_build(name, build)
            if companion is None:
                continue

            def fit(companion=companion):
                with clock.on(companion.stream):
                    companion.op_ms, companion.per_chunk = calibrate(companion.op, clock, s["chunk_ms"], 5000)
                return companion

            if self.try_build(name, fit) is not None:
                self.companions.append(companion)
        if device == "cuda":
            # The pool's streams, one per spinning kernel; they must differ from each other.
            streams = [torch.cuda.Stream() for _ in range(max(SPIN_COUNTS))]
            self.distinct_spin_streams = len({st.cuda_stream for st in streams})
            cycles = self.try_build("spin_sms", lambda: spin_cycles_per_ms(clock))
            if cycles is not None:
                self.cycles_per_ms = cycles
                self.companions += [SpinCompanion(k, streams, cycles, clock) for k in SPIN_COUNTS]
                kernel = self.try_build("hold_sms", hold_kernel)
                if kernel is not None:
                    self.companions += [HoldCompanion(k, kernel, streams[0], cycles, clock) for k in HOLD_COUNTS]
        else:
            for k in SPIN_COUNTS:
                self.skipped[f"spin_sms_{k}"] = "--device cpu: torch.cuda._sleep is a GPU kernel; no CPU counterpart"
            for k in HOLD_COUNTS:
                self.skipped[f"hold_sms_{k}"] = "--device cpu: the whole-SM kernel is a GPU kernel; no CPU counterpart"

    def spin_duration(self, victim, companion):
        """How long the spinning kernels must last: a multiple of the victim's latest time alone,
        doubled after any measurement they did not cover."""
        factor = self.cover_factor.get((victim.name, companion.name), 1.5)
        alone = self.alone.get(victim.name)
        recent = alone[max(alone)] if alone else victim.ops * victim.op_ms
        return factor * recent + 5.0

    def measure_victim(self, victim, r, estimate_s):
        """One repeat of `victim`: alone and beside each companion; False when skipped for time."""
        if self.over_budget(estimate_s):
            self.skipped_for_time.append(f"{victim.name}: repeat {r + 1}")
            return False
        configs = ["alone"] + [c.name for c in self.companions]
        shift = r % len(configs)  # a rotated order each repeat, so that no configuration always goes first
        for name in configs[shift:] + configs[:shift]:
            if name == "alone":
                self.alone.setdefault(victim.name, {})[r] = measure_alone(victim, self.clock)
                continue
            companion = next(c for c in self.companions if c.name == name)
            key = (victim.name, name)
            if key in self.errors_by_pair:
                continue
            try:
                ms, cover, rate = measure_beside(victim, companion, self.clock, self.spin_duration(victim, companion))
            except Exception as error:  # one broken pair does not end the run
                self.errors_by_pair[key] = f"{type(error).__name__}: {error}"
                continue
            self.beside.setdefault(key, []).append((r, ms, cover, rate))
            if cover < 0.999:
                self.cover_factor[key] = min(8.0, self.cover_factor.get(key, 1.5) * 2)
        return True

    def measure(self):
        self.errors_by_pair = {}
        estimates = {v.name: 3.0 * (1 + len(self.companions)) * v.ops * v.op_ms / 1e3 for v in self.victims}
        for r in range(self.sizes["repeats"]):
            for companion in self.companions:
                if companion.unit is None:
                    continue
                if self.over_budget(0.1):
                    self.skipped_for_time.append(f"{companion.name} alone: repeat {r + 1}")
                    continue
                try:
                    self.companion_alone.setdefault(companion.name, []).extend(companion.alone())
                except Exception as error:
                    self.errors[f"{companion.name} alone"] = f"{type(error).__name__}: {error}"
            for victim in self.victims:
                began = time.perf_counter()
                if self.measure_victim(victim, r, estimates[victim.name]):
                    estimates[victim.name] = time.perf_counter() - began
        for (victim, companion), message in self.errors_by_pair.items():
            self.errors[f"{victim} beside {companion}"] = message

    def results(self):
        """The flat measurement records: victims alone, victims beside companions, companions alone."""
        records = {}
        for victim in self.victims:
            times = self.alone.get(victim.name)  # repeat → ms
            if not times:
                continue
            records[f"{victim.name}/alone"] = dict(stats_ms([times[r] for r in sorted(times)]), ops_per_loop=victim.ops)
            for companion in self.companions:
                rows = self.beside.get((victim.name, companion.name), [])
                if not rows:
                    continue
                ratios = [ms / times[r] for r, ms, _, _ in rows if r in times]
                record = dict(stats_ms([ms for _, ms, _, _ in rows]), ops_per_loop=victim.ops,
                              slowdown=stats(ratios), companion_cover_min=min(c for _, _, c, _ in rows))
                rates = [rate for _, _, _, rate in rows if rate is not None]
                if companion.unit and rates:
                    record["companion_throughput_beside"] = stats(rates, companion.unit)
                records[f"{victim.name}/beside/{companion.name}"] = record
        for companion in self.companions:
            chunks = self.companion_alone.get(companion.name)
            if chunks:
                record = stats_ms([ms / companion.per_chunk for ms in chunks])
                record["time_of"] = "one op, from chunks of ops_per_chunk ops run alone"
                record["throughput"] = stats([companion.throughput(ms) for ms in chunks], companion.unit)
                records[f"{companion.name}/alone"] = record
        return records

    def describe(self):
        victims = {v.name: {"what": v.what, "settings": v.settings, "ops_per_loop": v.ops,
                            "calibrated_op_ms": v.op_ms} for v in self.victims}
        companions = {}
        for c in self.companions:
            entry = {"what": c.what, "settings": c.settings, "unit": c.unit}
            if isinstance(c, ChunkedCompanion):
                entry.update(ops_per_chunk=c.per_chunk, calibrated_op_ms=c.op_ms)
            companions[c.name] = entry
        return victims, companions


def summary_lines(records, skipped):
    lines = []
    for key, record in sorted(records.items()):
        spread = f"{record['min_ms']:.3f}-{record['max_ms']:.3f} ms, {record['repeats']} repeats"
        if "slowdown" in record:
            slow = record["slowdown"]
            line = f"{key}: slowdown x{slow['median']:.3f} ({slow['min']:.3f}-{slow['max']:.3f})"
            if "companion_throughput_beside" in record:
                rate = record["companion_throughput_beside"]
                line += f", companion {rate['median']:.3g} {rate['unit']} beside"
            lines.append(f"{line}; {record['median_ms']:.3f} ms ({spread})")
        elif "throughput" in record:
            rate = record["throughput"]
            lines.append(f"{key}: {rate['median']:.3g} {rate['unit']} ({rate['min']:.3g}-{rate['max']:.3g})")
        else:
            lines.append(f"{key}: {record['median_ms']:.3f} ms per loop of {record['ops_per_loop']} ops ({spread})")
    lines += [f"skipped {name}: {reason}" for name, reason in sorted(skipped.items())]
    return [f"RESULT {line}" for line in lines]


def main(argv=None):
    args = measuring.parser(__doc__.splitlines()[0], "contention.json", "tiny sizes and 2 repeats (a CPU dry run)", 90.0,
                           "no measurement starts").parse_args(argv)
    if args.device == "cuda":
        # Up to 34 streams run at once (victim, companion, 32 spinning kernels); with the default 8
        # hardware queues, streams would share queues and wait on each other's unrelated work.
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    global torch
    torch = measuring.import_torch(args.device)
    if torch is None:
        return measuring.SKIP_EXIT
    torch.manual_seed(0)
    if args.device == "cpu":
        # One intra-op thread per Python thread: the victim and its companion then each hold a core,
        # instead of two OpenMP teams spinning (KMP_BLOCKTIME) on each other's cores between ops.
        torch.set_num_threads(1)
    run = Run(args)
    document = measuring.document("contention", __doc__.splitlines()[0])

    def work():
        document["environment"] = environment(args.device)
        settings = {"quick": args.quick, "seconds_budget": args.seconds, "sizes": run.sizes,
                    "repeats": run.sizes["repeats"], "victim_target_ms": run.sizes["victim_ms"],
                    "companion_chunk_target_ms": run.sizes["chunk_ms"], "precision": precision_settings(),
                    "timer": run.clock.what, "spin_counts": list(SPIN_COUNTS),
                    "victim_stream": "the default stream" if args.device == "cuda" else "the main thread",
                    "companion_launch": "a Python thread per companion, at most two chunks queued on its stream"
                                        if args.device == "cuda" else "a Python thread per companion",
                    "order": "per repeat: each companion alone, then per victim alone and beside each companion "
                             "in an order rotated by one each repeat",
                    "slowdown": "victim loop time beside / alone in the same repeat; median, min, max over repeats"}
        if args.device == "cuda":
            settings["CUDA_DEVICE_MAX_CONNECTIONS"] = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
        document["settings"] = settings
        run.setup_victims()
        run.setup_companions()
        if args.device == "cuda":
            settings["spin_streams_distinct"] = getattr(run, "distinct_spin_streams", None)
            settings["spin_cycles_per_ms"] = getattr(run, "cycles_per_ms", None)
        run.measure()

    status = measuring.guarded(run.errors, work, destroy_nccl)
    records = run.results()
    document["victims"], document["companions"] = run.describe()
    document["measurements"] = records
    measuring.finish(document, run, args.out_dir / "contention.json", summary_lines(records, run.skipped))
    return status


if __name__ == "__main__":
    sys.exit(main())
