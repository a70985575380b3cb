"""Moved to :mod:`agent.runtime.echo`; this address stays for code written against it."""

from agent.runtime.echo import (
    RATE,
    SEGMENT_S,
    SURE_DB,
    DelayEstimator,
    EchoCanceller,
    EchoStats,
    echo_transcript,
    residue_transcript,
)

__all__ = [
    "RATE",
    "SEGMENT_S",
    "SURE_DB",
    "DelayEstimator",
    "EchoCanceller",
    "EchoStats",
    "echo_transcript",
    "residue_transcript",
]
