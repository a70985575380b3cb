"""The server's side of each turn, stage by stage: one INFO line in the terminal, one message to the page.

Why stage times and not one "voice to voice" figure: the server cannot see the caller's ear. What
it can say truthfully is when each stage finished, counted from the caller's speech end *as its
VAD saw it* (the VAD's stop time minus the silence it waited for). The page measures the rest
(uplink, browser jitter buffer, playout) from the audio itself and shows both side by side.

The origin is found in the audio the server received: the last input frame louder than
``SPEECH_DBFS`` before the VAD's stop (the first of the loud run before its start, for a
barge-in). Only where the input holds no such frame (a noisy line, echo) does it fall back to
the VAD's own presumption (its stop time minus ``stop_secs``, start time minus ``start_secs``),
and ``origin`` says which (``"audio"`` or ``"vad"``). So ``vad_stop`` / ``vad_start`` are what
the VAD costs, and page minus server is the transport both ways.

A caller turn (``kind: "turn"``), ms after the caller's speech end:

* ``vad_stop``: the VAD declared the speech over (its ``stop_secs`` of silence);
* ``stt_final``: the last final transcript of the turn;
* ``end_of_turn``: the user aggregator decided the turn was over (``UserStoppedSpeakingFrame``);
* ``llm_first_token``: the LLM's first text;
* ``tts_first_audio``: the first audio frame out of the TTS service;

  (both can come before ``end_of_turn``: a speculative reply's text and audio are made during the
  wait and held until the end of turn, ``agent.pipecat_speculation``; a speculation the caller
  withdraws by speaking on leaves no figure);
* ``transport_first_audio``: the output transport started sending it (``BotStartedSpeakingFrame``);
* ``tts_ttfb``: the TTS service's own first text -> first audio (a duration, not an offset);
* ``stt_early``: whether the turn's last transcript came from a decode started before the VAD's
  stop (``pipelines.pipecat_stt``, the early decode; None: the STT does not say).

A barge-in (``kind: "barge-in"``), ms after the caller's speech onset (VAD start minus its
``start_secs``): ``vad_start``, ``interruption``, ``bot_stopped`` (the output transport flushed
and stopped), and ``cancel_ack`` (the TTS server's acknowledgement of the cancel, a duration).

The timestamps are the pipeline clock stamped when each frame was pushed, not the time this
observer (which runs from a queue) gets to see it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from loguru import logger
from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    Frame,
    InputAudioRawFrame,
    InterruptionFrame,
    LLMTextFrame,
    MetricsFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    UserStoppedSpeakingFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.metrics.metrics import TTFBMetricsData
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.processors.frame_processor import FrameDirection

# Field order and the words the terminal line uses for them.
TURN_STAGES = {
    "vad_stop": "VAD stop",
    "stt_final": "STT final",
    "end_of_turn": "end of turn",
    "llm_first_token": "LLM first token",
    "tts_first_audio": "TTS first audio",
    "transport_first_audio": "first audio to the transport",
}
BARGE_IN_STAGES = {"vad_start": "VAD start", "interruption": "interruption", "bot_stopped": "bot audio stopped"}
ACK_WAIT_S = 1.5  # the ack normally comes in a few ms; the service itself gives up after 1 s
SPEECH_DBFS = -45.0  # an input frame this loud is speech (or noise) for the origin search
HISTORY_S = 3.0  # input levels kept for it
MAX_GAP_S = 0.15  # a quieter stretch this short inside speech does not end the onset's loud run

Send = Callable[[dict[str, Any]], Awaitable[None]]


def _ms(seconds: float) -> float:
    return round(1000 * seconds, 1)


def describe(figures: dict[str, Any]) -> str:
    """The terminal line of one turn or barge-in message."""
    if figures["kind"] == "turn":
        stages, origin = TURN_STAGES, "the caller's speech end"
    else:
        stages, origin = BARGE_IN_STAGES, "the caller's speech onset"
    parts = [f"{words} {figures[key]:+.0f}" for key, words in stages.items() if figures.get(key) is not None]
    found = "in the audio received" if figures.get("origin") == "audio" else "as the VAD presumes"
    line = f"{figures['kind']} {figures['n']}: ms after {origin} {found}: " + ", ".join(parts)
    if figures.get("tts_ttfb") is not None:
        line += f"; TTS first text -> first audio {figures['tts_ttfb']:.0f} ms"
    if figures.get("stt_early"):
        line += "; transcript decoded before the VAD's stop"
    if figures["kind"] == "barge-in":
        ack = figures.get("cancel_ack")
        line += f"; TTS cancel -> ack {ack:.1f} ms" if ack is not None else "; no TTS cancel acknowledged"
    return line


@dataclass(eq=False)  # observers are kept in sets: identity hash
class StageFigures(BaseObserver):
    """Observes the pipeline; logs and sends (``send``, e.g. RTVI ``send_server_message``) each turn."""

    tts: Any = None  # the StreamvoxTTSService (its frames and its cancel-ack stats)
    send: Send | None = None
    turns: list[dict[str, Any]] = field(default_factory=list)
    bargeins: list[dict[str, Any]] = field(default_factory=list)
    _turn: dict[str, float] | None = None  # the caller turn being answered: absolute times (s)
    _barge: dict[str, float] | None = None
    _bot_speaking: bool = False
    _ttfb_s: float | None = None
    _tasks: set[asyncio.Task] = field(default_factory=set)
    _levels: deque[tuple[float, bool]] = field(default_factory=deque)  # (time, loud) per input frame

    def __post_init__(self) -> None:
        super().__init__()

    async def on_push_frame(self, data: FramePushed) -> None:
        frame = data.frame
        if not data.first_push:  # a frame is pushed once per processor: count it once
            return
        if frame.broadcast_sibling_id is not None and data.direction != FrameDirection.DOWNSTREAM:
            return  # broadcast frames travel both ways: the downstream copy stands for both
        await self._on_frame(frame, data.timestamp / 1e9, data.source)

    def _hear(self, frame: InputAudioRawFrame, now: float) -> None:
        pcm = np.frombuffer(frame.audio, dtype="<i2").astype(np.float32)
        rms = float(np.sqrt(np.mean(pcm * pcm))) / 32768.0 if pcm.size else 0.0
        self._levels.append((now, rms > 10 ** (SPEECH_DBFS / 20)))
        while self._levels and self._levels[0][0] < now - HISTORY_S:
            self._levels.popleft()

    def _speech_end(self, vad_at: float, stop_secs: float) -> tuple[float, str]:
        loud = [t for t, is_loud in self._levels if is_loud and vad_at - stop_secs - 0.5 <= t <= vad_at]
        return (loud[-1], "audio") if loud else (vad_at - stop_secs, "vad")

    def _speech_onset(self, vad_at: float, start_secs: float) -> tuple[float, str]:
        onset = None
        for t, is_loud in reversed(self._levels):  # back from the VAD's decision along the loud run
            if t > vad_at:
                continue
            if is_loud:
                onset = t
            elif onset is not None and onset - t > MAX_GAP_S:
                break
        return (onset, "audio") if onset is not None and onset >= vad_at - 1.0 else (vad_at - start_secs, "vad")

    async def _on_frame(self, frame: Frame, now: float, source: Any) -> None:
        turn = self._turn
        if isinstance(frame, InputAudioRawFrame):
            self._hear(frame, now)
        elif isinstance(frame, VADUserStoppedSpeakingFrame):
            if turn is None or "end_of_turn" in turn:
                turn = self._turn = {}
            # the caller's last speech end before the turn is decided; earlier pauses are overwritten
            origin, how = self._speech_end(now, frame.stop_secs)
            turn.update(origin=origin, how=how, vad_stop=now)
        elif isinstance(frame, TranscriptionFrame) and turn is not None and "llm_first_token" not in turn:
            turn["stt_final"] = now
            result = frame.result if isinstance(frame.result, dict) else {}
            turn["stt_early"] = result.get("decoded_early")
        elif isinstance(frame, UserStoppedSpeakingFrame) and turn is not None:
            turn.setdefault("end_of_turn", now)
        elif isinstance(frame, LLMTextFrame) and turn is not None and "vad_stop" in turn:
            turn.setdefault("llm_first_token", now)
        elif isinstance(frame, TTSAudioRawFrame):
            if turn is not None and "vad_stop" in turn and source is self.tts:
                turn.setdefault("tts_first_audio", now)
        elif isinstance(frame, MetricsFrame):
            for d in frame.data:
                tts_name = self.tts.name if self.tts is not None else None
                if isinstance(d, TTFBMetricsData) and d.value > 0 and d.processor == tts_name:
                    self._ttfb_s = d.value
        elif isinstance(frame, VADUserStartedSpeakingFrame):
            if turn is not None and "end_of_turn" not in turn:  # the caller goes on: that speculation is void
                turn.pop("llm_first_token", None)
                turn.pop("tts_first_audio", None)
            if self._bot_speaking and self._barge is None:
                acks = float(self.tts.stats.cancel_acks) if self.tts is not None else 0.0
                origin, how = self._speech_onset(now, frame.start_secs)
                self._barge = {"origin": origin, "how": how, "vad_start": now, "acks": acks}
        elif isinstance(frame, InterruptionFrame) and self._barge is not None:
            self._barge.setdefault("interruption", now)
        elif isinstance(frame, BotStartedSpeakingFrame):
            self._bot_speaking = True
            if turn is not None and "end_of_turn" in turn:
                turn["transport_first_audio"] = now
                self._turn = None
                await self._report_turn(turn)
        elif isinstance(frame, BotStoppedSpeakingFrame):
            self._bot_speaking = False
            if self._barge is not None:
                barge, self._barge = self._barge, None
                barge["bot_stopped"] = now
                task = asyncio.create_task(self._report_barge_in(barge))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _report_turn(self, turn: dict[str, float]) -> None:
        origin = turn["origin"]
        figures: dict[str, Any] = {"kind": "turn", "n": len(self.turns) + 1, "origin": turn["how"]}
        figures.update({k: _ms(turn[k] - origin) if k in turn else None for k in TURN_STAGES})
        figures["tts_ttfb"] = _ms(self._ttfb_s) if self._ttfb_s is not None else None
        figures["stt_early"] = turn.get("stt_early")
        self._ttfb_s = None
        self.turns.append(figures)
        await self._publish(figures)

    async def _report_barge_in(self, barge: dict[str, float]) -> None:
        origin = barge["origin"]
        figures: dict[str, Any] = {"kind": "barge-in", "n": len(self.bargeins) + 1, "origin": barge["how"]}
        figures.update({k: _ms(barge[k] - origin) if k in barge else None for k in BARGE_IN_STAGES})
        figures["cancel_ack"] = None
        stats = self.tts.stats if self.tts is not None else None
        if stats is not None:
            # the service counts acks but offers no event for them: look every 20 ms
            for _ in range(int(ACK_WAIT_S / 0.02)):
                if stats.cancel_acks > barge["acks"]:
                    break
                await asyncio.sleep(0.02)
            if stats.cancel_acks > barge["acks"] and stats.cancel_ack_latency_s:
                figures["cancel_ack"] = _ms(stats.cancel_ack_latency_s[-1])
        self.bargeins.append(figures)
        await self._publish(figures)

    async def _publish(self, figures: dict[str, Any]) -> None:
        logger.info(describe(figures))
        if self.send is None:
            return
        try:
            await self.send({"type": "streamvox-figures", **figures})
        except Exception as exc:  # the page may be gone; the terminal line is already out
            logger.debug(f"figures not sent to the page: {exc}")
