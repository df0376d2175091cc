"""Syncopate from Python: plan lowering, the Rust codecs, the executor and the profile capture.

Lower a plan for a run's ranks and use the Rust codecs; `syncopate.torch` has the executor that runs
a plan's Schedule inside PyTorch training, and `python -m syncopate.capture` is the tool that
records a model profile.
"""

from syncopate._syncopate import (
    Checker,
    Dependencies,
    DeviceRank,
    Launcher,
    NonFiniteError,
    Rank,
    SyncopateError,
    compressors,
    device_refusal,
    encode_reference,
    lower,
    write_trace,
)
from syncopate.errors import CheckFailed, NonFiniteGradient, PeerFailure, PlanMismatch

__all__ = [
    "Checker",
    "CheckFailed",
    "Dependencies",
    "DeviceRank",
    "Launcher",
    "NonFiniteError",
    "NonFiniteGradient",
    "PeerFailure",
    "PlanMismatch",
    "Rank",
    "SyncopateError",
    "compressors",
    "device_refusal",
    "encode_reference",
    "lower",
    "write_trace",
]
