"""Moved to :mod:`agent.runtime.echo`; this address stays for code written against it."""

from agent.runtime.echo import RATE, DelayEstimator, EchoCanceller, EchoStats, echo_transcript

__all__ = ["RATE", "DelayEstimator", "EchoCanceller", "EchoStats", "echo_transcript"]
