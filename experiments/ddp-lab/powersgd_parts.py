"""Times the passes of DDP's powerSGD_hook (PyTorch's ddp_comm_hooks/powerSGD_hook.py) on this lab's model, one torch thread.

    target/pyenv/bin/python experiments/ddp-lab/powersgd_parts.py

The hook's synchronous work on one bucket of the model's 10 weights of 1024 x 1024 at rank 4:
error feedback (`input.add_(error)`), the copy it keeps (`torch.clone`, fresh memory), the three
batched products (P = M Q, Q = Mᵀ P, M = P Qᵀ) and the new error (`input_cp - input`, fresh
memory), each the median of 7 timings; the same subtraction into kept memory shows what the fresh
allocations cost. Prints one line per pass, in ms.
"""

import statistics
import time

import torch


def median_ms(work, repeats=7):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    weights = [torch.randn(1, 1024, 1024) for _ in range(10)]
    qs = [torch.randn(1, 1024, 4) for _ in range(10)]
    ps = [torch.empty(1, 1024, 4) for _ in range(10)]
    # The bucket: the weights and the model's 32 vectors of 1024.
    bucket = torch.randn(10 * 1024 * 1024 + 32 * 1024)
    error = torch.zeros_like(bucket)
    kept = torch.empty_like(bucket)
    copy = torch.clone(bucket)
    passes = [
        ("error feedback, input.add_(error)", lambda: bucket.add_(error)),
        ("torch.clone(input), fresh memory", lambda: torch.clone(bucket)),
        ("P = M Q", lambda: [torch.bmm(m, q, out=p) for m, q, p in zip(weights, qs, ps)]),
        ("Q = M^T P", lambda: [torch.bmm(m.transpose(1, 2), p, out=q) for m, q, p in zip(weights, qs, ps)]),
        ("M = P Q^T", lambda: [torch.bmm(p, q.transpose(1, 2), out=m) for m, q, p in zip(weights, qs, ps)]),
        ("error = input_cp - input, fresh memory", lambda: copy - bucket),
        ("the same into kept memory", lambda: torch.sub(copy, bucket, out=kept)),
    ]
    for name, work in passes:
        print(f"{median_ms(work):7.1f} ms  {name}")


if __name__ == "__main__":
    main()
