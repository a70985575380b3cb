"""The end-of-turn measurement (``scripts/end_of_turn.py``) measures what it says.

Real parts: the bundled Piper voice makes the caller's speech, Pipecat's Silero VAD and its
smart-turn v3 analyzer judge it. What is asserted: the inserted pause is where the script says
(silent, between two stretches of speech); a VAD stop shorter than the pause ends the turn inside
it (too early), a longer one ends it after the speech, ``stop_secs`` plus a few VAD windows
later; the smart-turn path reaches a decision on a plain question; a corpus caller's every cut
pause is counted.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from support.scripts import load_script


@pytest.fixture(scope="module")
def eot():
    return load_script("end_of_turn")


@pytest.fixture(scope="module")
def turns(eot):
    return eot.make_turns([("I would like to book a table | for four people.", [0.8]), ("What time is it now?", [])])


def _rms(audio: np.ndarray) -> float:
    return float(np.sqrt(np.mean(audio.astype(np.float64) ** 2)))


def test_the_pause_is_inserted_where_the_script_says(eot, turns) -> None:
    turn = turns[0]
    ((start, end),) = turn.pauses
    assert end - start == pytest.approx(0.8, abs=0.01)
    r = eot.RATE
    assert _rms(turn.audio[int(start * r) : int(end * r)]) < 0.002  # the microphone noise only
    assert _rms(turn.audio[int((start - 0.3) * r) : int(start * r)]) > 0.02  # speech before ...
    assert _rms(turn.audio[int(end * r) : int((end + 0.3) * r)]) > 0.02  # ... and after
    assert _rms(turn.audio[int((turn.speech_end_s - 0.2) * r) : int(turn.speech_end_s * r)]) > 0.01
    assert _rms(turn.audio[int((turn.speech_end_s + 0.05) * r) :]) < 0.002
    assert turns[1].pauses == []


async def test_a_vad_stop_shorter_than_the_pause_ends_the_turn_too_early(eot, turns) -> None:
    clock = eot.SimClock()
    short = await eot.drive(turns[0], 0.2, None, clock)
    assert short.early and turns[0].pauses[0][0] < short.end_s < turns[0].pauses[0][1]
    long = await eot.drive(turns[0], 1.0, None, clock)
    assert not long.early
    assert 1000 <= long.delay_ms <= 1300, long.delay_ms  # stop_secs + a few 32 ms VAD windows


async def test_smart_turn_reaches_a_decision_on_a_plain_question(eot, turns) -> None:
    import pipecat.audio.turn.smart_turn.base_smart_turn as base_smart_turn
    from pipecat.audio.turn.smart_turn.local_smart_turn_v3 import LocalSmartTurnAnalyzerV3

    clock = eot.SimClock()
    saved = base_smart_turn.time
    base_smart_turn.time = clock
    try:
        smart = LocalSmartTurnAnalyzerV3()
        smart.set_sample_rate(eot.RATE)
        outcome = await eot.drive(turns[1], 0.2, smart, clock)
        await smart.cleanup()
    finally:
        base_smart_turn.time = saved
    assert not outcome.early and outcome.inference_ms
    assert 200 <= outcome.delay_ms <= 3500, outcome  # a verdict, or the 3 s silence timeout at worst


async def test_the_demo_waits_one_second_not_three_when_smart_turn_says_incomplete(eot) -> None:
    # A turn that trails off on "um," is one smart-turn calls incomplete; the caller says no more,
    # so only the analyzer's silence timeout ends it: the demo's 1 s, not Pipecat's default 3 s.
    import pipecat.audio.turn.smart_turn.base_smart_turn as base_smart_turn

    from pipelines.pipecat_agent import turn_strategies

    (turn,) = eot.make_turns([("I was calling about the package, um,", [])])
    clock = eot.SimClock()
    saved = base_smart_turn.time
    base_smart_turn.time = clock
    try:
        analyzer = turn_strategies().stop[0]._turn_analyzer
        analyzer.set_sample_rate(eot.RATE)
        outcome = await eot.drive(turn, 0.2, analyzer, clock)
        await analyzer.cleanup()
    finally:
        base_smart_turn.time = saved
    assert not outcome.early
    assert 1000 <= outcome.delay_ms <= 2000, outcome


async def test_every_cut_pause_of_a_corpus_caller_is_counted(eot, tmp_path, monkeypatch) -> None:
    # A caller from the corpus (an espeak-ng voice) with two pauses of 0.4 and 0.6 s: a VAD stop of
    # 0.2 s ends the turn in each of them, and the turn is followed on to its real end; 1.0 s cuts none.
    monkeypatch.setenv("STREAMVOX_CALLERS_DIR", str(tmp_path))
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng not installed (make system-deps)")
    (turn,) = eot.corpus_turns(["espeak-rp-slow/m-unsure"], "clean")
    assert turn.label == "mid_thought" and len(turn.pauses) == 2 and turn.voice == "espeak-rp-slow"
    clock = eot.SimClock()
    short = await eot.drive(turn, 0.2, None, clock)
    assert short.early and len(short.cuts) >= 2 and eot.cut_pauses(turn, short) == 2
    assert 150 <= short.final_delay_ms <= 500, short  # the real end: about stop_secs after the last word
    long = await eot.drive(turn, 1.0, None, clock)
    assert not long.early and not long.cuts and eot.cut_pauses(turn, long) == 0
    assert long.final_delay_ms == long.delay_ms


async def test_the_transcript_holds_a_pause_that_a_fixed_silence_cuts(eot, tmp_path, monkeypatch) -> None:
    # A corpus caller (espeak-ng: the same audio every run): "Um, I'd like to... | the train to Boston,
    # please." The segment before the 0.9 s pause is heard as "I'd like to...", so the judge waits its
    # longest, past the pause; the same silence for every ending (0.6 s) ends the turn inside it. Both
    # decide after the real end once Whisper's text is in. (It was "My order number is, | um, |" until
    # a fresh machine's Whisper heard that one as "I'm not hungry.": its cue was not in the audio.)
    from pipelines.stt import default_model_path, shared_whisper, transcribe
    from pipelines.turn_judge import TurnJudge, cue

    monkeypatch.setenv("STREAMVOX_CALLERS_DIR", str(tmp_path))
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng not installed (make system-deps)")
    (turn,) = eot.corpus_turns(["espeak-gb-m3/h-train"], "clean")
    assert [round(b - a, 1) for a, b in turn.pauses] == [0.9]
    model = shared_whisper(default_model_path())
    heard: list[str] = []
    decoded: dict[bytes, str] = {}

    def stt(audio: np.ndarray) -> str:
        # each segment decoded once: the second drive hears the same words at once, so its outcome is
        # the fixed silence's, not the decode time's (a loaded machine's 0.7 s decode outlasted the pause)
        key = audio.tobytes()
        if key not in decoded:
            decoded[key] = transcribe(model, audio)
        heard.append(decoded[key])
        return heard[-1]

    judge, clock = TurnJudge(), eot.SimClock()
    judged = await eot.drive_judged(turn, 0.2, None, lambda text, _p, _c: judge.wait_s(text), stt, clock)
    assert any(cue(h) == "continuing" for h in heard[:-1]), heard  # tiny.en: "I'd like to..."
    assert not judged.early and not judged.cuts, (judged, heard)
    assert 600 <= judged.delay_ms <= 2500, judged  # stop_secs + the judge's wait for a sentence, + Whisper
    fixed = await eot.drive_judged(turn, 0.2, None, lambda _t, _p, _c: 0.6, stt, clock)
    assert fixed.early and eot.cut_pauses(turn, fixed) == 1, fixed


def test_the_tuning_replay_decides_as_the_drive_does(eot) -> None:
    # scripts/turn_judge_tune.py replays recorded VAD events under a rule: a wait shorter than the
    # caller's pause ends the turn inside it (an early cut); a longer one is withdrawn by the next start
    from pipelines.turn_judge import TurnJudge

    tune = load_script("turn_judge_tune")
    turn = eot.Turn(audio=np.zeros(16000 * 4, np.float32), speech_end_s=3.0, pauses=[(1.0, 2.0)], label="mid_thought")
    events = [
        {"kind": "start", "t": 0.2},
        {"kind": "stop", "t": 1.2, "text": "Could you send me?", "acoustic": None, "stt_s": 0.2, "words": 0.001},
        {"kind": "start", "t": 2.2},
        {
            "kind": "stop",
            "t": 3.2,
            "text": "Could you send me the invoice?",
            "acoustic": None,
            "stt_s": 0.2,
            "words": 0.9,
        },
    ]
    held = tune.replay(turn, events, TurnJudge())  # 1.8 s for unfinished words: past the 1 s pause
    assert not held.early and held.delay_ms == pytest.approx(1000 * (3.2 + 0.2 - 3.0))  # the STT's 0.2 s
    cut = tune.replay(turn, events, TurnJudge(unlikely_s=0.5))
    assert cut.early and eot.cut_pauses(turn, cut) == 1


def test_smart_turn_analyzers_share_one_session_loaded_at_first_use(monkeypatch) -> None:
    # each call builds an analyzer; the ONNX session (~120 ms on the event loop when V3 loaded it per
    # call) is loaded once, when a prediction first reads it
    from pipelines import pipecat_turns

    monkeypatch.setattr(pipecat_turns, "_SMART_TURN", [])
    first, second = pipecat_turns.SharedSmartTurn(), pipecat_turns.SharedSmartTurn()
    assert pipecat_turns._SMART_TURN == []
    assert first._session is second._session and len(pipecat_turns._SMART_TURN) == 1
    assert first._session.get_inputs()  # a real onnxruntime session of the bundled model
