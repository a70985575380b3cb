"""The WebRTC uplink: hand the caller's audio to the agent as soon as it is in order, and never fall behind.

Pipecat's SmallWebRTC transport receives through aiortc, whose audio receiver shares its jitter
buffer with video (``JitterBuffer(capacity=16, prefetch=4)`` in ``aiortc.rtcrtpreceiver``). For
an agent, which analyses the caller's audio rather than plays it, that buffer costs three ways:

* **It holds four packets** (80 ms with Opus' 20 ms packets) before the VAD, the turn analyzer
  and the STT hear the first: a cushion a *player* needs so playout never runs dry.
* **It releases a frame only when a packet of the next frame arrives**, because a video frame
  spans several packets. An Opus RTP packet is a whole Opus packet (RFC 7587), so that is one
  more packet (20 ms) of waiting for nothing.
* **It hands on at most one frame per arriving packet.** After a packet is lost, the ones behind
  it wait until the buffer overflows (16 packets, 320 ms), and from then on it holds ~15
  packets: every reply and every barge-in is ~0.3 s later *for the rest of the call*. A packet
  that arrives out of order leaves one packet more behind it, for good. Lossy Wi-Fi or a mobile
  uplink loses packets every few seconds; loopback never does, so no local test of the demo
  showed it.

:class:`AudioReorderBuffer` replaces it for audio receivers only. It releases each packet as soon
as all the packets before it are in. It waits for a missing packet until ``PATIENCE`` later ones
have arrived, then gives it up: the decoder skips 20 ms, which costs the VAD and Whisper less
than being late. Whatever is ready then, after a gap closes or is given up, goes out at once.
That is a :class:`FrameBatch`, which the wrapped audio decoder decodes part by part, so no backlog
can build up. A packet that arrives after it was given up is dropped, and so is one with no payload
(padding): handed to the Opus decoder, an empty packet ends its stream, and every packet after it
fails to decode. Video keeps aiortc's buffer.

Installed process-wide (module globals that aiortc's receiver reads when it is made and when its
decoder thread starts), so the demo agent installs it once at start-up. ``STREAMVOX_WEBRTC_UPLINK``
selects ``prompt`` (this, the default) or ``aiortc`` (aiortc's own buffer, to measure the
difference: ``scripts/uplink_loss.py``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from aiortc.jitterbuffer import JitterFrame
from aiortc.rtp import RtpPacket

log = logging.getLogger("streamvox.webrtc_uplink")

ENV = "STREAMVOX_WEBRTC_UPLINK"
MODES = ("prompt", "aiortc")
PATIENCE = 2  # later packets that may arrive while one is missing (40 ms); the next gives it up
MAX_MISORDER = 100  # further behind than this is a restarted stream, not a late packet (as aiortc)


def uplink_mode() -> str:
    """``prompt`` or ``aiortc``, from ``STREAMVOX_WEBRTC_UPLINK`` (default ``prompt``)."""
    raw = os.environ.get(ENV, "").strip().lower() or "prompt"
    if raw not in MODES:
        raise ValueError(f"{ENV}={raw!r}: give 'prompt' (the default) or 'aiortc' (aiortc's own jitter buffer)")
    return raw


class FrameBatch(JitterFrame):
    """Several whole audio packets released by one arriving packet, in order.

    aiortc's receiver maps the RTP timestamp of what the buffer releases (``timestamp``) to its
    own timeline; setting it here moves every part by the same amount, so the decoded frames keep
    their spacing.
    """

    def __init__(self, parts: list[JitterFrame]) -> None:  # not JitterFrame.__init__: timestamp is derived
        self.parts = parts
        self.data = parts[0].data  # what a decoder that does not know batches would decode

    @property  # type: ignore[override]
    def timestamp(self) -> int:
        return self.parts[0].timestamp

    @timestamp.setter
    def timestamp(self, value: int) -> None:
        first = self.parts[0].timestamp
        for part in self.parts:
            part.timestamp = value + ((part.timestamp - first) & 0xFFFFFFFF)


def _ahead(seq: int, of: int) -> int:
    """How far ``seq`` lies after ``of`` on the 16-bit sequence circle (negative: before it)."""
    d = (seq - of) & 0xFFFF
    return d - 0x10000 if d >= 0x8000 else d


class AudioReorderBuffer:
    """An audio receiver's jitter buffer that releases packets in order, at once, all that are ready.

    The interface is the one ``aiortc.rtcrtpreceiver`` uses: ``add(packet) -> (pli, frame)``.
    """

    def __init__(self, capacity: int = 16, prefetch: int = 0, is_video: bool = False, *, patience: int = PATIENCE):
        if is_video:
            raise ValueError("AudioReorderBuffer is for audio: video frames span several packets")
        self._capacity = capacity  # the most packets kept waiting behind a gap
        self._patience = patience
        self._next: int | None = None  # the sequence number released next
        self._waiting: dict[int, RtpPacket] = {}
        self.given_up = 0  # packets never received in time (figures for tests and benches)
        self.late = 0  # packets that came after they were given up, dropped

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def waiting(self) -> int:
        """Packets held behind a gap right now."""
        return len(self._waiting)

    def add(self, packet: RtpPacket) -> tuple[bool, JitterFrame | None]:
        seq = packet.sequence_number
        if self._next is None:
            self._next = seq
        ahead = _ahead(seq, self._next)
        if ahead < 0:
            if -ahead < MAX_MISORDER:
                self.late += 1  # released or given up already: playing it now would be out of order
                return False, None
            self._waiting.clear()  # the sender restarted its sequence: start over from here
            self._next, ahead = seq, 0
        self._waiting[seq] = packet
        ready: list[JitterFrame] = []
        while self._waiting:
            while self._next in self._waiting:
                got = self._waiting.pop(self._next)
                if got._data:  # type: ignore[attr-defined]  # an empty one (padding) would end the decoder's stream
                    ready.append(JitterFrame(data=got._data, timestamp=got.timestamp))  # type: ignore[attr-defined]
                self._next = (self._next + 1) & 0xFFFF
            if not self._waiting:
                break
            span = max(_ahead(s, self._next) for s in self._waiting)
            if len(self._waiting) <= self._patience and span < self._capacity:
                break  # wait a little longer for the missing one
            first = min(self._waiting, key=lambda s: _ahead(s, self._next))
            self.given_up += _ahead(first, self._next)
            self._next = first
        if not ready:
            return False, None
        return False, ready[0] if len(ready) == 1 else FrameBatch(ready)


class BatchDecoder:
    """Decodes a :class:`FrameBatch` part by part with the codec's own decoder (others as they are)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def decode(self, encoded_frame: JitterFrame) -> list[Any]:
        parts = getattr(encoded_frame, "parts", None)
        if parts is None:
            return self.inner.decode(encoded_frame)
        frames: list[Any] = []
        failed: Exception | None = None
        for part in parts:
            try:
                frames.extend(self.inner.decode(part))
            except Exception as exc:  # one bad packet must not cost the ones after it
                failed = failed or exc
        if failed is not None:
            if not frames:
                raise failed  # the receiver's decoder thread logs it and goes on, as for any frame
            log.warning("an audio packet of a batch failed to decode (%r); the others went on", failed)
        return frames


