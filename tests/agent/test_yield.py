"""Yield, then confirm: the bot pauses at the VAD's first speech window, resumes on a cough.

Real parts: the TTS server (``tts_server``), the Silero VAD, a real-time ArraySink, and caller
sounds that go through the VAD: a band-limited noise burst, a synthetic cough (sim/sounds.py)
and real speech from the bundled voice. "Nothing lost, nothing twice" is checked sample by
sample: what the device played equals what the server sent, except the two short fade ramps.
"""

from __future__ import annotations

import asyncio
import itertools
import time

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from agent.runtime.bargein import BargeIn, BargeInMetrics, BargeInOptions, FalseInterruption
from agent.runtime.speech import UtteranceStatus
from agent.runtime.vad import SileroVAD, VADParams
from sim.barge_in import make_output
from sim.false_interruption import compare_played
from sim.sounds import cough, noise_burst
from tts_service.client import TTSClient

SR = 16000
CHUNK = 512
REPLY = "Your table is booked for seven thirty tonight, and we will send you a reminder an hour before."


def spy_pushes(out) -> list[np.ndarray]:
    """Record every frame the output pushes into its jitter buffer (the server's audio, in order)."""
    pushed: list[np.ndarray] = []
    real_push = out.jitter.push

    def push(samples, now=None):
        pushed.append(np.asarray(samples, dtype=np.int16).copy())
        return real_push(samples, now)

    out.jitter.push = push
    return pushed


async def feed_real_time(barge: BargeIn, audio: np.ndarray) -> None:
    """Caller audio in 32 ms chunks on the clock, as a microphone delivers it."""
    t0 = time.monotonic()
    for k in range(0, audio.size, CHUNK):
        piece = audio[k : k + CHUNK]
        captured_at = t0 + (k + piece.size) / SR
        delay = captured_at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        barge.feed(piece, captured_at=captured_at)


def new_barge(out, registry: CollectorRegistry, **options) -> BargeIn:
    return BargeIn(
        out,
        vad=SileroVAD(VADParams(sample_rate=SR)),
        options=BargeInOptions(**options),
        metrics=BargeInMetrics(registry),
    )


async def play_with_caller_sound(tts_server, sound: np.ndarray):
    """The bot says REPLY; 0.4 s into it the caller makes ``sound``; the reply plays to its end."""
    registry = CollectorRegistry()
    out = make_output(SR)
    pushed = spy_pushes(out)
    async with TTSClient(tts_server.url) as client, out:
        barge = new_barge(out, registry)
        utt = await out.say(client, REPLY)
        await utt.wait_playing(30)
        gap = np.zeros(int(0.4 * SR), np.float32)
        await feed_real_time(barge, np.concatenate((gap, sound, gap, gap)))
        status = await utt.wait(30)
        await barge.aclose()
    return out, barge, utt, status, np.concatenate(pushed), registry


def assert_played_exactly_once(out, utt, sent: np.ndarray) -> None:
    """Every sample the server sent was played once, in order; only the ramps may differ."""
    played = out.sink.played_audio()
    assert played.size == sent.size == utt.samples_in == utt.samples_played
    fade_n = round(out.pause_fade_ms * SR / 1000)
    assert compare_played(played, sent, fade_n=fade_n, pauses=out.pauses) == []


async def test_cough_pauses_the_bot_then_it_resumes_where_it_stopped(tts_server):
    out, barge, utt, status, sent, registry = await play_with_caller_sound(tts_server, cough())
    assert status is UtteranceStatus.FINISHED and barge.records == []
    # the bot did yield (the cough tripped the VAD's first speech window) and came back
    assert out.pauses == out.resumes >= 1
    assert {f.reason for f in barge.false_interruptions} == {"dropped"} and not out.paused
    fi = barge.false_interruptions[0]
    assert isinstance(fi, FalseInterruption)
    print(f"\n[cough] yield {fi.yield_ms:.0f} ms, quiet for {fi.gap_ms:.0f} ms, {fi.held_ms:.0f} ms held back")
    assert 0 < fi.yield_ms <= 200 and 0 <= fi.gap_ms <= 600
    assert_played_exactly_once(out, utt, sent)
    # the device was quiet during the gap: the played audio has a hole of about gap_ms
    spans = out.sink.played
    holes = [b.start_s - a.end_s(SR) for a, b in itertools.pairwise(spans)]
    assert max(holes) == pytest.approx(fi.gap_ms / 1000, abs=0.03)
    assert [w.word for w in utt.heard_words] == REPLY.split()
    assert registry.get_sample_value("streamvox_bargein_false_interruptions_total", {"reason": "dropped"}) == 1


