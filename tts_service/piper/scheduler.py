"""Piper's scheduler: window planning on top of :class:`tts_service.core.scheduler.StreamScheduler`.

The verbs the runtime calls are the core's (see :mod:`tts_service.core.scheduler`); this module
adds what is Piper's own:

* ``schedule(now) -> Batch`` - what the worker should compute next (start-up work first,
  then the streams closest to running dry); on a CPU one stream's window at a time, so each
  window's audio goes out as soon as it is computed and a newcomer waits at most one window;
* ``update(batch, result, now)`` - fold the worker's front parts and windows in; outputs of
  streams that finished while the batch ran are discarded here, by stream id;
* ``next_work_in(now)`` - the clock's deadlines: a paced stream's lead running down, buffered
  text falling due to be cut;
* ``orphaned(batch)`` - whether a running batch computes for nobody any more;
* admission from the measured cost per audio second and per start-up.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..core.scheduler import Overloaded, Status, StreamScheduler, StreamState
from ..segmenter import SegmenterOptions

# The scheduler defines what it exchanges with the engine (a prepared segment in, windows of its
# frames out) and the engine imports it, as in tts_service.orpheus: planning stays free of model
# code (no onnxruntime here), and its tests build these by hand.
HOP = 256  # audio samples per latent frame in Piper's VITS voices: the unit windows are planned in
_SENTENCE_ENDS = ".!?…"
_CLOSERS = "\"')]}”’"


@dataclass(slots=True)
class Prepared:
    """One synthesis segment after the front part: ready for windowed decoding."""

    text: str
    z: np.ndarray  # [1, C, T] float32: the decoder's input (flow output times the mask)
    words: list[tuple[str, float, float]]  # (word, start_s, end_s) from the segment's start
    voice: str

    @property
    def frames(self) -> int:
        return int(self.z.shape[2])


@dataclass(slots=True)
class PiperSchedulerOptions:
    lead_s: float = 0.4  # how far ahead of the listener's playhead audio is sent (paced streams)
    # How far ahead audio is computed (and held until due). More than lead_s, so a stream's next
    # window is computed while it still has lead_s of audio queued at the client: with several
    # streams waiting for the worker, computing only below lead_s let the client's lead fall to
    # a fraction of it (docs/BENCHMARKS.md). Held audio is dropped on cancel.
    compute_lead_s: float = 1.0
    # Latent frames per window, growing; the runtime raises each to what the engine decodes for
    # the same price (a Piper window spans at least MIN_SPAN frames). Larger windows cost less
    # per frame (the context on each side and a call's fixed costs are paid once per window):
    # once a stream holds a couple of seconds of audio, the largest windows cut the decode's CPU
    # per audio second (`bench load --baseline`, docs/BENCHMARKS.md), while a newcomer waits
    # behind at most one running window.
    windows: tuple[int, ...] = (6, 12, 24, 48, 64, 96, 192)
    frame_samples: int = 1024  # native samples per audio frame on the wire (~46 ms at 22.05 kHz)
    # Windows per batch. 1 on a CPU: batching windows of several streams there gives no
    # per-window gain (FACTS), and one window per batch means each window's audio leaves when it
    # is computed and a newcomer's start-up waits behind at most one window. Where batching pays
    # (CUDA) the runtime raises it; ``max_tick_frames`` then bounds the batch.
    max_jobs: int = 1
    max_tick_frames: int = 200  # latent frames (with context) per tick, start-up work exempt
    startup_s: float = 0.3  # a stream with less audio than this computed is starting up
    context_frames: int = 11  # the engine's context per window side; set from the engine by the runtime
    capacity: float = 0.85  # fraction of each worker's time streams may take before refusing
    workers: int = 0  # worker threads running batches; 0: the runtime picks for the engine (1 today)
    max_streams: int | None = None  # hard cap on concurrent streams (None: by measured load)
    first_cut_s: float = 0.15  # text without a boundary for this long is cut at a word (see _starving_in)
    # Text never stranded (see _stranded): when no text came for this long, whatever is buffered
    # is spoken - after a sentence end ("Hi there." with no flush) soon, a fragment ("Okay") later.
    sentence_wait_s: float = 0.3
    fragment_wait_s: float = 0.8
    starve_lead_s: float = 0.15
    early_cut_words: int = 3  # ... if it holds at least this many words
    max_held_s: float = 3.0  # computed-but-unsent audio per stream before generation waits
    idle_s: float = 5.0  # a stream with no text or audio for this long stops counting as load
    talk_idle_s: float = 1.0  # a stream with nothing to do for this long stops counting as talking
    cost_window_s: float = 10.0  # the measured cost per audio second is over this much recent work
    cost_min_audio_s: float = 2.0  # ... once it holds at least this much audio
    segmenter: SegmenterOptions = field(default_factory=SegmenterOptions)


@dataclass(slots=True, eq=False)
class _Segment:
    text: str
    prepared: Prepared | None = None
    prepping: bool = False
    cursor: int = 0  # next latent frame to decode
    offset_s: float = 0.0  # where this segment starts in the stream's audio
    words_due: bool = True

    @property
    def remaining(self) -> int:
        return 0 if self.prepared is None else self.prepared.frames - self.cursor


@dataclass(slots=True, eq=False)
class _Stream(StreamState):
    in_flight: bool = False
    window_index: int = 0
    uncuttable: str | None = None  # buffered text a word cut already found nothing to cut in


# ---------------------------------------------------------------- batch I/O


@dataclass(slots=True)
class PrepJob:
    sid: int
    segment: _Segment
    voice: str
    urgent: bool = False  # a start-up: the listener waits for it (the engine may spend more CPU)
    speed: float = 1.0  # the stream's speaking rate (the front part's length scale divides by it)


@dataclass(slots=True)
class WindowJob:
    sid: int
    segment: _Segment
    start: int
    size: int  # end = start + size, clipped to the segment's frames once it is prepared


@dataclass(slots=True)
class Batch:
    preps: list[PrepJob]
    windows: list[WindowJob]

    @property
    def sids(self) -> set[int]:
        return {j.sid for j in self.preps} | {j.sid for j in self.windows}


@dataclass(slots=True)
class BatchResult:
    prepared: list[Prepared | BaseException | None]  # one per prep job
    audio: list[np.ndarray | BaseException | None]  # one per window job; None: nothing to decode
    seconds: float = 0.0


class PiperScheduler(StreamScheduler):
    """Owns every stream's lifecycle between the transports and the engine."""

    _stream_type = _Stream

    def __init__(self, *, sample_rate: int, options: PiperSchedulerOptions | None = None) -> None:
        super().__init__(sample_rate=sample_rate, options=options or PiperSchedulerOptions())
        # EMA of worker seconds per audio second; the runtime seeds it from the engine's warm-up
        # and real batches refine it live.
        self.cost_per_audio_s = 0.15
        # EMA of worker seconds a stream's start-up (front part + first window) takes.
        self.startup_cost_s = 0.05
        self._costs: deque[tuple[float, float, float]] = deque(maxlen=4096)  # (t, worker s, audio s)

    # ------------------------------------------------------------ admission
    def refusal(self, now: float) -> Overloaded | None:
        """Why a new stream would be refused now, or ``None`` (also what ``/readyz`` reports).

        Each stream that is talking *or starting* needs ``cost_per_audio_s`` of the worker per
        second to stay real time (a moving average measured on real batches: it includes front
        parts, start-up windows and a busy machine). One more is admitted while the sum, newcomer
        included, fits ``capacity``. Counting streams opened a moment ago that have no text yet
        matters for bursts: nine ``start`` messages in the same instant were all admitted while
        none had text, then all fell behind together.
        """
        load = self.load(now)
        if self.opt.max_streams is not None and load >= self.opt.max_streams:
            return Overloaded(1000, f"server at its limit of {self.opt.max_streams} streams")
        talking = self.talking(now)
        # An idle server always takes one stream: a slow (or busy) machine serving one stream
        # late is better than serving none.
        starting = self.starting(now)
        first_s = self.opt.windows[0] * HOP / self.sample_rate
        if starting and (starting + 1) * self.startup_cost_s > first_s * self.opt.capacity:
            # A burst: every starting stream's start-up runs before anyone's second window, so
            # the queue of start-ups must fit in the first window's audio of the earliest one.
            # (One worker's share, whatever their number: start-up costs are measured mostly
            # alone, and two workers on two cores drain the queue no faster than one with two
            # threads - with their share, a burst of starts was all admitted and fell silent.)
            wait_ms = round(starting * self.startup_cost_s * 1000)
            return Overloaded(
                min(1000, max(100, wait_ms)),
                f"{starting} streams are starting; their first audio needs the synthesis worker for ~{wait_ms} ms",
            )
        if talking and (talking + 1) * self.cost_per_audio_s > self._share():
            # Streams free capacity as they finish; a turn lasts seconds, so ask for a short wait.
            return Overloaded(
                1000,
                f"{talking} talking streams already need {talking * self.cost_per_audio_s:.0%} of the synthesis worker",
            )
        return None

    def talking(self, now: float) -> int:
        """Streams with speech to produce or deliver now, or just opened (text is on its way).

        An open context that has waited ``talk_idle_s`` for text is not counted (an agent keeps
        one open between turns)."""
        return sum(
            1
            for s in self._streams.values()
            if not s.status.finished
            and (
                s.segments
                or s.held
                or s.in_flight
                or now - (s.last_activity if s.first_text_at is not None else s.created) < self.opt.talk_idle_s
            )
        )

    def _share(self) -> float:
        """Worker seconds per second streams may take: ``capacity`` of each worker. (Costs are
        wall seconds of batches, measured while the workers share the cores, so two busy workers
        each see their batches slow down and the sum stays honest.)"""
        return self.opt.capacity * max(1, self.opt.workers)

    def starting(self, now: float) -> int:
        """Streams with no audio yet that will soon need their start-up: text is waiting, or the
        context was opened less than ``talk_idle_s`` ago (its text is on its way)."""
        return sum(
            1
            for s in self._streams.values()
            if not s.status.finished
            and s.produced_s == 0.0
            and (s.segments or s.segmenter.pending.strip() or now - s.created < self.opt.talk_idle_s)
        )

    def _fresh(self, sid: int) -> bool:
        s = self._streams.get(sid)
        return s is not None and s.produced_s == 0.0

    def capacity_streams(self) -> int:
        """How many real-time streams the measured cost allows (an estimate for ``/readyz``)."""
        limit = math.floor(self._share() / max(self.cost_per_audio_s, 1e-6))
        return min(limit, self.opt.max_streams) if self.opt.max_streams is not None else limit

    def _queue(self, s: _Stream, texts: list[str]) -> None:
        s.segments.extend(_Segment(t) for t in texts)

    def _computing(self, s: _Stream) -> bool:
        return s.in_flight

    # ------------------------------------------------------------ planning
    def schedule(self, now: float) -> Batch | None:
        """Pick the next batch: start-up work first, then earliest deadline (smallest lead)."""
        candidates: list[tuple[tuple, _Stream, _Segment]] = []
        for sid in self._order:
            s = self._streams[sid]
            if s.status.finished or s.in_flight:
                continue
            self._cut_waiting_text(s, now)
            seg = self._next_segment(s)
            if seg is None or self._wait_for_clock(s, now) is not None or self._consumer_behind(s):
                continue
            # Start-up work (a stream's first audio, while the listener's buffer is thinnest) goes
            # first and is exempt from the batch budget; then earliest deadline.
            starting = s.produced_s < self.opt.startup_s
            candidates.append(((0 if starting else 1, s.lead(now)), s, seg))
        if not candidates:
            return None
        candidates.sort(key=lambda c: c[0])
        preps: list[PrepJob] = []
        windows: list[WindowJob] = []
        frames = 0
        for (rank, lead), s, seg in candidates:
            if len(windows) >= self.opt.max_jobs:
                break
            size = self._window_size(s, lead)
            cost = size + 2 * self.opt.context_frames
            if rank != 0 and frames + cost > self.opt.max_tick_frames and windows:
                continue
            frames += cost
            s.in_flight = True
            if seg.prepared is None:
                seg.prepping = True
                preps.append(PrepJob(s.sid, seg, s.voice, urgent=rank == 0 or lead <= 0.0, speed=s.speed))
            windows.append(WindowJob(s.sid, seg, seg.cursor, size))
        return Batch(preps, windows)

    @staticmethod
    def _next_segment(s: _Stream) -> _Segment | None:
        return next((g for g in s.segments if g.prepared is None or g.remaining > 0), None)

    def _wait_for_clock(self, s: _Stream, now: float) -> float | None:
        """Seconds until a paced stream's lead falls below ``compute_lead_s`` (None: not waiting)."""
        if not s.pace or s.first_audio_at is None:
            return None
        ahead = s.lead(now) - max(self.opt.compute_lead_s, self.opt.lead_s)
        return ahead if ahead >= 0 else None

    def _consumer_behind(self, s: _Stream) -> bool:
        """An unpaced stream whose consumer is not keeping up: generation waits for release."""
        return len(s.held) * self.opt.frame_samples > self.opt.max_held_s * self.sample_rate

    def _cut_waiting_text(self, s: _Stream, now: float) -> None:
        """Queue text the segmenter holds when waiting longer would leave the listener in silence."""
        if s.segments or s.status is not Status.ACTIVE or not s.segmenter.pending.strip():
            return
        if self._text_due_in(s, now) == 0.0:
            if self._stranded_in(s, now) == 0.0:
                self._queue(s, s.segmenter.flush())
                return
            pending = s.segmenter.pending
            cut = s.segmenter.cut_words(self.opt.early_cut_words)
            s.uncuttable = None if cut else pending  # no deadline again until more text comes
            self._queue(s, cut)

    def _text_due_in(self, s: _Stream, now: float) -> float | None:
        """Seconds until buffered text is cut (0: now; None: no such deadline)."""
        waits = [w for w in (self._starving_in(s, now), self._stranded_in(s, now)) if w is not None]
        return min(waits) if waits else None

    def _starving_in(self, s: _Stream, now: float) -> float | None:
        """When waiting for punctuation would leave the listener in silence: cut at a word.

        Before the first audio: text has waited ``first_cut_s`` (a slow LLM). Later: the audio
        already sent is about to run out and no text arrived for a while. (Only text of at least
        ``early_cut_words`` words is cut this way; shorter text waits for :meth:`_stranded_in`.)
        """
        pending = s.segmenter.pending
        if s.first_text_at is None or pending == s.uncuttable or len(pending.split()) < self.opt.early_cut_words:
            return None
        if s.produced_s == 0.0:
            return max(0.0, s.first_text_at + self.opt.first_cut_s - now)
        quiet = s.last_text_at + self.opt.first_cut_s / 2 - now
        running_dry = s.lead(now) - self.opt.starve_lead_s
        return max(0.0, quiet, running_dry)

    def _stranded_in(self, s: _Stream, now: float) -> float | None:
        """Text never stranded: after ``sentence_wait_s`` without new text a buffered sentence
        is spoken whole (the segmenter confirms a sentence end only when the next character
        arrives), and after ``fragment_wait_s`` any trailing fragment too."""
        pending = s.segmenter.pending.rstrip().rstrip(_CLOSERS)
        if s.first_text_at is None or not pending:
            return None
        wait = self.opt.sentence_wait_s if pending[-1] in _SENTENCE_ENDS else self.opt.fragment_wait_s
        return max(0.0, s.last_text_at + wait - now)

    def next_work_in(self, now: float) -> float | None:
        """Seconds until the clock makes new work due (None: only an event can).

        Events (text, end, a finished batch, a release) wake the runtime on their own; this is
        the rest: a paced stream's lead running down to ``compute_lead_s``, buffered text falling
        due to be cut. ``schedule`` at that time finds the work."""
        best: float | None = None
        for s in self._streams.values():
            if s.status.finished or s.in_flight:
                continue
            waits = []
            if self._next_segment(s) is not None and not self._consumer_behind(s):
                waits.append(self._wait_for_clock(s, now))
            elif not s.segments and s.status is Status.ACTIVE:
                waits.append(self._text_due_in(s, now))
            for w in waits:
                if w is not None:
                    best = w if best is None else min(best, w)
        return best

    def orphaned(self, batch: Batch) -> bool:
        """A running batch every stream of which has finished (cancelled, failed): nobody needs it."""
        return all((st := self.status(sid)) is None or st.finished for sid in batch.sids)

    def _window_size(self, s: _Stream, lead: float) -> int:
        """The first window small (fast first audio), then growing; a stream that fell behind
        gets the largest, which catches it up soonest per second of compute.

        (Falling back to the smallest windows after a stall made a stalled stream the least
        efficient one: in a burst of nine that fed back into 8-9 s of silence each.)"""
        sizes = self.opt.windows
        if s.produced_s == 0.0:
            s.window_index = 0
        elif not s.pace or lead <= 0.0:
            s.window_index = max(s.window_index, len(sizes) - 1 if lead <= 0.0 else len(sizes) - 2)
        return sizes[min(s.window_index, len(sizes) - 1)]

    # ------------------------------------------------------------ results
    def update(self, batch: Batch, result: BatchResult, now: float) -> None:
        """Fold a finished batch in; streams cancelled meanwhile are skipped by id."""
        for job in batch.preps + batch.windows:
            if job.sid in self._streams:
                self._streams[job.sid].in_flight = False
        for job, prepared in zip(batch.preps, result.prepared):
            job.segment.prepping = False
            s = self._streams.get(job.sid)
            if s is None or s.status.finished:
                continue
            if isinstance(prepared, BaseException):
                self.fail(job.sid, "internal", f"synthesis failed for {job.segment.text[:40]!r}: {prepared}")
                continue
            if prepared is None:  # nothing speakable ("...", "-")
                s.segments.remove(job.segment)
                continue
            job.segment.prepared = prepared
        audio_s = 0.0
        startups = sum(1 for j in batch.windows if j.start == 0 and self._fresh(j.sid))
        for job, audio in zip(batch.windows, result.audio):
            s = self._streams.get(job.sid)
            if s is None or s.status.finished or audio is None:
                continue
            if isinstance(audio, BaseException):
                self.fail(job.sid, "internal", f"vocoder failed: {audio}")
                continue
            seg = job.segment
            if seg.prepared is None or seg not in s.segments:
                continue
            if seg.cursor == 0:
                seg.offset_s = s.produced_s
            seg.cursor = min(seg.prepared.frames, job.start + job.size)
            words = None
            if seg.words_due and len(audio):
                seg.words_due = False
                words = [(w, a + seg.offset_s, b + seg.offset_s) for w, a, b in seg.prepared.words]
            self._hold(s, audio, words)
            audio_s += len(audio) / self.sample_rate
            s.window_index += 1
            s.last_activity = now
            if seg.remaining == 0:
                s.segments.remove(seg)
        for s in {self._streams[j.sid] for j in batch.preps + batch.windows if j.sid in self._streams}:
            self._maybe_done(s)
        if startups and result.seconds > 0 and len(batch.windows) == startups:
            self.startup_cost_s += 0.2 * (result.seconds / startups - self.startup_cost_s)
        if audio_s > 0 or result.seconds > 0:
            self._learn_cost(now, result.seconds, audio_s)

    def _learn_cost(self, now: float, seconds: float, audio_s: float) -> None:
        """Worker seconds per audio second over the last ``cost_window_s``: a ratio of sums.

        (A per-batch moving average swung between 0.04 and 0.10 under load - a start-up batch
        charges a whole segment's front part to 0.63 s of audio, a steady window costs a third
        of that - and each high swing refused streams the worker had room for.)"""
        costs = self._costs
        costs.append((now, seconds, audio_s))
        while costs and now - costs[0][0] > self.opt.cost_window_s:
            costs.popleft()
        total_audio = sum(a for _, _, a in costs)
        if total_audio >= self.opt.cost_min_audio_s:
            self.cost_per_audio_s = sum(sec for _, sec, _ in costs) / total_audio