def release_audio_sooner(mode: str | None = None) -> str:
    """Install :class:`AudioReorderBuffer` for aiortc's audio receivers (``mode`` ``prompt``), or
    put aiortc's own buffer back (``aiortc``). Default: :func:`uplink_mode`.

    Affects receivers made afterwards, in this process. Idempotent. Returns the mode in force.
    """
    import aiortc.rtcrtpreceiver as receiver
    from aiortc.jitterbuffer import JitterBuffer

    mode = uplink_mode() if mode is None else mode
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {MODES}")
    base_buffer = getattr(receiver.JitterBuffer, "_streamvox_base", receiver.JitterBuffer)
    base_decoder = getattr(receiver.get_decoder, "_streamvox_base", receiver.get_decoder)
    if not (isinstance(base_buffer, type) and issubclass(base_buffer, JitterBuffer)) or not callable(base_decoder):
        raise RuntimeError("aiortc's receiver no longer builds an aiortc.jitterbuffer.JitterBuffer")
    if mode == "aiortc":
        receiver.JitterBuffer, receiver.get_decoder = base_buffer, base_decoder
        return mode

    def make_buffer(capacity: int, prefetch: int = 0, is_video: bool = False) -> Any:
        if is_video:
            return base_buffer(capacity, prefetch=prefetch, is_video=True)
        return AudioReorderBuffer(capacity)

    def make_decoder(codec: Any) -> Any:
        decoder = base_decoder(codec)
        return BatchDecoder(decoder) if codec.mimeType.lower().startswith("audio/") else decoder

    make_buffer._streamvox_base = base_buffer  # type: ignore[attr-defined]
    make_decoder._streamvox_base = base_decoder  # type: ignore[attr-defined]
    receiver.JitterBuffer, receiver.get_decoder = make_buffer, make_decoder
    return mode
