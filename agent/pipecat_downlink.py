"""The WebRTC downlink: the agent's audio leaves at an even pace and without gaps.

Pipecat's SmallWebRTC transport sends the agent's audio through ``RawAudioTrack``: the output
transport hands it a chunk, the track queues it as 10 ms pieces, and aiortc's sender takes one
piece every 10 ms by the wall clock (10 ms of *silence* when the queue is empty), encodes it and
sends a packet. Two things there reach the caller's ear (measured: docs/BENCHMARKS.md, "Echo"):

* **Gaps in the middle of words.** The output transport writes its next chunk only once the track
  has sent the last piece of the previous one (``write_audio_frame`` awaits that), so at the end of
  every chunk the queue is empty and the next chunk must come within 10 ms. Whenever the event loop
  is busy for longer than that, aiortc sends 10-30 ms of silence mid-word: a click the caller hears,
  and the rest of the reply 10 ms later, which the echo canceller sees as its echo path moving.
  :func:`install` lets the output transport write one chunk
  ahead: the future it awaits is the previous chunk's, so the next chunk is queued while the
  current one plays.
* **Packets in bursts.** aiortc hands every 20 ms Opus encode (a small fraction of a millisecond)
  to the default thread pool and sends nothing until it returns. On a busy machine that thread
  waited hundreds of ms for a core while the event loop itself was free; the packets behind it then left in a
  burst. The browser's jitter buffer reads that as network jitter: it played concealment and
  raised its target delay, which every later word of the reply waits through, and
  it time-stretched its way back down over seconds (the echo's delay moving all the while). Audio
  senders made after :func:`install` encode on the event loop.

What an interruption leaves behind is less than before: Pipecat 1.14 lets the chunk being written
play out after an ``InterruptionFrame`` (for mixers; this agent has none and sends no
uninterruptible audio), and with a chunk ahead that would be two; instead the track drops what it
still holds when the interruption reaches the output transport, and when the writer stops waiting
(the call's end, Pipecat's write timeout).

The track counts what the caller hears of it: gaps (silence of at most ``GAP_PIECES`` pieces between
two pieces of audio) and the seconds of audio sent, logged when the call's output transport is
cleaned up.

Installed process-wide (methods of Pipecat's and aiortc's classes), once, at the room's start.
``STREAMVOX_WEBRTC_DOWNLINK`` selects ``even`` (this, the default) or ``pipecat`` (Pipecat's and
aiortc's own, to measure the difference; the gaps are counted either way).
"""

from __future__ import annotations

import asyncio
import os

from loguru import logger
from pipecat.frames.frames import Frame, InterruptionFrame
from pipecat.processors.frame_processor import FrameDirection

__all__ = ["DownlinkStats", "downlink_mode", "drop_queued", "install"]

ENV = "STREAMVOX_WEBRTC_DOWNLINK"
MODES = ("even", "pipecat")
GAP_PIECES = 5  # silence this short (50 ms) between two pieces of audio is a gap, not a pause


def downlink_mode() -> str:
    """``even`` or ``pipecat``, from ``STREAMVOX_WEBRTC_DOWNLINK`` (default ``even``)."""
    raw = os.environ.get(ENV, "").strip().lower() or "even"
    if raw not in MODES:
        raise ValueError(f"{ENV}={raw!r}: give 'even' (the default) or 'pipecat' (Pipecat's and aiortc's own pacing)")
    return raw


class DownlinkStats:
    """One track's audio as sent: pieces of audio, gaps inside it (count and ms)."""

    __slots__ = ("_silent_run", "audio_pieces", "dropped", "gap_pieces", "gaps", "queued", "taken")

    def __init__(self) -> None:
        self.queued = self.dropped = self.taken = 0  # 10 ms pieces: written, dropped unsent, sent
        self.audio_pieces = 0
        self.gaps = 0
        self.gap_pieces = 0
        self._silent_run: int | None = None  # silent pieces since the last audio (None: none yet)

    def sent(self, audio: bool) -> None:
        if audio:
            run = self._silent_run
            if run is not None and 0 < run <= GAP_PIECES:
                self.gaps += 1
                self.gap_pieces += run
            self.audio_pieces += 1
            self._silent_run = 0
        elif self._silent_run is not None:
            self._silent_run += 1

    def __str__(self) -> str:
        return (
            f"{self.gaps} gaps of silence inside the agent's audio ({10 * self.gap_pieces} ms) "
            f"in {self.audio_pieces / 100:.1f} s of it"
        )


