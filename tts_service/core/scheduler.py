"""The engine-independent scheduler: stream lifecycle, held audio, paced release, admission verbs.

It never touches sockets, asyncio or model code, and knows nothing of any engine's unit of work.
The runtime (:mod:`tts_service.core.runtime`) drives every engine's scheduler through the same
verbs:

* ``add`` / ``push_text`` / ``flush`` / ``end`` / ``cancel`` - from the transports;
* ``schedule(now) -> plan`` - what the worker should compute next (the engine's subclass);
* ``update(plan, result, now)`` - fold the worker's outputs in; outputs of streams that
  finished while the plan ran are discarded by stream id (the engine's subclass);
* ``release(now) -> [Output]`` - frames whose time has come, paced to stay ``lead_s`` ahead of
  the listener's playhead, plus ``words``/``done``/``error`` events in order;
* ``next_work_in(now)`` / ``next_release_in(now)`` - when the clock next makes work or a frame
  due (the runtime sleeps until then or until an event: it never polls);
* ``orphaned(plan)`` - whether a running plan computes for nobody any more;
* ``refusal`` / ``load`` / ``capacity_streams`` / ``active`` / ``queue_depth`` /
  ``cost_per_audio_s`` - what admission, ``/readyz`` and the metrics read.

:class:`StreamScheduler` is the shared part; Piper's window planning is
:class:`tts_service.piper.scheduler.PiperScheduler`, Orpheus' slots
:class:`tts_service.orpheus.scheduler.OrpheusScheduler`. Generated audio is held until
released, so a cancel drops it without it ever reaching the wire, and the sent lead stays
bounded whatever the unit of work used to compute it.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..segmenter import Segmenter


class Status(enum.IntEnum):
    """One ordered lifecycle per stream; cancel and errors are just ways to finish."""

    ACTIVE = 0
    ENDED = 1  # no more text will come; still has audio to deliver
    FINISHED_DONE = 2
    FINISHED_CANCELLED = 3
    FINISHED_ERROR = 4

    @property
    def finished(self) -> bool:
        return self >= Status.FINISHED_DONE


class Overloaded(Exception):
    """Admission refused: the admitted streams would fall behind real time."""

    def __init__(self, retry_after_ms: int, reason: str) -> None:
        super().__init__(reason)
        self.retry_after_ms = retry_after_ms
        self.reason = reason


@dataclass(slots=True, eq=False)
class Held:
    """Computed audio waiting for its time (and the words it starts, if any)."""

    start_s: float
    samples: np.ndarray
    words: list[tuple[str, float, float]] | None = None


@dataclass(slots=True, eq=False)
class StreamState:
    """What every engine's scheduler keeps per stream: lifecycle, queued text, held audio, pacing."""

    sid: int
    voice: str
    pace: bool
    created: float
    segmenter: Segmenter
    speed: float = 1.0  # speaking rate relative to the voice's own, fixed at the start
    status: Status = Status.ACTIVE
    segments: deque = field(default_factory=deque)  # the engine's segments, oldest first
    held: deque[Held] = field(default_factory=deque)
    produced_s: float = 0.0  # audio computed
    released_s: float = 0.0  # audio handed to the transport
    playhead_s: float = 0.0  # estimated listener position
    playhead_at: float | None = None  # wall time of the last playhead update
    seq: int = 0
    first_text_at: float | None = None
    last_text_at: float = 0.0
    first_audio_at: float | None = None
    last_activity: float = 0.0
    done_sent: bool = False

    def playhead(self, now: float) -> float:
        if self.playhead_at is None:
            return 0.0
        # The listener cannot play audio that was not sent yet: a stall (slow LLM) does not
        # let the server run ahead afterwards.
        return min(self.released_s, self.playhead_s + (now - self.playhead_at))

    def advance_playhead(self, now: float) -> None:
        if self.playhead_at is not None:
            self.playhead_s = self.playhead(now)
        self.playhead_at = now

    def lead(self, now: float) -> float:
        """Audio computed ahead of the listener (what pacing counts)."""
        return self.produced_s - self.playhead(now)


@dataclass(slots=True)
class Output:
    """Something for the transport to send for stream ``sid``."""

    sid: int
    kind: str  # "audio" | "words" | "done" | "error"
    seq: int = 0
    samples: np.ndarray | None = None
    words: list[tuple[str, float, float]] | None = None
    frames: int = 0
    audio_ms: float = 0.0
    code: str = ""
    message: str = ""
    ttfb_s: float | None = None  # set on a stream's first audio output


