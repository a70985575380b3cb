"""The WebRTC uplink: hand the caller's audio to the agent as soon as each packet is in order.

Pipecat's SmallWebRTC transport receives through aiortc, whose audio receiver releases a packet
from its jitter buffer only once four later packets have arrived (``JitterBuffer(capacity=16,
prefetch=4)`` in ``aiortc.rtcrtpreceiver``). With Opus' 20 ms packets that holds the caller's
voice 80 ms before the VAD, the turn analyzer and the STT hear it: 80 ms on every reply and on
every barge-in. A cushion against network jitter is what a *player* needs, so that playout never
runs dry; the agent does not play this audio, it analyses it, and only needs the packets in
order. One packet (the next one, which says the current frame is complete) is the least aiortc's
buffer can hold; a packet that is missing still holds the ones after it until it arrives or the
buffer overflows, as before, so order is kept.

This is a process-wide setting of aiortc (a module global, read when a receiver is made), so the
demo agent sets it once at start-up; ``STREAMVOX_WEBRTC_PREFETCH`` overrides the packet count
(``4`` restores aiortc's own, to measure the difference). Video receivers are left alone.
"""

from __future__ import annotations

import os

DEFAULT_PREFETCH = 1
ENV = "STREAMVOX_WEBRTC_PREFETCH"
AIORTC_PREFETCH = 4  # what aiortc's audio receiver holds by itself (aiortc 1.x)


def audio_prefetch() -> int:
    """The packets an audio receiver holds, from ``STREAMVOX_WEBRTC_PREFETCH`` (default 1)."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return DEFAULT_PREFETCH
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r}: give a whole number of packets (1 = the fewest, 4 = aiortc's own)") from None
    if not 1 <= value <= 8:
        raise ValueError(f"{ENV}={value}: between 1 and 8 packets (1 = the fewest, 4 = aiortc's own)")
    return value


def release_audio_sooner(prefetch: int | None = None) -> int:
    """Make aiortc's audio receivers hold ``prefetch`` packets (default: :func:`audio_prefetch`).

    Affects receivers created afterwards, in this process. Returns the count in force.
    Idempotent: calling it again only changes the count.
    """
    import aiortc.rtcrtpreceiver as receiver
    from aiortc.jitterbuffer import JitterBuffer

    count = audio_prefetch() if prefetch is None else prefetch
    base = getattr(receiver.JitterBuffer, "_streamvox_base", receiver.JitterBuffer)
    if not (isinstance(base, type) and issubclass(base, JitterBuffer)):
        raise RuntimeError("aiortc's receiver no longer builds an aiortc.jitterbuffer.JitterBuffer")

    class PromptAudioJitterBuffer(base):  # type: ignore[misc, valid-type]
        _streamvox_base = base

        def __init__(self, capacity: int, prefetch: int = 0, is_video: bool = False) -> None:
            super().__init__(capacity, prefetch=prefetch if is_video else count, is_video=is_video)

    receiver.JitterBuffer = PromptAudioJitterBuffer
    return count
