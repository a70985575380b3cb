"""The Orpheus scheduler: slots, pacing, admission. Pure Python - no torch, asyncio or sockets.

Same verbs and outputs as :mod:`tts_service.core.scheduler` (add / push_text / flush / end / cancel
/ schedule / update / release, :class:`~tts_service.core.scheduler.Output` objects), but the unit of
work is different: an autoregressive model does not know a segment's length up front, so a
tick is "claim free slots, prefill prompt chunks, one decode step for the streams that need
audio", vLLM-v1 style (``schedule() -> engine.tick() -> update()``).

* Slots: a stream claims the lowest free slot when its next segment is ready and gives it back
  when the segment is spoken (one generation per segment: Orpheus needs a segment's whole text
  in its prompt). Low slots first keep the engine's batch ``[0, n)`` compact.
* Pacing: a paced stream whose generated audio is ``lead_s`` ahead of its listener does not
  commit a decode step (its row rides along; its token is discarded), and when no stream needs
  a step none runs - that idle time is the capacity left for others.
* Admission: a stream is refused when no slot would be free for it or when the measured tick
  time at the batch size it would make exceeds the real-time budget (82 tokens/s x headroom).
* Ids: results carry the stream id that owned the slot when the tick was planned; results of a
  stream that was cancelled meanwhile, or whose slot changed hands, are dropped here.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..core.scheduler import Overloaded, Status, StreamScheduler, StreamState
from ..protocol import ErrorCode
from ..segmenter import SegmenterOptions
from .config import REALTIME_TOKENS_PER_S, SAMPLE_RATE, SAMPLES_PER_FRAME, Sampling

FRAME_S = SAMPLES_PER_FRAME / SAMPLE_RATE  # 85.3 ms of audio per 7 tokens
_SPEAKABLE = re.compile(r"\w")


@dataclass(slots=True)
class OrpheusOptions:
    lead_s: float = 0.4  # paced streams run at most this far ahead of their listener
    frame_samples: int = 1024  # samples per audio message on the wire (42.7 ms at 24 kHz)
    prefill_tokens: int = 1024  # prompt tokens prefilled per tick (bounds a tick, hence everyone's step)
    prefill_chunk: int = 256  # a longer prompt is prefilled over several ticks
    headroom: float = 1.1  # each stream must get REALTIME_TOKENS_PER_S x this
    capacity: float = 1.0  # fraction of each second the decode steps may take (1000: no step-time limit)
    max_streams: int | None = None  # hard cap (None: slots and measured step time decide)
    max_held_s: float = 3.0  # unpaced streams stop generating when this much audio is unsent
    idle_s: float = 5.0  # a stream without text or audio for this long stops counting as load
    sampling: Sampling = field(default_factory=Sampling)
    segmenter: SegmenterOptions = field(default_factory=SegmenterOptions)


# ---------------------------------------------------------------- plan and results (engine I/O)


@dataclass(frozen=True, slots=True)
class Claim:
    slot: int
    sid: int
    prompt_len: int
    sampling: Sampling


@dataclass(frozen=True, slots=True)
class PrefillJob:
    """Write prompt tokens ``ids[start:stop]`` into ``slot``; ``stop == len(ids) - 1`` finishes it."""

    slot: int
    sid: int
    ids: tuple[int, ...]
    start: int
    stop: int

    @property
    def last(self) -> bool:
        return self.stop == len(self.ids) - 1


@dataclass(slots=True)
class TickPlan:
    releases: list[int]  # slots whose streams are gone
    claims: list[Claim]
    prefills: list[PrefillJob]
    decode: list[int]  # slots committing one token this tick
    owners: dict[int, int]  # slot -> sid for every slot in this plan (the gate)


@dataclass(slots=True)
class SlotEvent:
    sid: int
    tokens: int = 0
    frames: int = 0  # complete 7-token frames generated this tick
    audio: list[np.ndarray] = field(default_factory=list)
    done: bool = False  # the segment is finished and all its audio is in ``audio``
    error: str | None = None


@dataclass(slots=True)
class TickResult:
    events: dict[int, SlotEvent]  # by slot
    seconds: float = 0.0
    batch: int = 0  # rows of the decode step (its bucket), 0 without one
    prefill_s: float = 0.0
    step_s: float = 0.0
    codec_s: float = 0.0


# ---------------------------------------------------------------- streams


@dataclass(slots=True, eq=False)
class _Segment:
    text: str
    ids: tuple[int, ...] | None = None
    prefilled: int = 0  # prompt tokens written to the slot (all but the last)


@dataclass(slots=True, eq=False)
class _Stream(StreamState):
    # ``produced_s`` counts decoded audio; pacing counts every generated token (``generated_s``).
    slot: int | None = None
    decoding: bool = False  # its slot's prompt is complete
    generated_s: float = 0.0  # audio of all tokens generated (decoded or not): what pacing counts

    def lead(self, now: float) -> float:
        return self.generated_s - self.playhead(now)

    def held_s(self) -> float:
        return sum(len(h.samples) for h in self.held) / SAMPLE_RATE


class StepTimes:
    """Measured seconds per tick by decode batch size; predicts unmeasured sizes conservatively."""

    def __init__(self, seed: dict[int, float] | None = None) -> None:
        self._t: dict[int, float] = dict(seed or {})

    def observe(self, batch: int, seconds: float) -> None:
        old = self._t.get(batch)
        self._t[batch] = seconds if old is None else old + 0.1 * (seconds - old)

    def predict(self, batch: int) -> float | None:
        if not self._t:
            return None
        sizes = sorted(self._t)
        i = bisect.bisect_left(sizes, batch)
        if i < len(sizes):
            return self._t[sizes[i]]  # the next measured size up: never optimistic
        # Beyond the largest measured size: linear in the batch from the two largest points.
        top = sizes[-1]
        if len(sizes) == 1:
            return self._t[top] * batch / top
        prev = sizes[-2]
        slope = max(0.0, (self._t[top] - self._t[prev]) / (top - prev))
        return self._t[top] + slope * (batch - top)

    def as_dict(self) -> dict[int, float]:
        return dict(sorted(self._t.items()))


class OrpheusScheduler(StreamScheduler):
    """Owns every stream's lifecycle and the slot table; the engine owns the tensors."""

    _stream_type = _Stream

    def __init__(
        self,
        *,
        slots: int,
        tokenize: Callable[[str, str], list[int]],
        options: OrpheusOptions | None = None,
        step_times: dict[int, float] | None = None,
        max_prompt: int | None = None,
    ) -> None:
        super().__init__(sample_rate=SAMPLE_RATE, options=options or OrpheusOptions())
        self.slots = slots
        self.max_prompt = max_prompt
        self.tokenize = tokenize
        self.times = StepTimes(step_times)
        self._owner: list[int | None] = [None] * slots
        self._releases: list[int] = []
        self.cost_per_audio_s = 0.1  # EMA of tick seconds per generated audio second (all streams)

    # ------------------------------------------------------------ admission
    def refusal(self, now: float) -> Overloaded | None:
        load = self.load(now)
        if self.opt.max_streams is not None and load >= self.opt.max_streams:
            return Overloaded(1000, f"server at its limit of {self.opt.max_streams} streams")
        if load >= self.slots:
            return Overloaded(1000, f"all {self.slots} synthesis slots are taken")
        t = self.times.predict(load + 1)
        if t is not None and t * self._needed_steps_per_s() > self.opt.capacity:
            return Overloaded(
                1000, f"{load + 1} streams would need {t * 1000:.1f} ms per step, more than real time allows"
            )
        return None

    def _needed_steps_per_s(self) -> float:
        return REALTIME_TOKENS_PER_S * self.opt.headroom

    def capacity_streams(self) -> int:
        best = 0
        for n in range(1, self.slots + 1):
            t = self.times.predict(n)
            if t is not None and t * self._needed_steps_per_s() > self.opt.capacity:
                break
            best = n
        return min(best, self.opt.max_streams) if self.opt.max_streams is not None else best

    # ------------------------------------------------------------ stream bookkeeping
    def _queue(self, s: _Stream, segments: list[str]) -> None:
        s.segments.extend(_Segment(t) for t in segments if _SPEAKABLE.search(t))

    def _computing(self, s: _Stream) -> bool:
        return s.slot is not None

    def _finish(self, s: _Stream, status: Status) -> None:
        super()._finish(s, status)
        self._free_slot(s)

    def _free_slot(self, s: _Stream) -> None:
        # Safe even while a tick runs: schedule() is not called again before update(), so the
        # slot is reused only in a later plan, whose first act is the release (a row reset).
        if s.slot is not None:
            self._owner[s.slot] = None
            self._releases.append(s.slot)
            s.slot = None
            s.decoding = False

    # ------------------------------------------------------------ planning
    def schedule(self, now: float) -> TickPlan | None:
        """This tick's claims, prefill chunks and decode rows; ``None`` when there is nothing to do."""
        ranked = sorted(
            (s for s in self._streams.values() if not s.status.finished and s.segments),
            key=lambda s: (s.first_audio_at is not None, s.lead(now)),  # first audio first, then neediest
        )
        claims: list[Claim] = []
        prefills: list[PrefillJob] = []
        decode: list[int] = []
        budget = self.opt.prefill_tokens
        for s in ranked:
            seg = s.segments[0]
            if s.slot is None:
                slot = self._lowest_free()
                if slot is None or budget <= 0:
                    continue
                if seg.ids is None:
                    seg.ids = tuple(self.tokenize(seg.text, s.voice))
                    seg.prefilled = 0
                if self.max_prompt is not None and len(seg.ids) > self.max_prompt:
                    self.fail(
                        s.sid,
                        ErrorCode.TEXT_TOO_LONG,
                        f"a segment of {len(seg.ids)} prompt tokens exceeds "
                        f"{self.max_prompt}; cut the text into shorter sentences",
                    )
                    continue
                self._owner[slot] = s.sid
                s.slot, s.decoding = slot, False
                claims.append(Claim(slot, s.sid, len(seg.ids), self.opt.sampling))
            if not s.decoding:
                assert seg.ids is not None
                stop = min(len(seg.ids) - 1, seg.prefilled + self.opt.prefill_chunk, seg.prefilled + budget)
                if stop > seg.prefilled or stop == len(seg.ids) - 1:
                    job = PrefillJob(s.slot, s.sid, seg.ids, seg.prefilled, stop)  # type: ignore[arg-type]
                    prefills.append(job)
                    budget -= stop - seg.prefilled
                    if not job.last:
                        continue
                else:
                    continue
            if self._wants_step(s, now):
                decode.append(s.slot)  # type: ignore[arg-type]
        releases, self._releases = self._releases, []
        if not (claims or prefills or decode):
            self._releases = releases  # nothing to run; keep them for the next plan
            return None
        owners = {slot: sid for slot, sid in enumerate(self._owner) if sid is not None}
        return TickPlan(releases, claims, prefills, sorted(decode), owners)

    def _wants_step(self, s: _Stream, now: float) -> bool:
        if s.pace and s.first_audio_at is not None and s.lead(now) >= self.opt.lead_s:
            return False
        return not (not s.pace and s.held_s() > self.opt.max_held_s)

    def _lowest_free(self) -> int | None:
        # A slot released earlier in this plan may be claimed again: the engine resets it on claim.
        for i, owner in enumerate(self._owner):
            if owner is None:
                return i
        return None

    # ------------------------------------------------------------ results
    def update(self, plan: TickPlan, result: TickResult, now: float) -> None:
        """Fold a finished tick in; anything of a stream that finished meanwhile is dropped by id."""
        for job in plan.prefills:
            s = self._owned(job.slot, job.sid)
            if s is not None:
                s.segments[0].prefilled = job.stop
                s.decoding = job.last
        generated = 0.0
        for slot, ev in result.events.items():
            s = self._owned(slot, ev.sid)
            if s is None:
                continue
            if ev.error is not None:
                self.fail(s.sid, ErrorCode.INTERNAL, ev.error)
                continue
            s.generated_s += ev.frames * FRAME_S
            generated += ev.frames * FRAME_S
            for audio in ev.audio:
                self._hold(s, audio)
            s.last_activity = now
            if ev.done:
                s.segments.popleft()
                s.generated_s = max(s.generated_s, s.produced_s)
                self._free_slot(s)
                self._maybe_done(s)
        if result.batch:
            self.times.observe(result.batch, result.seconds)
        if generated > 0 and result.seconds > 0:
            self.cost_per_audio_s += 0.1 * (result.seconds / generated - self.cost_per_audio_s)

    def _owned(self, slot: int, sid: int) -> _Stream | None:
        s = self._streams.get(sid)
        if s is None or s.status.finished or s.slot != slot:
            return None
        return s

    def has_work(self) -> bool:
        return any(not s.status.finished and s.segments for s in self._streams.values())

    # ------------------------------------------------------------ introspection
    def slots_in_use(self) -> int:
        return sum(1 for o in self._owner if o is not None)
