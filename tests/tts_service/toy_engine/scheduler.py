"""The toy engine's planning: one segment per stream per plan, the oldest streams first."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tts_service.core.scheduler import Overloaded, StreamScheduler, StreamState
from tts_service.segmenter import SegmenterOptions


@dataclass(slots=True)
class ToyOptions:
    lead_s: float = 0.4
    frame_samples: int = 320  # 20 ms at 16 kHz
    idle_s: float = 5.0
    max_streams: int | None = None
    segmenter: SegmenterOptions = field(default_factory=SegmenterOptions)


@dataclass(slots=True)
class ToyPlan:
    jobs: list[tuple[int, str, str]]  # (stream id, segment text, voice)


@dataclass(slots=True)
class ToyResult:
    audio: dict[int, np.ndarray | BaseException]
    seconds: float = 0.0


class ToyScheduler(StreamScheduler):
    cost_per_audio_s = 0.01

    def __init__(self, *, sample_rate: int, options: ToyOptions | None = None) -> None:
        super().__init__(sample_rate=sample_rate, options=options or ToyOptions())
        self._running: set[int] = set()

    def refusal(self, now: float) -> Overloaded | None:
        if self.opt.max_streams is not None and self.active >= self.opt.max_streams:
            return Overloaded(1000, f"the toy engine serves {self.opt.max_streams} streams at once")
        return None

    def capacity_streams(self) -> int:
        return self.opt.max_streams or 100

    def schedule(self, now: float) -> ToyPlan | None:
        jobs = []
        for sid in self._order:
            s = self._streams[sid]
            if s.status.finished or not s.segments or sid in self._running:
                continue
            if s.pace and s.first_audio_at is not None and s.lead(now) > self.opt.lead_s:
                continue  # paced: next_work_in wakes the runtime when its lead has run down
            jobs.append((sid, s.segments.popleft(), s.voice))
            self._running.add(sid)
        return ToyPlan(jobs) if jobs else None

    def update(self, plan: ToyPlan, result: ToyResult, now: float) -> None:
        for sid, _text, _voice in plan.jobs:
            self._running.discard(sid)
            s = self._streams.get(sid)
            if s is None or s.status.finished:
                continue  # cancelled while the plan ran: its audio is dropped by id
            audio = result.audio[sid]
            if isinstance(audio, BaseException):
                self.fail(sid, "internal", f"synthesis failed: {audio}")
                continue
            self._hold(s, audio)
            self._maybe_done(s)

    def _queue(self, s: StreamState, texts: list[str]) -> None:
        s.segments.extend(t for t in texts if t.strip())

    def _computing(self, s: StreamState) -> bool:
        return s.sid in self._running
