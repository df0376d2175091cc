"""The exceptions syncopate.torch raises; all derive from SyncopateError.

Each names the plan, tensor, rank or step involved.
"""

from syncopate._syncopate import PlanMismatch, SyncopateError

__all__ = ["CheckFailed", "NonFiniteGradient", "PeerFailure", "PlanMismatch", "SyncopateError"]


class NonFiniteGradient(SyncopateError):
    """A gradient holds NaN or infinity (named by tensor, element, rank and iteration)."""


class PeerFailure(SyncopateError):
    """A collective failed or timed out: a peer died, hung or left the process group."""


class CheckFailed(SyncopateError):
    """`check`: an aggregated gradient differs from the reference aggregation beyond tolerance."""
