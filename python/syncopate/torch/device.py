"""Where a run's tensors live, and which plans run there: the CPU over gloo, or one CUDA device over NCCL.

On a CUDA device the fusion buffers, the payloads, the collectives, the codecs (the project's
CUDA kernels, `syncopate.DeviceRank`) and the results stay on the GPU. What the device cannot
run as the plan prices it is refused by name rather than run through the CPU: compressors
without GPU kernels, the CaSync-Ring and parameter servers (point-to-point exchanges that
`syncopate exec --backend cuda` runs) and several communication streams.
"""

import site
import sys

import torch
import torch.distributed as dist

from syncopate import DeviceRank, Rank, SyncopateError, device_refusal
from syncopate.torch.schedule import is_identity

# The collective library torch.distributed must use for each kind of device.
BACKENDS = {"cpu": "gloo", "cuda": "nccl"}


def device_of(params, names):
    """The one device every parameter is on (the CPU or one CUDA device); raises naming a
    parameter that is elsewhere."""
    device = params[0].device
    for param, name in zip(params, names):
        if param.device != device:
            raise SyncopateError(f"parameter {name} is on {param.device}, {names[0]} on {device}: "
                                 "every parameter must be on one device")
    if device.type not in BACKENDS:
        raise SyncopateError(f"parameter {names[0]} is on {device}: the CPU or a CUDA device only")
    return device


def check_backend(device):
    """Raises unless torch.distributed runs the collective library `device` needs, and on a CUDA
    device unless it is the current one (NCCL binds a group's communicator to the current
    device when it makes it)."""
    if device.type == "cuda" and torch.cuda.current_device() != device.index:
        raise SyncopateError(f"the parameters are on {device}, the current CUDA device is "
                             f"cuda:{torch.cuda.current_device()}: call torch.cuda.set_device({device.index}) first")
    backend = dist.get_backend()
    # A group made without a backend is "cpu:gloo,cuda:nccl": one per device type.
    if BACKENDS[device.type] not in backend.split(",") and f"{device.type}:{BACKENDS[device.type]}" not in backend:
        raise SyncopateError(f"the parameters are on {device}, which needs the {BACKENDS[device.type]} backend; "
                             f"torch.distributed was initialized with {backend}")


def refusal(device, layout, comm_streams):
    """Why a plan (its `layout`, on `comm_streams` communication streams) cannot run on
    `device`, or None when it can."""
    if device.type == "cpu":
        return None
    if comm_streams > 1:
        # One thread per stream would issue collectives to several communicators of one GPU at
        # once, which NCCL's documentation says is not safe ("Thread Safety").
        return (f"its {comm_streams} communication streams would each issue NCCL collectives from a thread of "
                f"their own on {device}, which NCCL does not support; make the plan with one stream")
    return device_refusal(layout.schedule_json)


def codec_state(device, layout, rank, seed):
    """This rank's codec state: the device's kernels on a CUDA device when a piece has codec
    work (`DeviceRank`, which compiles them on first use), else the CPU codecs (`Rank`; the
    identity codec has no work of its own)."""
    if device.type == "cuda" and not all(is_identity(p) for p in layout.pieces):
        sites = site.getsitepackages() + [site.getusersitepackages()] + sys.path
        return DeviceRank(layout.schedule_json, rank, seed, device.index, sites)
    return Rank(layout.schedule_json, rank, seed)


def first_non_finite(buffers, spans):
    """(group, element) of the first non-finite value among `spans` ((group, slice) pairs) of the
    group `buffers`, or None: the slow search that names a bad gradient once a device flag says
    there is one."""
    for group, span in spans:
        bad = (~torch.isfinite(buffers[group][span])).nonzero()
        if bad.numel():
            return group, span.start + int(bad[0, 0])
    return None
