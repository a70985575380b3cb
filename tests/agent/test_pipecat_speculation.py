"""The LLM side of speculative audio alone (``agent.pipecat_speculation``): a speculative response is
passed on at once, led by its marker, and Pipecat's bookkeeping is kept. The hold after the TTS and
the TTS's cancel are tested on real calls (tests/pipecat/test_speculative_audio.py)."""

from __future__ import annotations

import pytest
from pipecat.frames.frames import (
    EagerEndOfTurnCancelFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.turns.speculation_gate import SpeculationGate

from agent.pipecat_speculation import MarkingSpeculationGate, SpeculativeResponseFrame, hold_audio_not_text

DOWN = FrameDirection.DOWNSTREAM


def _through(gate: SpeculationGate, *frames) -> list:
    return [f for frame in frames for f, _ in gate.process(frame, DOWN)]


def test_a_speculative_response_passes_marked_where_pipecat_would_hold_it() -> None:
    response = [LLMFullResponseStartFrame(), LLMTextFrame("Paris."), LLMFullResponseEndFrame()]
    held = SpeculationGate()
    held.begin_speculation(True)
    assert _through(held, *response) == []  # Pipecat's own: held until the turn ends
    marking = MarkingSpeculationGate()
    marking.begin_speculation(True)
    out = _through(marking, *response)
    assert isinstance(out[0], SpeculativeResponseFrame) and out[1:] == response
    assert marking.is_speculating  # the LLM still knows it answers an unconfirmed turn ...
    _through(marking, EagerEndOfTurnCancelFrame())
    assert not marking.is_speculating  # ... until it is withdrawn (then it stops the inference)


def test_a_response_to_a_confirmed_turn_is_not_marked() -> None:
    gate = MarkingSpeculationGate()
    _through(gate, UserStoppedSpeakingFrame())  # the turn ended before the inference began
    gate.begin_speculation(True)
    start = LLMFullResponseStartFrame()
    assert _through(gate, start) == [start]


def test_only_an_llm_service_can_hand_its_audio_to_the_hold() -> None:
    with pytest.raises(TypeError, match="speculation gate"):
        hold_audio_not_text(object())
