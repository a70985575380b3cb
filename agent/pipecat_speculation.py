"""Speculative audio for Pipecat 1.14: the TTS speaks a speculative reply into a hold, not the LLM into one.

Why: Pipecat's speculation (an inference started before the end of turn is known) holds the LLM's
response *text* in the LLM service until the turn is confirmed; the TTS then starts on it at the
release, so its first audio still comes a TTS first-audio time after the end of turn. With the
audio held instead, the TTS has run during the wait as well, and a confirmed turn's first audio is
ready at the end of turn.

Three parts, each where its frames are:

* :func:`hold_audio_not_text` gives an LLM service a :class:`MarkingSpeculationGate`: it lets a
  speculative response through at once, led by a :class:`SpeculativeResponseFrame`, and otherwise
  keeps Pipecat's bookkeeping (the LLM still stops a withdrawn inference);
* the TTS service (``agent.pipecat.StreamvoxTTSService``) synthesises it; when the speculation is
  withdrawn (``EagerEndOfTurnCancelFrame``) it cancels that synthesis on the server, acknowledged,
  and drops what it still had queued;
* :class:`SpeculativeAudioHold`, right after the TTS, holds everything of the response (audio,
  word timings, its start and end) with Pipecat's own :class:`SpeculationGate` until the turn ends
  (``UserStoppedSpeakingFrame``: released, in order) or is withdrawn or interrupted (dropped, and
  its queue flushed: nothing of it is heard).

A wrong early start therefore costs server work, never a sound.
"""

from __future__ import annotations

from pipecat.frames.frames import (
    ControlFrame,
    EagerEndOfTurnCancelFrame,
    Frame,
    InterruptionFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.turns.speculation_gate import GatedFrame, SpeculationGate, SpeculationState

__all__ = ["MarkingSpeculationGate", "SpeculativeAudioHold", "SpeculativeResponseFrame", "hold_audio_not_text"]


class SpeculativeResponseFrame(ControlFrame):
    """Leads a response that answers a turn not yet confirmed (queued in order with its frames)."""


class MarkingSpeculationGate(SpeculationGate):
    """The LLM's gate, minus the hold: a speculative response passes at once, marked."""

    def _begin(self) -> list[GatedFrame]:
        emitted = super()._begin()  # the base would now hold it ...
        self._end_hold(SpeculationState.OPEN)  # ... it goes on instead, to be held after the TTS
        if self.is_speculating:
            emitted.append((SpeculativeResponseFrame(), FrameDirection.DOWNSTREAM))
        return emitted


def hold_audio_not_text(llm) -> None:
    """Make ``llm`` (a Pipecat ``LLMService``) pass its speculative responses on, marked.

    Place a :class:`SpeculativeAudioHold` after the TTS: without one a speculative reply is heard.
    """
    if not isinstance(getattr(llm, "_speculation_gate", None), SpeculationGate):
        raise TypeError(f"{llm!r} has no Pipecat 1.14 speculation gate to replace")
    llm._speculation_gate = MarkingSpeculationGate(name=f"{llm}::MarkingSpeculationGate")


class SpeculativeAudioHold(FrameProcessor):
    """Holds a marked speculative response (after the TTS: its audio) until its turn is confirmed."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._gate = SpeculationGate(name=f"{self}::SpeculationGate")
        self.held = 0  # responses held (figures)
        self.dropped = 0  # of them, withdrawn or interrupted before the turn ended

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, SpeculativeResponseFrame):
            self._gate.begin_speculation(True)  # not held if the turn already ended meanwhile
            self.held += self._gate.is_speculating
            return
        if isinstance(frame, (EagerEndOfTurnCancelFrame, InterruptionFrame)) and direction == FrameDirection.DOWNSTREAM:
            self.dropped += self._gate.is_speculating
            if isinstance(frame, EagerEndOfTurnCancelFrame):
                # what of the withdrawn response is queued behind this frame must not reach the
                # gate after it (it would be held for the next turn end and played then)
                await self._start_interruption()
        for gated, gated_direction in self._gate.process(frame, direction):
            await self.push_frame(gated, gated_direction)
