"""The echo canceller (:mod:`agent.runtime.echo`) in a LiveKit ``AgentSession``: two io wrappers and an STT filter.

    echo = LiveKitEcho()
    echo.attach(session)            # before or after session.start(), once its audio io is set
    await session.start(agent=EchoCheckedAgent(echo, instructions=...), room=ctx.room)

* :meth:`LiveKitEcho.output` wraps the session's ``io.AudioOutput`` (a room's, or any sink): every
  frame the agent hands it is what that output plays next, in order and in real time, so it goes to
  the canceller's far end with its play time (after the audio handed on before it) and is
  forwarded. Frames reach an output faster than real time (a room output queues them), hence the
  modelled play time, not the time of the call. A ``pause()`` (LiveKit pauses a room output on the
  caller's first speech, before it decides to interrupt) stops the audio: what was not played yet is
  taken back from the canceller and handed on again from ``resume()``; ``clear_buffer()`` drops it.
  The word-timed transcript that rides on the TTS frames (``lk.timed_transcripts``) is kept for the
  transcript check, per reply segment, with the time that segment's audio last played.
* :meth:`LiveKitEcho.input` wraps the session's ``io.AudioInput`` (the caller's room track): each
  frame is replaced by the cancelled audio (16 kHz mono), so LiveKit's VAD, its barge-in and the
  STT all read the caller without the bot.
* :class:`EchoCheckedAgent` (or :meth:`LiveKitEcho.checked` in an ``stt_node`` of your own) drops a
  final transcript that only repeats words the bot just played. The ``stt_node`` is the place: the
  session's ``user_input_transcribed`` event fires after the transcript has already interrupted
  the agent (a paused output is interrupted on a final transcript) and started a user turn.

One :class:`LiveKitEcho` per call.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Any

import numpy as np
from livekit import rtc
from livekit.agents import stt
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT
from livekit.agents.voice import Agent, ModelSettings, io

from .runtime.echo import RATE, SEGMENT_S, EchoCanceller, echo_transcript, residue_transcript

__all__ = ["EchoCheckedAgent", "LiveKitEcho"]

log = logging.getLogger("streamvox.livekit_echo")

# how long after a reply's audio last played a transcript is compared with its words: the delay, the
# VAD's end of speech (an echo heard whole is an utterance as long as the reply) and Whisper, which
# transcribes one utterance at a time (an echo's transcript waits behind the caller's): 8 s let the
# echo of a long reply's first sentence through on a loaded machine
PLAYED_WORDS_S = 15.0
GAP_S = 0.5  # an output that ran dry for up to this long is told to the canceller as silence


class LiveKitEcho:
    """One call's canceller, the io wrappers that feed it and the transcript check that uses it."""

    def __init__(self, canceller: EchoCanceller | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.canceller = canceller or EchoCanceller(clock=clock)
        self._clock = clock
        self._play_end = 0.0  # when the audio handed to the output so far has played out
        # the audio handed on but not played yet: (play start, int16 mono, rate), taken back on a pause
        self._queued: deque[tuple[float, np.ndarray, int]] = deque()
        self._held: list[tuple[np.ndarray, int]] = []  # handed on while paused: plays from resume()
        self._paused = False
        # the words of each reply segment and when its audio last played (a word's own time is
        # not known: the TTS hands a reply's words on well ahead of their audio, pauses shift them)
        self._segments: deque[tuple[list[float], list[str]]] = deque()
        self._segment_open = False
        self.dropped_transcripts: list[str] = []

    # ---------------------------------------------------------------- wiring

    def output(self, next_in_chain: io.AudioOutput) -> io.AudioOutput:
        return _ReferenceOutput(self, next_in_chain)

    def input(self, source: io.AudioInput) -> io.AudioInput:
        return _CleanedInput(self, source)

    def attach(self, session: Any) -> None:
        """Wrap the session's audio input and output (those it has; a text-only side stays as it is)."""
        if session.output.audio is not None and not isinstance(session.output.audio, _ReferenceOutput):
            session.output.audio = self.output(session.output.audio)
        if session.input.audio is not None and not isinstance(session.input.audio, _CleanedInput):
            session.input.audio = self.input(session.input.audio)

    # ---------------------------------------------------------------- far end

    def played(self, frame: rtc.AudioFrame) -> None:
        """A frame handed to the output: it plays after everything handed on before it."""
        pcm = _mono(frame)
        now = self._clock()
        if not self._segment_open:
            self._segment_open = True
            self._segments.append(([now], []))
            while self._segments and self._segments[0][0][0] < now - PLAYED_WORDS_S:
                self._segments.popleft()
        self._segments[-1][1].extend(str(t) for t in frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, []))
        if self._paused:
            self._held.append((pcm, frame.sample_rate))
            return
        self._play(pcm, frame.sample_rate)

    def _play(self, pcm: np.ndarray, rate: int) -> None:
        now = self._clock()
        start = max(now, self._play_end)
        gap = start - self._play_end
        if 0 < gap <= GAP_S and self._play_end > 0:
            # the output ran dry (the TTS fell behind) and played silence: the reference says so,
            # rather than the canceller's continuity closing the gap and moving the echo's delay
            self.canceller.far(bytes(2 * round(gap * rate)), rate, t=self._play_end)
        self._play_end = start + len(pcm) / rate
        self._queued.append((start, pcm, rate))
        while self._queued and self._queued[0][0] + len(self._queued[0][1]) / self._queued[0][2] <= now:
            self._queued.popleft()
        self.canceller.far(pcm.tobytes(), rate, t=start)
        if self._segments:  # the segment playing now is heard until then
            self._segments[-1][0][0] = self._play_end

    def flushed(self) -> None:
        """The reply segment is complete: the next frame begins another."""
        self._segment_open = False

    def paused(self) -> None:
        """The output stopped: what was not played yet plays from :meth:`resumed`, if at all."""
        if self._paused:
            return
        now = self._clock()
        self._held = [*self._unplayed(now), *self._held]
        self._stop(now)
        self._paused = True

    def resumed(self) -> None:
        if not self._paused:
            return
        self._paused = False
        held, self._held = self._held, []
        for pcm, rate in held:
            self._play(pcm, rate)

    def cleared(self) -> None:
        """The output dropped what it held: none of it will play."""
        self._stop(self._clock())
        self._held = []

    def _stop(self, now: float) -> None:
        self.canceller.truncate_far(t=now)
        self._play_end = now
        self._queued.clear()

    def _unplayed(self, now: float) -> list[tuple[np.ndarray, int]]:
        out = []
        for start, pcm, rate in self._queued:
            skip = max(0, round((now - start) * rate))
            if skip < len(pcm):
                out.append((pcm[skip:], rate))
        return out

    # ---------------------------------------------------------------- near end

    def clean(self, frame: rtc.AudioFrame) -> rtc.AudioFrame | None:
        """The caller's frame without the bot, 16 kHz mono (None while short of a 10 ms frame)."""
        out = self.canceller.near(_mono(frame).tobytes(), frame.sample_rate, t=self._clock())
        if not out:
            return None
        return rtc.AudioFrame(out, RATE, 1, len(out) // 2)

    # ---------------------------------------------------------------- transcripts

    def is_echo(self, text: str) -> bool:
        now = self._clock()
        played = " ".join(" ".join(words) for (heard,), words in self._segments if heard >= now - PLAYED_WORDS_S)
        if echo_transcript(text, played):
            self.dropped_transcripts.append(text)
            log.info("echo: dropped a transcript that repeats the bot's own words: %r", text)
            return True
        # garbled words of the bot's, or Whisper's stock phrase, from audio that never stood clear of
        # its residue; only while the bot has been talking (the Pipecat side asks the STT's bot_audio)
        if played and residue_transcript(text, played, margin := self.canceller.caller_margin_db(SEGMENT_S)):
            self.dropped_transcripts.append(text)
            log.info("echo: dropped a transcript of the echo's residue (%.0f dB above it): %r", margin, text)
            return True
        return False

    async def checked(self, events: AsyncIterable[stt.SpeechEvent | str]) -> AsyncIterator[stt.SpeechEvent | str]:
        """An ``stt_node``'s events without the final transcripts that are the bot's own echo."""
        async for ev in events:
            if (
                isinstance(ev, stt.SpeechEvent)
                and ev.type == stt.SpeechEventType.FINAL_TRANSCRIPT
                and ev.alternatives
                and self.is_echo(ev.alternatives[0].text)
            ):
                continue
            yield ev


class EchoCheckedAgent(Agent):
    """An ``Agent`` whose STT output goes through :meth:`LiveKitEcho.checked`."""

    def __init__(self, echo: LiveKitEcho | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.echo = echo

    async def stt_node(
        self, audio: AsyncIterable[rtc.AudioFrame], model_settings: ModelSettings
    ) -> AsyncIterable[stt.SpeechEvent | str] | None:
        events = Agent.default.stt_node(self, audio, model_settings)
        if self.echo is None:
            return events
        return self.echo.checked(events)


class _ReferenceOutput(io.AudioOutput):
    """Hands every frame to the canceller's far end, then to the output it wraps."""

    def __init__(self, echo: LiveKitEcho, next_in_chain: io.AudioOutput) -> None:
        super().__init__(
            label="EchoReference",
            capabilities=io.AudioOutputCapabilities(pause=True),
            next_in_chain=next_in_chain,
            sample_rate=next_in_chain.sample_rate,
        )
        self._echo = echo

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        self._echo.played(frame)
        assert self.next_in_chain is not None
        await self.next_in_chain.capture_frame(frame)

    def flush(self) -> None:
        super().flush()
        self._echo.flushed()
        assert self.next_in_chain is not None
        self.next_in_chain.flush()

    def clear_buffer(self) -> None:
        self._echo.cleared()
        assert self.next_in_chain is not None
        self.next_in_chain.clear_buffer()

    def pause(self) -> None:
        self._echo.paused()
        super().pause()

    def resume(self) -> None:
        self._echo.resumed()
        super().resume()


class _CleanedInput(io.AudioInput):
    """The caller's frames, cleaned of the bot's echo."""

    def __init__(self, echo: LiveKitEcho, source: io.AudioInput) -> None:
        super().__init__(label="EchoCleaned", source=source)
        self._echo = echo

    async def __anext__(self) -> rtc.AudioFrame:
        assert self.source is not None
        while True:
            cleaned = self._echo.clean(await self.source.__anext__())
            if cleaned is not None:
                return cleaned


def _mono(frame: rtc.AudioFrame) -> np.ndarray:
    pcm = np.frombuffer(frame.data, np.int16)
    if frame.num_channels == 1:
        return pcm.copy()
    return pcm.reshape(-1, frame.num_channels).mean(axis=1).astype(np.int16)
