"""Moved to :mod:`agent.runtime.jitter`; this address stays for code written against it."""

from agent.runtime.jitter import AdaptiveJitterBuffer, JitterState, JitterStats

__all__ = ["AdaptiveJitterBuffer", "JitterState", "JitterStats"]
