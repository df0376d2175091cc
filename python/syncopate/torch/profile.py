"""model_profile: a Syncopate model profile recorded from a real torch module.

The profile follows the profiles/models/*.json schema; it is recorded with post-accumulate-grad and
forward hooks and timed on its parameters' device.
"""

import math
import statistics

import torch
import torch.distributed as dist

from syncopate.torch.clock import clock_for

# A normal distribution's σ over its median absolute deviation.
MAD_TO_SIGMA = 1.4826


def model_profile(module, loss_fn, *, name, batch_size, device="host-2core", iterations=5, warmup=2, lr=0.01,
                  optimizer=None, amp=False, sample_unit="samples", rank_skew=False):
    """Runs `loss_fn()` (forward on one batch of `batch_size` samples, returning the loss), its
    backward and an optimizer step `warmup + iterations` times, and records: the trainable
    parameters in gradient-ready order (post-accumulate-grad hooks), the gap before each
    gradient (the first one's measured from the loss), each parameterized module's forward time
    (forward hooks; parameter-less work in between joins the next such module, the loss the
    last) split over its parameters by element count, the optimizer step, and the host's thread
    counts; per-tensor medians of the measured iterations, scaled to the median iteration's
    total (so that time-sharing of the cores, which per-tensor medians miss, is kept). Timed with perf_counter on the CPU and with CUDA
    events when the parameters are on a GPU. `device` names the device profile the timings
    belong to; `optimizer` (default: SGD with `lr`) steps the module's parameters; `amp`
    autocasts the forward (fp16 with a gradient scaler on a GPU, bf16 on the CPU). `rank_skew`
    (every rank of an initialized torch.distributed world calls model_profile at once) starts
    the ranks together and records how much one rank's iteration compute differs from the mean
    of the ranks' same iteration: ranks that time-share a host's cores do not keep pace with
    each other, and the slowest one sets the pace of every collective. No barrier separates the
    iterations: on oversubscribed cores it lets half the ranks compute while the others wait,
    and each would time an iteration as if it had a core of its own."""
    if iterations < 1 or warmup < 0 or batch_size < 1:
        raise ValueError("model_profile: iterations and batch_size must be at least 1, warmup at least 0")
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    if not named:
        raise ValueError("model_profile: the module has no trainable parameters")
    devices = sorted({str(p.device) for _, p in named})
    if len(devices) > 1:
        raise ValueError(f"model_profile: the parameters are on several devices ({', '.join(devices)}); "
                         "a profile times one device")
    on = named[0][1].device
    clock = clock_for(on)
    optimizer = optimizer or torch.optim.SGD([p for _, p in named], lr=lr)
    world = _world() if rank_skew else 1
    if rank_skew and world < 2:
        raise ValueError("model_profile: rank_skew needs an initialized torch.distributed world of at least 2 ranks, "
                         "every rank calling model_profile at once")
    if world > 1:
        dist.barrier()  # the ranks start together; each iteration then runs as the cores let it
    samples = _measure(module, loss_fn, named, optimizer, clock, on, amp, warmup, iterations)
    activations = _activation_bytes(module, loss_fn, named, on, amp)
    tensors = _tensors(named, samples, _module_classes(module, named))
    precision = f", autocast {_autocast_dtype(on)}" if amp else ""
    method = (f"{clock.description}, per-tensor medians of {iterations} iterations after {warmup} warm-up scaled to the median iteration's total, batch {batch_size}"
              f"{precision}, PyTorch {torch.__version__}")
    profile = {
        "format_version": 1,
        "name": name,
        "description": f"{type(module).__name__} ({len(tensors)} parameter tensors), recorded by syncopate.torch.model_profile",
        "source": "syncopate.torch.model_profile",
        "device": device,
        "framework": f"PyTorch {torch.__version__}",
        "batch_size_per_gpu": batch_size,
        "sample_unit": sample_unit,
        "threads": {
            "intra_op": torch.get_num_threads(),
            "inter_op": torch.get_num_interop_threads(),
            "provenance": {"status": "measured",
                           "method": "torch.get_num_threads() and torch.get_num_interop_threads() after the measurement"},
        },
        "timing": {
            "backward": {"status": "measured", "method": "post-accumulate-grad hooks, " + method},
            "forward": {"status": "measured",
                        "method": "forward hooks on parameterized modules, parameter-less work attributed to the "
                                  "next parameterized module, split by element count; " + method},
            "optimizer": {"status": "measured", "method": f"{type(optimizer).__name__} step, " + method},
            "batch": {"status": "measured",
                      "method": f"the batch loss_fn computes on, as the caller states it (batch_size={batch_size})"},
        },
        "optimizer_us": round(statistics.median(s["optimizer"] for s in samples), 3),
        "optimizer_state_bytes_per_element": _optimizer_state_bytes(optimizer, named),
        "activation_bytes": activations,
        "tensors": tensors,
    }
    if world > 1:
        profile["rank_skew"] = _rank_skew(samples, world, method)
    return profile


