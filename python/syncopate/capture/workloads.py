"""What `python -m syncopate.capture` trains, each with one fixed batch.

That is a torchvision model on random images, a Hugging Face model on random tokens, or the user's
own module from a factory.
"""

import dataclasses
import difflib
import importlib
import traceback

import torch

from syncopate.capture.failure import CaptureError


@dataclasses.dataclass
class Workload:
    """A module on the capture's device and `loss_fn()`, its forward on one batch returning the
    loss, with the profile's default name, description and sample unit."""

    module: torch.nn.Module
    loss_fn: object
    name: str
    description: str
    sample_unit: str


def build(args, device):
    """The workload the arguments name."""
    if args.torchvision:
        return torchvision_workload(args.torchvision, args.batch_size, args.image_size, device)
    if args.hf:
        return hf_workload(args.hf, args.task, args.hf_from_config, args.batch_size, args.seq_len, device)
    return module_workload(args.module, args.batch_size, args.sample_unit, device)


def require(package, flag):
    """Imports an optional package, or fails naming it and how to install it."""
    try:
        return importlib.import_module(package)
    except ModuleNotFoundError as missing:
        if missing.name != package:
            raise CaptureError(f"{flag}: importing {package} failed: {missing}") from None
        raise CaptureError(f"{flag} needs the `{package}` package, which is not installed: "
                           f"pip install {package} (or capture your own module with --module)") from None
    except ImportError as broken:
        raise CaptureError(f"{flag}: importing {package} failed: {broken}") from None


def torchvision_workload(name, batch_size, image_size, device):
    """torchvision.models' `name` with random weights on random images of 1000 classes."""
    torchvision = require("torchvision", "--torchvision")
    known = torchvision.models.list_models()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; torchvision.models.list_models() names them"
        raise CaptureError(f"--torchvision {name}: torchvision has no such model{hint}")
    # Inception v3 trains with its auxiliary classifier; skipping its weight init saves minutes.
    kwargs = {"aux_logits": True, "init_weights": False} if name == "inception_v3" else {}
    model = torchvision.models.get_model(name, weights=None, **kwargs).to(device)
    images = torch.randn(batch_size, 3, image_size, image_size, device=device)
    labels = torch.randint(0, 1000, (batch_size,), device=device)

    def loss():
        out = model(images)
        if not isinstance(out, tuple):
            return torch.nn.functional.cross_entropy(out, labels)
        # Inception v3 and GoogLeNet return (logits, auxiliary logits...): the auxiliary
        # classifiers train too (weighted 0.3, as in the GoogLeNet paper), so that their
        # parameters get gradients, as in the shipped inception-v3 profile.
        main, *auxiliary = (o for o in out if o is not None)
        return torch.nn.functional.cross_entropy(main, labels) + sum(
            0.3 * torch.nn.functional.cross_entropy(a, labels) for a in auxiliary)

    return Workload(model, loss, name, f"{name} (torchvision), {image_size}x{image_size}", "images")


def hf_workload(name, task, from_config, batch_size, seq_len, device):
    """A Hugging Face model with the head of `task`, on random tokens with that task's labels."""
    transformers = require("transformers", "--hf")
    heads = {
        "sequence-classification": transformers.AutoModelForSequenceClassification,
        "causal-lm": transformers.AutoModelForCausalLM,
        "masked-lm": transformers.AutoModelForMaskedLM,
        "question-answering": transformers.AutoModelForQuestionAnswering,
    }
    try:
        if from_config:
            # A bare model type ("bert", "gpt2") gives the library's default configuration, the
            # base model's architecture, with no download: GPU machines are often offline.
            config = (transformers.AutoConfig.for_model(name) if name in transformers.CONFIG_MAPPING
                      else transformers.AutoConfig.from_pretrained(name))
            model = heads[task].from_config(config)
        else:
            model = heads[task].from_pretrained(name)
    except (OSError, ValueError, KeyError) as failed:
        raise CaptureError(f"--hf {name} (--task {task}): {failed}") from None
    model = model.to(device)
    tokens = torch.randint(0, model.config.vocab_size, (batch_size, seq_len), device=device)
    if task == "question-answering":
        # Answer spans as SQuAD fine-tuning has them: a start and an end position per sequence.
        start = torch.randint(0, seq_len, (batch_size,), device=device)
        labels = {"start_positions": start, "end_positions": torch.clamp(start + 8, max=seq_len - 1)}
    elif task == "sequence-classification":
        labels = {"labels": torch.randint(0, model.config.num_labels, (batch_size,), device=device)}
    else:
        labels = {"labels": tokens}

    def loss():
        return model(input_ids=tokens, **labels).loss

    short = name.rstrip("/").split("/")[-1]
    return Workload(model, loss, short, f"{name} ({task}, transformers), {seq_len} tokens", "sequences")


def module_workload(spec, batch_size, sample_unit, device):
    """The user's `package.module:factory`, called as factory(batch_size=B, device=D), which
    returns (module, loss_fn): the module on D and loss_fn() its forward on one batch of B
    samples on D, returning the loss."""
    module_name, _, factory_name = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), factory_name)
    except ModuleNotFoundError as missing:
        raise CaptureError(f"--module {spec}: cannot import {module_name} ({missing}); the current "
                           "directory and PYTHONPATH are searched") from None
    except AttributeError:
        raise CaptureError(f"--module {spec}: {module_name} has no attribute `{factory_name}`") from None
    except Exception as failed:  # the user's module raised while importing
        raise CaptureError(f"--module {spec}: importing {module_name} raised {describe(failed)}") from None
    if not callable(factory):
        raise CaptureError(f"--module {spec}: `{factory_name}` is not callable (it is a {type(factory).__name__})")
    call = f"{factory_name}(batch_size={batch_size}, device={str(device)!r})"
    try:
        made = factory(batch_size=batch_size, device=device)
    except Exception as failed:
        raise CaptureError(f"--module {spec}: {call} raised {describe(failed)}") from None
    if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module)
            and callable(made[1])):
        raise CaptureError(f"--module {spec}: {call} returned {type(made).__name__}; it must return "
                           "(module, loss_fn): a torch.nn.Module and a callable returning the loss")
    module, loss_fn = made
    description = f"{type(module).__name__} from {spec}, batch {batch_size}"
    return Workload(module, loss_fn, factory_name, description, sample_unit)


def describe(exception):
    """`Type: message (at file:line)` of where the exception was raised, for a one-line error."""
    frames = traceback.extract_tb(exception.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exception).__name__}: {exception}{where}"
