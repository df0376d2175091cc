"""Runs a function on 2 ranks, each a separate process on localhost: gloo, or NCCL on one GPU.

It returns what each returned or raises what one raised.
"""

import datetime
import multiprocessing
import os
import queue as queue_module
import time
import traceback

import conftest


def _main(function, rank, world, port, queue, backend, args, kwargs):
    import torch
    import torch.distributed as dist

    try:
        if backend == "nccl":
            # Every rank on GPU 0, each made a host of its own so that NCCL accepts two ranks on
            # one device (over its socket transport; functional only, NVIDIA does not support it).
            os.environ.update(NCCL_HOSTID=f"syncopate-test-{rank}", NCCL_SOCKET_IFNAME="lo", NCCL_IB_DISABLE="1")
            torch.cuda.set_device(0)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=30))
        value = function(rank, world, *args, **kwargs)
        queue.put((rank, "ok", value))
    except BaseException as err:  # reported to the test, which re-raises it
        queue.put((rank, "error", (type(err).__name__, str(err), traceback.format_exc())))
    finally:
        # Flush the result, then leave without waiting for gloo's threads.
        queue.close()
        queue.join_thread()
        os._exit(0)


def run(function, *args, world=2, timeout=240, backend="gloo", **kwargs):
    """`function(rank, world, *args, **kwargs)` on every rank of a `backend` process group; a list of
    their return values, in rank order, or a RankError for the first rank that raised."""
    # One compute thread per rank: two ranks of OpenMP threads spinning on a shared machine
    # slow each other down by orders of magnitude.
    os.environ["OMP_NUM_THREADS"] = "1"
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    port = conftest.free_port()
    processes = [context.Process(target=_main, args=(function, r, world, port, queue, backend, args, kwargs))
                 for r in range(world)]
    for p in processes:
        p.start()
    results = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world:
            if time.monotonic() > deadline:
                raise RankError(f"no result from ranks {sorted(set(range(world)) - set(results))} within {timeout} s")
            try:
                rank, status, value = queue.get(timeout=1)
                results[rank] = (status, value)
            except queue_module.Empty:
                # A rank that died without reporting (killed, crashed in bootstrap) is an error too.
                for r, p in enumerate(processes):
                    if r not in results and p.exitcode is not None and queue.empty():
                        results[r] = ("error", ("Exit", f"exited with code {p.exitcode} without a result", ""))
    finally:
        for p in processes:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(world)]


class RankError(Exception):
    pass


def values(outcomes):
    """The ranks' return values, or a RankError naming the first failure."""
    for rank, (status, value) in enumerate(outcomes):
        if status == "error":
            raise RankError(f"rank {rank}: {value[0]}: {value[1]}\n{value[2]}")
    return [value for _, value in outcomes]
