"""The clocks a model profile is timed with, behind one mark / sync / elapsed interface.

They are perf_counter on the CPU and CUDA events on a GPU.
"""

import time

import torch


class CpuClock:
    """Marks are perf_counter readings: the CPU runs each operator before the next mark."""

    description = "perf_counter on the CPU"

    def mark(self):
        return time.perf_counter_ns()

    def sync(self):
        pass

    def elapsed_us(self, start, end):
        return (end - start) / 1e3


class CudaClock:
    """Marks are CUDA events on the device's current stream: the host only queues kernels, so a
    mark records when the GPU reaches it, readable after `sync()`."""

    def __init__(self, device):
        self.device = device
        self.description = f"CUDA events on {torch.cuda.get_device_name(device)}"

    def mark(self):
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def sync(self):
        torch.cuda.synchronize(self.device)

    def elapsed_us(self, start, end):
        return start.elapsed_time(end) * 1e3


def clock_for(device):
    """The clock that times work on `device` (a torch.device)."""
    return CudaClock(device) if device.type == "cuda" else CpuClock()
