"""What a replica's ``GET /readyz`` says about placing new work on it, in one place.

Both the clients' replica placement (``tts_service.replicas``) and the HAProxy agent-check
responder (``tts_service.haproxy_agent``) read ``/readyz`` and need the same two answers: may a
new context go there at all, and how loaded is it (0..1). The server's body has changed shape
over time, so the reading is tolerant: ``load`` in 0..1 is the server's own figure
(``streamvox_load``; such servers also report ``busy_streams``); older servers report ``load`` as
a count of busy streams, which is turned into a share of ``capacity_streams``; anything else falls
back to ``active_streams`` over capacity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

READYZ_PATH = "/readyz"


@dataclass(frozen=True, slots=True)
class Readiness:
    """One replica's ``/readyz`` answer, reduced to what placement needs."""

    accepting: bool  # HTTP 200: a new stream would be admitted now
    load: float  # 0 = idle .. 1 = full (1.0 when not accepting)
    draining: bool = False  # the replica is shutting down (never coming back as it is)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def load_of(body: dict[str, Any]) -> float:
    """The replica's load in 0..1 from a ``/readyz`` body (see the module docstring)."""
    load = body.get("streamvox_load", body.get("load"))
    capacity = _number(body.get("capacity_streams"))
    fraction = isinstance(load, float) or "busy_streams" in body  # a server that reports its own share
    if fraction and _number(load) is not None:
        share = float(load)
    elif _number(load) is not None and capacity:
        share = float(load) / capacity
    elif _number(body.get("active_streams")) is not None and capacity:
        share = float(body["active_streams"]) / capacity
    else:
        share = 0.0 if body.get("ready", True) else 1.0
    return min(1.0, max(0.0, share))


def readiness(status: int, body: Any) -> Readiness:
    """Interpret one ``/readyz`` response (``body`` as decoded JSON, or anything else)."""
    if not isinstance(body, dict):
        return Readiness(accepting=False, load=1.0)
    draining = bool(body.get("draining")) or body.get("status") == "draining"
    if status != 200 or draining:
        return Readiness(accepting=False, load=1.0, draining=draining)
    return Readiness(accepting=True, load=load_of(body))
