"""Moved to :mod:`agent.runtime.bargein`; this address stays for code written against it."""

from agent.runtime.bargein import (
    BargeIn,
    BargeInEvent,
    BargeInIgnored,
    BargeInMetrics,
    BargeInOptions,
    BargeInRecord,
    FalseInterruption,
)

__all__ = [
    "BargeIn",
    "BargeInEvent",
    "BargeInIgnored",
    "BargeInMetrics",
    "BargeInOptions",
    "BargeInRecord",
    "FalseInterruption",
]
