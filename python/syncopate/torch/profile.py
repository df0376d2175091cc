"""model_profile: a Syncopate model profile (profiles/models/*.json schema) recorded from a real torch module on the CPU, so that a plan can be made for it."""

import math
import statistics
import time

import torch


def model_profile(module, loss_fn, *, name, batch_size, device="host-2core", iterations=5, warmup=2, lr=0.01):
    """Runs `loss_fn()` (forward, returning the loss) and its backward `warmup + iterations`
    times with an SGD step and records: the trainable parameters in gradient-ready order
    (post-accumulate-grad hooks), the gap before each gradient, each parameterized module's
    forward time split over its parameters by size, and the optimizer step; medians of the
    measured iterations. `device` names the device profile the timings belong to."""
    if iterations < 1 or warmup < 0 or batch_size < 1:
        raise ValueError("model_profile: iterations and batch_size must be at least 1, warmup at least 0")
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    if not named:
        raise ValueError("model_profile: the module has no trainable parameters")
    registration = {id(p): i for i, (_, p) in enumerate(named)}
    optimizer = torch.optim.SGD([p for _, p in named], lr=lr)
    ready, forward = [], []
    handles = [p.register_post_accumulate_grad_hook(lambda q: ready.append((registration[id(q)], time.perf_counter_ns())))
               for _, p in named]
    owners = {}
    for owner in module.modules():
        own = [registration[id(p)] for p in owner.parameters(recurse=False) if id(p) in registration]
        if own:
            owners[owner] = own
            handles.append(owner.register_forward_hook(lambda m, _i, _o: forward.append((m, time.perf_counter_ns()))))
    samples = []
    try:
        for step in range(warmup + iterations):
            ready.clear()
            forward.clear()
            optimizer.zero_grad(set_to_none=True)
            start = time.perf_counter_ns()
            loss = loss_fn()
            loss_done = time.perf_counter_ns()
            loss.backward()
            backward_done = time.perf_counter_ns()
            optimizer.step()
            step_done = time.perf_counter_ns()
            if step >= warmup:
                samples.append(_sample(named, owners, ready, forward, start, loss_done, backward_done, step_done))
    finally:
        for handle in handles:
            handle.remove()
    order = samples[-1]["order"]
    if len(order) != len(named):
        missing = sorted(set(range(len(named))) - set(order))
        raise ValueError(f"model_profile: {len(missing)} parameters never received a gradient, e.g. {named[missing[0]][0]}")
    median = statistics.median
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
            "backward_us": round(median(s["backward"][index] for s in samples), 3),
            "forward_us": round(median(s["forward"][index] for s in samples), 3),
        })
    method = f"perf_counter on the CPU, median of {iterations} iterations after {warmup} warm-up, PyTorch {torch.__version__}"
    return {
        "format_version": 1,
        "name": name,
        "description": f"{type(module).__name__} ({len(tensors)} parameter tensors), recorded by syncopate.torch.model_profile",
        "source": "syncopate.torch.model_profile",
        "device": device,
        "framework": f"PyTorch {torch.__version__}",
        "batch_size_per_gpu": batch_size,
        "sample_unit": "samples",
        "timing": {
            "backward": {"status": "measured", "method": "post-accumulate-grad hooks, " + method},
            "forward": {"status": "measured",
                        "method": "forward hooks on parameterized modules, split by element count; " + method},
            "optimizer": {"status": "measured", "method": "SGD step, " + method},
        },
        "optimizer_us": round(median(s["optimizer"] for s in samples), 3),
        "tensors": tensors,
    }


def _sample(named, owners, ready, forward, start, loss_done, backward_done, step_done):
    """One iteration's gradient order and gaps, per-tensor forward spans and optimizer time (µs)."""
    order, backward, previous = [], {}, loss_done
    for index, at in ready:
        if index in backward:  # a shared parameter accumulates twice: keep the last
            order.remove(index)
        order.append(index)
        backward[index] = max(at - previous, 0) / 1e3
        previous = at
    forward_us = {i: 0.0 for i in range(len(named))}
    previous, last = start, None
    for owner, at in forward:
        params = owners[owner]
        total = sum(named[i][1].numel() for i in params)
        for i in params:
            forward_us[i] += (at - previous) / 1e3 * named[i][1].numel() / total
        previous, last = at, params
    if last:
        # The work after the last parameterized module (the loss) joins it.
        total = sum(named[i][1].numel() for i in last)
        for i in last:
            forward_us[i] += max(loss_done - previous, 0) / 1e3 * named[i][1].numel() / total
    return {"order": order, "backward": backward, "forward": forward_us, "optimizer": (step_done - backward_done) / 1e3}