def _activation_bytes(module, loss_fn, named, on, amp):
    """Bytes autograd keeps from one forward of `loss_fn` for its backward: every tensor saved for
    backward (torch.autograd.graph.saved_tensors_hooks), each storage once, the parameters' own
    storages left out (they are model states). Run once after the timed iterations, its
    gradients then cleared, so that it neither perturbs the timings nor trains."""
    parameters = {p.untyped_storage().data_ptr() for _, p in named}
    kept = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters and storage.device.type != "meta":
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    dtype = torch.float16 if _autocast_dtype(on) == "fp16" else torch.bfloat16
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with torch.autocast(on.type, dtype=dtype, enabled=amp):
            loss = loss_fn()
    loss.backward()
    for _, p in named:
        p.grad = None
    return sum(kept.values())


def _optimizer_state_bytes(optimizer, named):
    """Bytes of tensor state the optimizer keeps per trainable element after its steps
    (Adam's two moments: 8 in fp32; SGD's momentum buffer: 4), its scalar step counts aside."""
    elements = sum(p.numel() for _, p in named)
    kept = sum(value.numel() * value.element_size()
               for state in optimizer.state.values() for value in state.values()
               if torch.is_tensor(value) and value.dim() > 0)
    return round(kept / elements, 3)


def _world():
    """The ranks of the initialized torch.distributed world (1 when there is none)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _rank_skew(samples, world, method):
    """The coefficient of variation of a rank's iteration compute around the iteration's mean
    over the ranks, from every rank's samples. Robust: 1.4826 × the median absolute deviation
    (a normal's σ), so that one iteration in which the shared machine stalled a rank does not
    set the spread of all of them; × √(n / (n − 1)), since deviations from a mean of n ranks are
    that much narrower than the ranks' own spread."""
    mine = [sum(s["backward"].values()) + sum(s["forward"].values()) + s["optimizer"] for s in samples]
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    mean = statistics.fmean(total for totals in everyone for total in totals)
    deviations = [abs(total - statistics.fmean(iteration)) for iteration in zip(*everyone) for total in iteration]
    spread = MAD_TO_SIGMA * statistics.median(deviations) * math.sqrt(world / (world - 1))
    return {
        "cv": round(spread / mean, 4) if mean > 0 else 0.0,
        "ranks": world,
        "provenance": {"status": "measured",
                       "method": f"{world} ranks computing at once, started together; 1.4826 × the median absolute deviation of a rank's iteration compute "
                                 "(forward, backward, optimizer) from the iteration's mean over the ranks, "
                                 f"× √(n/(n−1)), over the mean; {method}"},
    }


def _autocast_dtype(on):
    """fp16 on a GPU (tensor cores, with a gradient scaler), bf16 on the CPU (no scaler needed)."""
    return "fp16" if on.type == "cuda" else "bf16"


def _measure(module, loss_fn, named, optimizer, clock, on, amp, warmup, iterations):
    """The samples of `iterations` training steps after `warmup`, with the hooks in place."""
    registration = {id(p): i for i, (_, p) in enumerate(named)}
    ready, forward = [], []
    handles = [p.register_post_accumulate_grad_hook(lambda q: ready.append((registration[id(q)], clock.mark())))
               for _, p in named]
    owners = {}
    for owner in module.modules():
        own = [registration[id(p)] for p in owner.parameters(recurse=False) if id(p) in registration]
        if own:
            owners[owner] = own
            handles.append(owner.register_forward_hook(lambda m, _i, _o: forward.append((m, clock.mark()))))
    dtype = torch.float16 if _autocast_dtype(on) == "fp16" else torch.bfloat16
    scaler = torch.amp.GradScaler(on.type) if amp and on.type == "cuda" else None
    samples = []
    try:
        for step in range(warmup + iterations):
            ready.clear()
            forward.clear()
            optimizer.zero_grad(set_to_none=True)
            start = clock.mark()
            with torch.autocast(on.type, dtype=dtype, enabled=amp):
                loss = loss_fn()
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
            if step >= warmup:
                marks = (start, loss_done, backward_done, step_done)
                samples.append(_sample(named, owners, ready, forward, clock, marks))
    finally:
        for handle in handles:
            handle.remove()
    return samples


def _module_classes(module, named):
    """Per parameter, the class of the module that registers it: `Linear` for torch.nn.Linear and
    its subclasses (what torchao's float8 conversion takes), else the class's own name."""
    classes = []
    for name, _ in named:
        owner = module.get_submodule(name.rpartition(".")[0])
        classes.append("Linear" if isinstance(owner, torch.nn.Linear) else type(owner).__name__)
    return classes


def _tensors(named, samples, classes):
    """The profile's tensors in the last iteration's gradient-ready order, with median timings."""
    order = samples[-1]["order"]
    if len(order) != len(named):
        missing = sorted(set(range(len(named))) - set(order))
        raise ValueError(f"model_profile: {len(missing)} parameters never received a gradient, e.g. "
                         f"{named[missing[0]][0]}; freeze them (requires_grad=False) or fix the loss")
    median = statistics.median
    backward = {i: median(s["backward"].get(i, 0.0) for s in samples) for i in order}
    forward = {i: median(s["forward"][i] for s in samples) for i in order}
    # Each tensor's median keeps the shape of an iteration; the median iteration's total keeps its
    # level. They differ where processes time-share cores (ranks beside each other on a CPU host):
    # a preemption lands in a few short gaps of each iteration, so every tensor's median misses
    # it while every iteration's total pays it.
    backward_scale = _level(median(sum(s["backward"].values()) for s in samples), sum(backward.values()))
    forward_scale = _level(median(sum(s["forward"].values()) for s in samples), sum(forward.values()))
    tensors = []
    for index in order:
        param_name, p = named[index]
        shape = list(p.shape) or [1]
        tensors.append({
            "name": param_name,
            "shape": shape,
            "numel": math.prod(shape),
            "dtype": "f32",
            "registration_index": index,
            "backward_us": round(backward[index] * backward_scale, 3),
            "forward_us": round(forward[index] * forward_scale, 3),
            "module": classes[index],
        })
    return tensors


def _level(iteration_total, sum_of_medians):
    """The factor that brings the per-tensor medians to the median iteration's total."""
    return iteration_total / sum_of_medians if sum_of_medians > 0 else 1.0


def _sample(named, owners, ready, forward, clock, marks):
    """One iteration's gradient order and gaps, per-tensor forward spans and optimizer time (µs),
    from its hooks' marks and `marks` = (start, loss done, backward done, step done)."""
    start, loss_done, backward_done, step_done = marks
    order, backward, previous = [], {}, loss_done
    for index, at in ready:
        if index in backward:  # a shared parameter accumulates twice: keep the last
            order.remove(index)
        order.append(index)
        backward[index] = max(clock.elapsed_us(previous, at), 0.0)
        previous = at
    forward_us = {i: 0.0 for i in range(len(named))}

    def attribute(params, span):
        total = sum(named[i][1].numel() for i in params)
        for i in params:
            forward_us[i] += span * named[i][1].numel() / total

    previous, last = start, None
    for owner, at in forward:
        attribute(owners[owner], clock.elapsed_us(previous, at))
        previous, last = at, owners[owner]
    if last:
        # The work after the last parameterized module (the head's activation, the loss) joins it.
        attribute(last, max(clock.elapsed_us(previous, loss_done), 0.0))
    return {"order": order, "backward": backward, "forward": forward_us,
            "optimizer": clock.elapsed_us(backward_done, step_done)}