def install(mode: str | None = None) -> str:
    """Install the even downlink (``mode`` ``even``) or put Pipecat's and aiortc's own back
    (``pipecat``). Default: :func:`downlink_mode`. Idempotent; affects every SmallWebRTC call made in
    this process afterwards (the encoding: senders made afterwards). Returns the mode in force."""
    from aiortc.rtcrtpsender import RTCRtpSender
    from pipecat.transports.smallwebrtc.transport import RawAudioTrack, SmallWebRTCOutputTransport

    mode = downlink_mode() if mode is None else mode
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {MODES}")
    base_add = _base(RawAudioTrack.add_audio_bytes)
    base_recv = _base(RawAudioTrack.recv)
    base_process = _base(SmallWebRTCOutputTransport.process_frame)
    base_init = _base(RTCRtpSender.__init__)
    base_cleanup = _base(SmallWebRTCOutputTransport.cleanup)
    even = mode == "even"

    def add_audio_bytes(self, audio_bytes: bytes) -> asyncio.Future:
        sent = base_add(self, audio_bytes)  # done when this chunk's last piece has been sent
        stats(self).queued += len(audio_bytes) // self._bytes_per_10ms
        if not even:
            return sent
        before: asyncio.Future | None = getattr(self, "_streamvox_sending", None)
        self._streamvox_sending = sent
        if before is None or before.done():
            # nothing of the previous chunk is left to send: this one plays now, and the writer
            # may queue the next behind it at once
            before = asyncio.get_running_loop().create_future()
            before.set_result(True)
            return before
        before.add_done_callback(lambda f: f.cancelled() and drop_queued(self))
        return before

    async def recv(self):
        frame = await base_recv(self)
        st = stats(self)
        taken = st.queued - st.dropped - len(self._chunk_queue)  # pieces taken from the queue so far
        st.sent(taken > st.taken)  # this frame was a piece of audio, not the track's silence
        st.taken = taken
        return frame

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await base_process(self, frame, direction)
        track = getattr(getattr(self, "_client", None), "_audio_output_track", None)
        if track is None:
            return
        self._streamvox_track = track  # the client lets go of it when the peer disconnects: kept for cleanup
        if isinstance(frame, InterruptionFrame) and direction is FrameDirection.DOWNSTREAM and even:
            drop_queued(track)

    async def cleanup(self) -> None:
        track = getattr(self, "_streamvox_track", None)
        if track is not None and stats(track).audio_pieces:
            logger.info(f"downlink: {stats(track)}")
        await base_cleanup(self)

    def __init__(self, trackOrKind, transport) -> None:
        base_init(self, trackOrKind, transport)
        if even and self.kind == "audio":
            self._RTCRtpSender__loop = _EncodeInline(self._RTCRtpSender__loop)

    for cls, name, fn, base in (
        (RawAudioTrack, "add_audio_bytes", add_audio_bytes, base_add),
        (RawAudioTrack, "recv", recv, base_recv),
        (SmallWebRTCOutputTransport, "process_frame", process_frame, base_process),
        (SmallWebRTCOutputTransport, "cleanup", cleanup, base_cleanup),
        (RTCRtpSender, "__init__", __init__, base_init),
    ):
        fn._streamvox_base = base  # type: ignore[attr-defined]
        setattr(cls, name, fn)
    return mode


def stats(track) -> DownlinkStats:
    """The track's :class:`DownlinkStats` (made on first use)."""
    st = getattr(track, "_streamvox_stats", None)
    if st is None:
        st = track._streamvox_stats = DownlinkStats()
    return st


def drop_queued(track) -> None:
    """Nothing the track still holds will be sent: an interruption, or a writer that stopped waiting
    (the call's end, Pipecat's write timeout). Each dropped chunk's future is resolved, as if sent,
    so a writer waiting on it goes on (to the next frame, or to its end)."""
    queue = track._chunk_queue
    stats(track).dropped += len(queue)
    while queue:
        _chunk, fut = queue.popleft()
        if fut is not None and not fut.done():
            fut.set_result(True)


class _EncodeInline:
    """What an audio ``RTCRtpSender`` sees as its event loop: ``run_in_executor`` runs the encoder at
    once, on the loop (the module docstring: a pool thread that waits for a core holds the packets)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def run_in_executor(self, _executor, fn, *args) -> asyncio.Future:
        fut = self._loop.create_future()
        try:
            fut.set_result(fn(*args))
        except Exception as exc:  # the sender meets it where it would have: on the awaited future
            fut.set_exception(exc)
        return fut

    def __getattr__(self, name: str):
        return getattr(self._loop, name)


def _base(fn):
    return getattr(fn, "_streamvox_base", fn)
