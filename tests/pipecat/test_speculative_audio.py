"""Speculative audio on a phone call (``agent.pipecat_speculation``): the TTS speaks during the wait.

Real: Silero VAD, Whisper tiny.en, the streamvox server and voice, Pipecat's Twilio transport, the
judge's text model, corpus callers (espeak-ng); the LLM is the scripted endpoint. The judge's waits
are set long here (every pause waits ``WAIT_S``): what is under test is what happens inside a wait,
and a fixed wait makes the case the same on any machine, loaded or not.

* a finished question: with ``STREAMVOX_SPECULATE=on`` the reply's first audio is made before the
  end of turn and held, so the caller hears it sooner after the end of turn than with ``text``
  (Pipecat's own: the text held, the TTS started at the release);
* a caller who goes on after a pause: the speculative reply's audio was made and is never heard;
  its synthesis is cancelled on the server (acknowledged), and one answer follows the whole turn.
"""

from __future__ import annotations

import functools

import pytest

from support.pipecat_harness import voiced
from tests.pipecat.test_judged_turns import LONG_PAUSE, warm  # noqa: F401 (warm: Whisper and SmolLM2 loaded first)
from tests.pipecat.test_speculation import QUESTION, _call, _caller, _users, goes_on_from, heard_the_question

WAIT_S = 2.5  # every pause of the caller's waits this long after the VAD stop (the judge's settings below)

pytestmark = [pytest.mark.slow, pytest.mark.solo]


@pytest.fixture
def long_waits(monkeypatch):
    import pipelines.turn_judge as turn_judge

    waits = dict(likely_s=WAIT_S, between_s=WAIT_S, unlikely_s=WAIT_S, sentence_s=WAIT_S, other_s=WAIT_S)
    monkeypatch.setattr(turn_judge, "TurnJudge", functools.partial(turn_judge.TurnJudge, **waits))


async def _judged(engine, utterance: bytes, replies: list[str], mode: str):
    return await _call(engine, utterance, replies, end_of_turn="judge", speculate_audio=mode == "on")


async def test_the_reply_is_spoken_during_the_wait_and_heard_at_its_end(engine, long_waits) -> None:
    heard = {}
    for mode in ("on", "text"):
        requests, caller, ended, agent = await _judged(engine, _caller(QUESTION), ["There is no fee for cards."], mode)
        (turn,) = agent.figures.turns
        assert agent.turns.counts.confirmed == 1 and len(requests) == 1, (mode, agent.turns.counts)
        assert heard_the_question(_users(requests[0])[-1])
        assert turn["end_of_turn"] > 1000 * WAIT_S, turn  # the wait under test was waited
        first = min(t for t, ev in caller.events if t > ended and voiced(ev))
        heard[mode] = (turn, 1000 * (first - ended))
    (on, on_ms), (text, text_ms) = heard["on"], heard["text"]
    print(
        f"\nspeculative audio: heard {on_ms:.0f} ms after the speech end ({on}); text held: {text_ms:.0f} ms ({text})"
    )
    # on: the audio existed before the end of turn (held), nothing of it before the turn ended
    assert on["tts_first_audio"] < on["end_of_turn"], on
    assert on_ms > 1000 * WAIT_S, on_ms  # not heard inside the wait
    # text: the TTS started at the release, after the end of turn
    assert text["tts_first_audio"] > text["end_of_turn"], text
    # from the end of turn the held audio goes out at once, the text-held reply a TTS first audio
    # later (~70-300 ms here); the caller-side figures are printed (their speech end differs by the
    # VAD's frame, ~0.1 s: too noisy to compare two calls)
    assert on["transport_first_audio"] - on["end_of_turn"] < text["transport_first_audio"] - text["end_of_turn"]


async def test_a_withdrawn_reply_was_spoken_cancelled_and_never_heard(engine, long_waits) -> None:
    replies = ["Speculative words that must not be heard, however long this sentence goes on.", "At nine."]
    requests, caller, ended, agent = await _judged(engine, _caller(LONG_PAUSE), replies, "on")
    counts, users = agent.turns.counts, [_users(r)[-1] for r in requests]
    assert counts.withdrawn >= 1, (counts, users)
    # the whole turn, once: the pause's words and the rest after them (not which words Whisper tiny
    # makes of the rest on the line: "for last month", "for that month", "for the aftermath")
    assert goes_on_from(agent.turns.decisions[0]["text"], users[-1], "could"), (agent.turns.decisions, users)
    # its audio was made (the TTS ran on it) and cancelled on the server, acknowledged
    assert agent.tts.withdrawn >= 1 and agent.tts.stats.cancel_acks >= 1, (agent.tts.withdrawn, agent.tts.stats)
    assert agent.hold.dropped >= 1 and agent.hold.held == agent.hold.dropped + 1, (agent.hold.held, agent.hold.dropped)
    # nothing was heard before the caller finished, and what was heard after is the real answer's length
    early = [t for t, ev in caller.events if t < ended and voiced(ev)]
    assert early == [], f"agent audio {early[0] - ended:+.2f} s from the caller's end"
    voiced_s = sum(len(ev["media"]["payload"]) * 3 / 4 / 8000 for t, ev in caller.events if voiced(ev))
    assert voiced_s < 2.5, voiced_s  # "At nine." (~1 s), not the withdrawn sentence (~5 s)
