"""SpeechOutput against the real TTS server: real-time playout, stop with and without a fade.

The sink is an ArraySink on the wall clock, i.e. a sound device simulated in real time, so the
assertions are about what a listener would have heard and when.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from agent.runtime.speech import UtteranceStatus
from sim.barge_in import LONG_ANSWER, make_output
from tts_service.client import TTSClient, TTSContext

SR = 16000
SHORT = "Hello there. This reply is played in real time."


async def until(predicate, timeout: float = 10.0, step: float = 0.005) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(step)


async def test_plays_a_reply_in_real_time_and_counts_frames(tts_server):
    out = make_output(SR)
    async with TTSClient(tts_server.url) as client, out:
        utt = await out.say(client, SHORT)
        assert out.speaking
        assert await utt.wait(30) is UtteranceStatus.FINISHED
        assert not out.speaking
        assert client.connections == 1

    sink = out.sink
    audio_s = utt.samples_in / SR
    wall_s = utt.ended_at - utt.first_play_at
    print(
        f"\n[speech] {audio_s:.2f} s of audio in {utt.frames_in} frames, played in {wall_s:.2f} s; "
        f"TTFB {1000 * utt.ttfb_s:.0f} ms, first sample played {1000 * utt.first_play_s:.0f} ms; {out.stats()}"
    )
    assert utt.frames_in == utt.context.frames == utt.frames_played == out.frames_played
    assert utt.samples_in == utt.samples_played == sink.written_samples == sink.played_audio().size
    # paced: never faster than real time; slower only by gaps on a busy machine
    assert audio_s - 0.05 <= wall_s <= audio_s + 3.0
    assert 0 < utt.ttfb_s < 5.0 and utt.first_play_s >= utt.ttfb_s
    assert out.stale_frames_played == 0 and out.frames_refused == 0
    assert utt.heard_ms == pytest.approx(1000 * audio_s)
    assert [w.word for w in utt.heard_words] == SHORT.split()


@pytest.mark.parametrize("fade_ms", [0.0, 20.0])
async def test_stop_silences_at_once_and_refuses_late_frames(tts_server, fade_ms):
    out = make_output(SR, fade_ms=fade_ms)
    async with TTSClient(tts_server.url) as client, out:
        utt = await out.say(client, LONG_ANSWER)
        await utt.wait_playing(30)
        await asyncio.sleep(0.6)
        # on a loaded machine the server can fall behind: stop while audio is queued
        await until(lambda: out.sink.queued_ms >= fade_ms + 5 and out.jitter.depth_ms > 0)
        frames_before = utt.frames_in
        res = out.stop(fade=fade_ms > 0)
        assert res.utterance is utt and utt.status is UtteranceStatus.INTERRUPTED and not out.speaking
        assert await utt.wait(1) is UtteranceStatus.INTERRUPTED
        # the context is deliberately not cancelled yet: its frames keep coming and are refused
        await until(lambda: utt.frames_refused > 0)
        assert utt.frames_in == frames_before
        await utt.context.cancel()
        await asyncio.sleep(0.1)

    sink = out.sink
    n_fade = round(fade_ms * SR / 1000)
    print(
        f"\n[stop fade={fade_ms:.0f} ms] dropped {res.sink_dropped_ms:.0f} ms in the sink, "
        f"{res.jitter_dropped_ms:.0f} ms in the jitter buffer; {utt.frames_refused} late frames refused"
    )
    assert res.sink_dropped_ms > 0 and res.jitter_dropped_ms > 0
    assert res.fade_ms == pytest.approx(fade_ms)
    assert res.silent_at == pytest.approx(res.at + n_fade / SR, abs=0.005)
    # the listener hears nothing of the bot after the silence point, and only the fade before it
    assert sink.played_after(res.silent_at) == 0
    assert sink.played_after(res.at) == n_fade
    if n_fade:
        fade = np.concatenate([s.samples for s in sink.played if s.start_s >= res.at - 1e-6])
        envelope = 0.5 * (1 + np.cos(np.linspace(0.0, np.pi, n_fade + 1)[1:]))
        assert fade.size == n_fade
        assert np.all(np.abs(fade.astype(np.int32)) <= envelope * 32768 + 1)
        assert fade[-1] == 0
    assert out.stale_frames_played == 0
    assert utt.samples_heard is not None and 0 < utt.samples_heard <= utt.samples_played
    # heard: what the sink had played at the stop, at most the time it had been playing
    assert 0 < utt.heard_ms <= 1000 * (res.at - utt.first_play_at) + 1


async def test_play_checks_its_preconditions():
    out = make_output(SR)
    ctx = TTSContext(client=None, context_id="x", sample_rate=SR)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="start"):
        out.play(ctx)
    async with out:
        with pytest.raises(ValueError, match="sample_rate=16000"):
            out.play(TTSContext(client=None, context_id="y", sample_rate=22050))  # type: ignore[arg-type]
        out.play(ctx)
        with pytest.raises(RuntimeError, match="still playing"):
            out.play(ctx)
        res = out.stop()
        assert res.fade_ms == 0 and res.silent_at == res.at  # nothing was playing: nothing to fade