class StreamScheduler:
    """Per-stream bookkeeping every engine's scheduler shares: admission, the transport verbs,
    finishing (done / cancel / error), held audio and its paced release.

    An engine's subclass plans and folds in its own work (``schedule`` / ``update``), says how
    admission is refused (``refusal``) and how many streams fit (``capacity_streams``, from the
    ``cost_per_audio_s`` it measures), turns text into its segments (``_queue``) and says when a
    stream still has work in the engine (``_computing``). Its options need at least ``lead_s``,
    ``frame_samples``, ``idle_s`` and ``segmenter``.
    """

    _stream_type: type[StreamState] = StreamState
    cost_per_audio_s: float  # worker seconds per audio second, measured by the engine's subclass

    def __init__(self, *, sample_rate: int, options) -> None:
        self.sample_rate = sample_rate
        self.opt = options
        self._streams: dict[int, StreamState] = {}
        self._order: list[int] = []  # admission order, for first-come first-served ties
        self._pending_out: deque[Output] = deque()
        # Set by release() when an unpaced stream's frames went out: generation for it may have
        # waited for its consumer (max_held_s), so the runtime wakes the compute loop. Paced
        # streams need no such wake: their work falls due by the clock (next_work_in).
        self.consumer_moved = False

    # ------------------------------------------------------------ admission
    def admit(self, now: float) -> None:
        """Raise :class:`Overloaded` when one more real-time stream would not keep up."""
        refusal = self.refusal(now)
        if refusal is not None:
            raise refusal

    def refusal(self, now: float) -> Overloaded | None:
        raise NotImplementedError

    def capacity_streams(self) -> int:
        """How many real-time streams the engine's measured cost allows (``/readyz``, metrics)."""
        raise NotImplementedError

    def load(self, now: float) -> int:
        """Streams that currently cost compute (idle ones waiting for text do not)."""
        return sum(
            1
            for s in self._streams.values()
            if not s.status.finished and (s.segments or s.held or now - s.last_activity < self.opt.idle_s)
        )

    # ------------------------------------------------------------ transport verbs
    def add(self, sid: int, *, voice: str, pace: bool, now: float, speed: float = 1.0) -> None:
        if sid in self._streams:
            raise ValueError(f"stream {sid} already exists")
        self._streams[sid] = self._stream_type(
            sid=sid,
            voice=voice,
            pace=pace,
            created=now,
            last_activity=now,
            segmenter=Segmenter(self.opt.segmenter),
            speed=speed,
        )
        self._order.append(sid)

    def push_text(self, sid: int, text: str, now: float) -> None:
        s = self._live(sid)
        if s.status is not Status.ACTIVE:
            raise ValueError("context already ended; start a new context for more text")
        if s.first_text_at is None and text.strip():
            s.first_text_at = now
        s.last_activity = s.last_text_at = now
        self._queue(s, s.segmenter.push(text))

    def flush(self, sid: int, now: float) -> None:
        s = self._live(sid)
        s.last_activity = now
        self._queue(s, s.segmenter.flush())

    def end(self, sid: int, now: float) -> None:
        s = self._live(sid)
        if s.status is Status.ACTIVE:
            self.flush(sid, now)
            s.status = Status.ENDED
            self._maybe_done(s)

    def cancel(self, sid: int) -> int:
        """Finish a stream now; return how many computed frames were never sent."""
        s = self._streams.get(sid)
        if s is None or s.status.finished:
            return 0
        dropped = sum(math.ceil(len(h.samples) / self.opt.frame_samples) for h in s.held)
        self._finish(s, Status.FINISHED_CANCELLED)
        return dropped

    def fail(self, sid: int, code: str, message: str) -> None:
        s = self._streams.get(sid)
        if s is not None and not s.status.finished:
            self._finish(s, Status.FINISHED_ERROR)
            self._pending_out.append(Output(sid=sid, kind="error", code=code, message=message))

    def discard(self, sid: int) -> None:
        """Forget a finished stream (the transport has delivered its last message)."""
        if self._streams.pop(sid, None) is not None:
            self._order.remove(sid)

    def status(self, sid: int) -> Status | None:
        s = self._streams.get(sid)
        return None if s is None else s.status

    # ------------------------------------------------------------ the clock
    def next_work_in(self, now: float) -> float | None:
        """Seconds until the clock makes new work due (None: only an event can).

        This default covers engines that pace at ``lead_s``: a paced stream with work waits for
        its lead to run down. An engine's scheduler with other deadlines overrides it."""
        waits = [
            s.lead(now) - self.opt.lead_s
            for s in self._streams.values()
            if not s.status.finished and s.segments and s.pace and s.first_audio_at is not None
        ]
        due = [w for w in waits if w > 0]
        return min(due) if due else None

    def orphaned(self, plan) -> bool:
        """Whether a running plan computes for nobody any more (default: never abort)."""
        return False

    def _queue(self, s: StreamState, texts: list[str]) -> None:
        """Append the engine's segments for these segmenter outputs."""
        raise NotImplementedError

    def _live(self, sid: int) -> StreamState:
        s = self._streams.get(sid)
        if s is None or s.status.finished:
            raise KeyError(sid)
        return s

    def _finish(self, s: StreamState, status: Status) -> None:
        s.status = status
        s.segments.clear()
        s.held.clear()

    # ------------------------------------------------------------ results
    def _hold(self, s: StreamState, audio: np.ndarray, words: list[tuple[str, float, float]] | None = None) -> None:
        """Cut computed audio into wire frames and hold them; ``words`` go with the first frame."""
        step = self.opt.frame_samples
        for i in range(0, len(audio), step):
            chunk = audio[i : i + step]
            s.held.append(Held(s.produced_s, chunk, words if i == 0 else None))
            s.produced_s += len(chunk) / self.sample_rate

    def _computing(self, s: StreamState) -> bool:
        """Does the engine still hold work of this stream (a batch in flight, a slot)?"""
        raise NotImplementedError

    def _maybe_done(self, s: StreamState) -> None:
        if s.status is Status.ENDED and not s.segments and not s.held and not self._computing(s) and not s.done_sent:
            s.done_sent = True
            s.status = Status.FINISHED_DONE
            self._pending_out.append(Output(sid=s.sid, kind="done", frames=s.seq, audio_ms=s.released_s * 1000))

    # ------------------------------------------------------------ delivery
    def release(self, now: float, blocked: frozenset[int] | set[int] = frozenset()) -> list[Output]:
        """Frames (and words/done/error events) due now, in per-stream order.

        Paced streams get audio ``lead_s`` ahead of the listener's playhead. ``blocked`` names
        streams whose transport is backed up (a slow reader of an unpaced stream): their frames
        stay held, bounded by ``max_held_s``.
        """
        out: list[Output] = []
        for sid in self._order:
            s = self._streams[sid]
            while s.held and sid not in blocked:
                h = s.held[0]
                if s.pace and s.first_audio_at is not None and h.start_s >= s.playhead(now) + self.opt.lead_s:
                    break
                s.held.popleft()
                if h.words:
                    out.append(Output(sid=sid, kind="words", words=h.words))
                o = Output(sid=sid, kind="audio", seq=s.seq, samples=h.samples)
                if s.first_audio_at is None:
                    s.first_audio_at = now
                    o.ttfb_s = now - (s.first_text_at if s.first_text_at is not None else s.created)
                s.advance_playhead(now)
                s.released_s = h.start_s + len(h.samples) / self.sample_rate
                s.seq += 1
                out.append(o)
                self.consumer_moved |= not s.pace
            if not s.held:
                self._maybe_done(s)
        while self._pending_out:
            out.append(self._pending_out.popleft())
        return out

    def next_release_in(self, now: float) -> float | None:
        """Seconds until the next held frame is due (None when nothing is held)."""
        best: float | None = None
        for s in self._streams.values():
            if s.held and not s.status.finished:
                wait = (
                    0.0
                    if not s.pace or s.first_audio_at is None
                    else max(0.0, s.held[0].start_s - s.playhead(now) - self.opt.lead_s)
                )
                best = wait if best is None else min(best, wait)
        return best

    # ------------------------------------------------------------ introspection
    @property
    def active(self) -> int:
        return sum(1 for s in self._streams.values() if not s.status.finished)

    def queue_depth(self) -> int:
        return sum(len(s.segments) for s in self._streams.values() if not s.status.finished)