async def test_noise_burst_does_not_even_pause_the_bot(tts_server):
    out, barge, _utt, status, sent, _ = await play_with_caller_sound(tts_server, noise_burst(150, rms=0.1))
    assert status is UtteranceStatus.FINISHED
    assert out.pauses == 0 and barge.false_interruptions == [] and barge.records == []
    assert np.array_equal(out.sink.played_audio(), sent)


async def test_confirmed_speech_after_the_yield_cancels_and_keeps_only_what_was_heard(tts_server, speech):
    registry = CollectorRegistry()
    out = make_output(SR)
    async with TTSClient(tts_server.url) as client, out:
        barge = new_barge(out, registry)
        utt = await out.say(client, REPLY)
        await utt.wait_playing(30)
        start, _ = speech.bounds()
        talk = speech.at(SR)[int(start * SR) : int((start + 1.0) * SR)]
        await feed_real_time(barge, np.concatenate((np.zeros(int(0.5 * SR), np.float32), talk)))
        await barge.wait_ready(5)
        rec = barge.records[-1]
        # all three buffers flushed: sink and held audio, jitter buffer, and the server (acked)
        assert rec.outcome == "acked" and rec.acked and utt.status is UtteranceStatus.INTERRUPTED
        assert out.sink.queued_ms == 0 and out.jitter.depth_ms == 0 and not out.paused
        assert rec.jitter_dropped_ms > 0
        await barge.aclose()
    print(
        f"\n[yield+confirm] yield {rec.yield_ms:.0f} ms, onset->silence {rec.onset_to_silence_ms:.0f} ms, "
        f"cancel->ack {rec.cancel_to_ack_ms:.1f} ms, heard {utt.heard_ms:.0f} ms"
    )
    assert rec.yield_ms is not None and 0 < rec.yield_ms <= 150 < rec.onset_to_silence_ms
    assert barge.false_interruptions == [] and out.pauses == 1 and out.resumes == 0
    # the caller heard nothing after the pause; the utterance says it heard exactly what played
    assert out.sink.played_after(rec.yielded_at) == 0
    assert utt.samples_heard == out.sink.played_audio().size
    heard = [w.word for w in utt.heard_words]
    assert 0 < len(heard) < len(REPLY.split()) and heard == REPLY.split()[: len(heard)]
    assert registry.get_sample_value("streamvox_bargein_yield_seconds_count") == 1


async def test_external_vad_onset_resumes_after_the_window_unless_confirmed(tts_server):
    out = make_output(SR)
    async with TTSClient(tts_server.url) as client, out:
        barge = BargeIn(out, options=BargeInOptions(resume_after_ms=300), metrics=BargeInMetrics(CollectorRegistry()))
        utt = await out.say(client, REPLY)
        await utt.wait_playing(30)
        barge.speech_onset()
        assert out.paused and utt.active
        await asyncio.sleep(0.5)  # nobody confirmed: the window ran out
        assert not out.paused and [f.reason for f in barge.false_interruptions] == ["timeout"]
        barge.speech_onset()
        barge.speech_started()  # confirmed (Pipecat's or LiveKit's VAD said speech)
        await barge.wait_ready(5)
        assert barge.records[-1].yielded_at is not None and barge.records[-1].outcome == "acked"
        await asyncio.sleep(0.4)  # the cancelled yield's timer must not resume anything
        assert len(barge.false_interruptions) == 1 and utt.status is UtteranceStatus.INTERRUPTED
        await barge.aclose()


def test_options_and_sounds_validate():
    with pytest.raises(ValueError, match="resume_after_ms"):
        BargeInOptions(resume_after_ms=0)
    assert cough().dtype == np.float32 and np.abs(cough()).max() == pytest.approx(0.5, abs=1e-3)
    assert noise_burst(150).size == 2400


def test_compare_played_names_lost_replayed_and_changed_samples():
    sent = (np.arange(1000) % 200 - 100).astype(np.int16) * 100
    assert compare_played(sent, sent, fade_n=10, pauses=0) == []
    assert "replayed" in compare_played(np.concatenate((sent, sent[:1])), sent, fade_n=10, pauses=1)[0]
    assert "lost" in compare_played(sent[1:], sent, fade_n=10, pauses=1)[0]
    louder = sent.copy()
    louder[5] = sent[5] * 2 if sent[5] else 7
    assert compare_played(louder, sent, fade_n=10, pauses=1) == ["a ramp amplified the audio"]


async def test_simulate_false_interruption_command(tts_server, capsys):
    from tts_service.cli import main

    argv = ["simulate", "false-interruption", "--url", tts_server.url, "--runs", "2", "--sound", "cough"]
    code = await asyncio.wait_for(asyncio.to_thread(main, argv), 120)
    text = capsys.readouterr().out
    print(text)
    assert code == 0, text
    assert "samples lost or replayed: 0" in text and "barged in: 0" in text and "result: OK" in text
