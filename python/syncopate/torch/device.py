"""Where a run's tensors live, and which plans run there: the CPU over gloo, or one CUDA device over NCCL.

On a CUDA device the fusion buffers, the collectives and the results stay on the GPU. The codecs
are the Rust state's CPU codecs, so on CUDA only plans whose every piece has no codec work run:
the identity codec (no compressor, no memory) summed by an allreduce, flat or hierarchical.
Anything else is refused by name rather than run through the CPU, which the plan did not price.
"""

import torch
import torch.distributed as dist

from syncopate import SyncopateError
from syncopate.torch.schedule import exchange_of, is_identity

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
    for index, piece in enumerate(layout.pieces):
        if not is_identity(piece):
            first, _ = exchange_of(piece["rounds"][0])
            what = f"compressor {piece['compressor']}, memory {piece['memory']}, exchange {first}"
            return (f"group {piece['group']} (piece {index}: {what}) needs codecs or an exchange that syncopate.torch "
                    f"runs on the CPU only; on {device} it runs uncompressed plans summed by an allreduce (`syncopate "
                    "exec --backend cuda` runs every plan on GPUs)")
    if layout.overlap:
        return "it updates each group before its next forward, which syncopate.torch runs on the CPU only"
    return None


def first_non_finite(buffers, spans):
    """(group, element) of the first non-finite value among `spans` ((group, slice) pairs) of the
    group `buffers`, or None: the slow search that names a bad gradient once a device flag says
    there is one."""
    for group, span in spans:
        bad = (~torch.isfinite(buffers[group][span])).nonzero()
        if bad.numel():
            return group, span.start + int(bad[0, 0])
    return None
