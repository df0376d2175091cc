"""Syncopate from Python: lower a plan for a run's ranks, the Rust codecs, and (in `syncopate.torch`) the executor that runs a plan's Schedule inside PyTorch training."""

from syncopate._syncopate import (
    Checker,
    Launcher,
    NonFiniteError,
    Rank,
    SyncopateError,
    compressors,
    encode_reference,
    lower,
    write_trace,
)
from syncopate.errors import CheckFailed, NonFiniteGradient, PeerFailure, PlanMismatch

__all__ = [
    "Checker",
    "CheckFailed",
    "Launcher",
    "NonFiniteError",
    "NonFiniteGradient",
    "PeerFailure",
    "PlanMismatch",
    "Rank",
    "SyncopateError",
    "compressors",
    "encode_reference",
    "lower",
    "write_trace",
]
