"""The command line of `python -m syncopate.capture`: model, input, measurement and output.

It says which model, its input, the measurement and the output; out-of-range numbers are usage
errors (exit 2) naming the flag.
"""

import argparse
import re

# The largest numbers accepted: far beyond a real capture, small enough to stay exact.
MAX_BATCH = 1 << 20
MAX_IMAGE_SIZE = 1 << 14
MAX_SEQ_LEN = 1 << 20
MAX_ITERATIONS = 100_000
MAX_THREADS = 1 << 16

HF_TASKS = ("sequence-classification", "causal-lm", "masked-lm", "question-answering")
MODULE_SPEC = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")

USAGE_EXAMPLES = """examples:
  python -m syncopate.capture --torchvision resnet50 --batch-size 32 --device-name h100-sxm5-80gb --out resnet50-h100.json
  python -m syncopate.capture --hf gpt2 --hf-from-config --task causal-lm --seq-len 1024 --batch-size 4 --device-name h100-sxm5-80gb --out gpt2-h100.json
  python -m syncopate.capture --module mymodels:make --batch-size 8 --device cpu --device-name host-2core --out mine.json

--module PACKAGE.MODULE:FACTORY imports PACKAGE.MODULE (from the current directory or PYTHONPATH)
and calls FACTORY(batch_size=B, device=D) with B from --batch-size and D the torch.device; it returns
(module, loss_fn): a torch.nn.Module on D and a function that runs its forward on one batch of B
samples on D and returns the loss. No torchvision or transformers is needed for it."""


def in_range(low, high):
    """An argparse type: an integer from `low` to `high`."""

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {low} to {high}, got {value}")
        return value

    return parse


def module_spec(text):
    """An argparse type: PACKAGE.MODULE:FACTORY."""
    if not MODULE_SPEC.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not PACKAGE.MODULE:FACTORY (e.g. mymodels:make)")
    return text


def parser():
    p = argparse.ArgumentParser(
        prog="python -m syncopate.capture",
        description="Records a Syncopate model profile (profiles/models/*.json schema) from a PyTorch model "
                    "trained for a few iterations on one GPU (CUDA events) or the CPU (perf_counter).",
        epilog=USAGE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--torchvision", metavar="NAME", help="a torchvision.models model, e.g. resnet50 (needs torchvision)")
    source.add_argument("--hf", metavar="NAME_OR_PATH",
                        help="a Hugging Face model id or local path (needs transformers)")
    source.add_argument("--module", metavar="PACKAGE.MODULE:FACTORY", type=module_spec,
                        help="your own model: FACTORY(batch_size=, device=) returns (module, loss_fn); see below")
    p.add_argument("--task", default="sequence-classification", choices=HF_TASKS,
                   help="the Hugging Face head to train (default: sequence-classification)")
    p.add_argument("--hf-from-config", action="store_true",
                   help="build the HF model from its config with random weights (no weight download); "
                        "a bare model type such as bert or gpt2 needs no download at all")
    p.add_argument("--batch-size", type=in_range(1, MAX_BATCH), required=True, help="samples per GPU")
    p.add_argument("--image-size", type=in_range(1, MAX_IMAGE_SIZE), default=224,
                   help="torchvision input height and width (default: 224)")
    p.add_argument("--seq-len", type=in_range(1, MAX_SEQ_LEN), default=128,
                   help="Hugging Face input length in tokens (default: 128)")
    p.add_argument("--sample-unit", default="samples", help="--module: what one sample is (default: samples)")
    p.add_argument("--warmup", type=in_range(0, MAX_ITERATIONS), default=5, help="unmeasured iterations first (default: 5)")
    p.add_argument("--iterations", type=in_range(1, MAX_ITERATIONS), default=20,
                   help="measured iterations; each time is their median (default: 20)")
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd",
                   help="sgd (momentum 0.9, the default) or adam")
    p.add_argument("--amp", action="store_true",
                   help="mixed precision: autocast to fp16 with a gradient scaler on a GPU, bf16 on the CPU")
    p.add_argument("--tf32", choices=["on", "off"], default=None,
                   help="on a GPU: let fp32 matrix products and convolutions use TF32 tensor cores, or not "
                        "(torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32; "
                        "default: PyTorch's, which is off for matrix products and on for convolutions)")
    p.add_argument("--threads", type=in_range(1, MAX_THREADS), default=None,
                   help="PyTorch's intra-op threads (torch.set_num_threads; default: PyTorch's choice); "
                        "the profile records the counts used either way")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    p.add_argument("--device-name", default=None,
                   help="the device profile the timings belong to (e.g. h100-sxm5-80gb, host-2core); "
                        "default on a GPU: from its name; required on the CPU")
    p.add_argument("--name", default=None,
                   help="the profile's name (default: the model's, or FACTORY's with --module)")
    p.add_argument("--out", required=True, help="output JSON path")
    return p
