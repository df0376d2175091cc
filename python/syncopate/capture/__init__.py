"""`python -m syncopate.capture`: records a model profile, on one GPU or the CPU.

The model is a torchvision, Hugging Face or user-supplied one, recorded with
syncopate.torch.model_profile's hooks.
"""

import json
import os
import shlex
import sys

from syncopate.capture.arguments import parser
from syncopate.capture.failure import CaptureError

__all__ = ["CaptureError", "main"]


def main(argv=None):
    """Runs the tool on `argv` (default: the command line): builds the model and one fixed batch
    of inputs, trains it for --warmup + --iterations steps and writes the profile with the batch,
    the thread counts and the command line as its `source`. Returns the exit status: 0, 1 for an
    error, 2 for bad usage (argparse exits), 3 when --device cuda finds no GPU; each failure is
    one line naming the flag or value at fault."""
    argv = sys.argv[1:] if argv is None else list(argv)
    usage = parser()
    args = usage.parse_args(argv)
    try:
        capture(args, argv, usage)
    except CaptureError as failed:
        print(f"error: {failed}", file=sys.stderr)
        return failed.exit_code
    return 0


def capture(args, argv, usage):
    """Measures the model the arguments name and writes its profile to --out."""
    directory = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(directory):
        raise CaptureError(f"--out {args.out}: the directory {directory} does not exist")
    try:
        import torch
    except ModuleNotFoundError:
        raise CaptureError(f"the capture needs PyTorch, which {sys.executable} lacks: pip install torch") from None
    from syncopate.capture.workloads import build, describe
    from syncopate.torch.profile import model_profile

    device = resolve_device(torch, args.device, usage)
    device_name = args.device_name or default_device_name(torch, device, usage)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.tf32 and device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32 == "on"
    torch.manual_seed(0)  # the same sizes and inputs on every run
    workload = build(args, device)
    workload.module.train()
    trainable = [p for p in workload.module.parameters() if p.requires_grad]
    if not trainable:
        raise CaptureError(f"{workload.name}: the module has no trainable parameters")
    optimizer = (torch.optim.SGD(trainable, lr=0.01, momentum=0.9) if args.optimizer == "sgd"
                 else torch.optim.Adam(trainable, lr=1e-4))
    try:
        profile = model_profile(workload.module, workload.loss_fn, name=args.name or workload.name,
                                batch_size=args.batch_size, device=device_name, iterations=args.iterations,
                                warmup=args.warmup, optimizer=optimizer, amp=args.amp,
                                sample_unit=workload.sample_unit)
    except ValueError as failed:
        raise CaptureError(str(failed)) from None
    except Exception as failed:  # the model's own code: a shape mismatch, out of memory
        raise CaptureError(f"{workload.name}: a training step raised {describe(failed)}") from None
    made_by = "passed to the factory as batch_size" if args.module else "the batch of the random inputs made"
    profile["description"] = workload.description + tf32_note(torch, device)
    profile["source"] = f"recorded by python -m syncopate.capture {shlex.join(argv)}"
    profile["timing"]["batch"]["method"] = f"--batch-size {args.batch_size}, {made_by}"
    try:
        with open(args.out, "w") as out:
            json.dump(profile, out, indent=2)
            out.write("\n")
    except OSError as failed:
        raise CaptureError(f"--out {args.out}: {failed.strerror}") from None
    summarize(args.out, profile)


def resolve_device(torch, text, usage):
    """The torch.device of --device (default: the current GPU when there is one, else the CPU)."""
    if text is None:
        text = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(text)
    except RuntimeError:
        usage.error(f"argument --device: {text!r} is not a device (cpu, cuda or cuda:N)")
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        usage.error(f"argument --device: {text!r}: the capture times cpu or cuda devices")
    if not torch.cuda.is_available():
        raise CaptureError(f"--device {text} needs a GPU, and PyTorch sees none "
                           "(torch.cuda.is_available() is False)", exit_code=3)
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise CaptureError(f"--device {text}: PyTorch sees {torch.cuda.device_count()} GPU(s)")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def tf32_note(torch, device):
    """Which fp32 kernels could use TF32 tensor cores while the capture ran (GPUs only)."""
    if device.type != "cuda":
        return ""
    state = {True: "on", False: "off"}
    return (f"; TF32 for fp32 matrix products {state[torch.backends.cuda.matmul.allow_tf32]}, "
            f"for convolutions {state[torch.backends.cudnn.allow_tf32]}")


def default_device_name(torch, device, usage):
    """A device-profile-like name from the GPU's marketing name ("NVIDIA H100 80GB HBM3" →
    "nvidia-h100-80gb-hbm3"); a CPU has none, so a CPU run must name its host profile."""
    if device.type != "cuda":
        usage.error("--device-name is required on the CPU: name the host's device profile (e.g. host-2core, "
                    "or one measured by `syncopate profile --backend host`)")
    raw = torch.cuda.get_device_name(device)
    return "-".join("".join(c.lower() if c.isalnum() else " " for c in raw).split())


def summarize(path, profile):
    """One line on stderr: what was written and the totals."""
    tensors = profile["tensors"]
    forward = sum(t["forward_us"] for t in tensors) / 1e3
    backward = sum(t["backward_us"] for t in tensors) / 1e3
    threads = profile["threads"]
    print(f"wrote {path}: {len(tensors)} tensors, forward {forward:.2f} ms, backward {backward:.2f} ms, "
          f"optimizer {profile['optimizer_us'] / 1e3:.2f} ms at batch {profile['batch_size_per_gpu']} on "
          f"{profile['device']} ({threads['intra_op']} intra-op / {threads['inter_op']} inter-op threads)",
          file=sys.stderr)
