"""BargeIn with the real TTS server, the real Silero VAD and real speech (our own voice).

The bot plays into an ArraySink on the wall clock (a device simulated in real time), so "no bot
audio after the flush" is checked on what the listener would have heard. The server runs in its
own thread (``tts_server`` in conftest), so stalling the agent's loop does not stall it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from agent.runtime.bargein import BargeIn, BargeInIgnored, BargeInMetrics, BargeInOptions, BargeInRecord
from agent.runtime.speech import UtteranceStatus
from agent.runtime.vad import SileroVAD, VADParams
from sim.barge_in import LONG_ANSWER, ScenarioConfig, make_output, run_barge_in
from tts_service.client import TTSClient

SR = 16000
CHUNK = 512  # 32 ms
SHORT = "Thank you, your booking is confirmed."


def caller_clip(speech, seconds: float) -> np.ndarray:
    """The first ``seconds`` of the fixture sentence from its audible start, 16 kHz float32."""
    start, _ = speech.bounds()
    audio = speech.at(SR)
    return audio[int(start * SR) : int((start + seconds) * SR)].copy()


def burst(speech, ms: float) -> np.ndarray:
    """``ms`` of speech with 10 ms fades, as in the VAD tests (no clicks)."""
    b = caller_clip(speech, ms / 1000)
    ramp = np.linspace(0.0, 1.0, SR // 100, dtype=np.float32)
    b[: ramp.size] *= ramp
    b[-ramp.size :] *= ramp[::-1]
    return b


def feed_chunks(barge: BargeIn, audio: np.ndarray, *, t0: float | None = None) -> list:
    """Feed at once; with ``t0``, stamp each chunk as captured in real time from ``t0``."""
    events = []
    for k in range(0, audio.size, CHUNK):
        piece = audio[k : k + CHUNK]
        captured_at = None if t0 is None else t0 + (k + piece.size) / SR
        events += barge.feed(piece, captured_at=captured_at)
    return events


async def until(predicate, timeout: float = 10.0, step: float = 0.005) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(step)


def stall_this_loop(seconds: float) -> None:
    """Block the agent's event loop, as a busy agent process would (the server keeps going)."""
    time.sleep(seconds)


def new_barge(out, *, registry=None, **options) -> BargeIn:
    return BargeIn(
        out,
        vad=SileroVAD(VADParams(sample_rate=SR)),
        options=BargeInOptions(**options),
        metrics=BargeInMetrics(registry if registry is not None else CollectorRegistry()),
    )


# ---------------------------------------------------------------------------- the scenario


async def test_barge_in_end_to_end(tts_server, speech):
    registry = CollectorRegistry()
    seen: list = []
    out = make_output(SR)
    async with TTSClient(tts_server.url) as client, out:
        barge = new_barge(out, registry=registry)
        barge.add_listener(seen.append)
        cfg = ScenarioConfig(at_ms=800, tail_ms=400)
        res = await run_barge_in(client, out, barge, caller_clip(speech, 1.4), cfg)
        assert client.connections == 1 and client.reconnects == 0
        await barge.aclose()

    rec = res.record
    assert res.ok, res.problems
    assert res.barged_in and isinstance(rec, BargeInRecord)
    print(
        f"\n[barge-in] onset->silence {rec.onset_to_silence_ms:.0f} ms (VAD decision {rec.vad_decision_ms:.0f}, "
        f"reaction {rec.react_ms:.1f}, fade {rec.fade_ms:.0f}); yield {rec.yield_ms:.0f} ms; "
        f"cancel->ack {rec.cancel_to_ack_ms:.1f} ms; "
        f"dropped after cancel {rec.frames_dropped} (server never sent {rec.frames_dropped_server}); "
        f"audio after onset {rec.audio_after_onset_ms:.0f} ms; next turn TTFB {res.next_ttfb_ms:.0f} ms"
    )
    # 1. silence first, measured from the caller's real onset
    assert rec.outcome == "acked" and rec.acked
    assert abs(rec.onset_at - res.true_onset_at) <= 0.1
    assert 200 <= rec.vad_decision_ms <= 300
    assert rec.handled_at <= rec.cancel_sent_at <= rec.ready_at  # flush before cancel before ack
    assert 200 <= rec.onset_to_silence_ms <= 1000
    # the sink played no bot audio after the silence point (before the next turn), and the last
    # bot sample it played ended there
    sink = out.sink
    assert res.stale_audio_ms == 0 and res.stale_frames_played == 0 and rec.stale_frames_played == 0
    assert res.sink_silent_at is not None and res.sink_silent_at <= rec.silent_at + 1e-3
    # "audio played after onset" agrees with what the device played between onset and silence
    played_ms = 1000 * (sink.played_after(rec.onset_at) - sink.played_after(rec.silent_at)) / SR
    assert rec.audio_after_onset_ms == pytest.approx(played_ms, abs=45)
    # 2-4. the server acknowledged; every late frame was dropped and counted
    assert 0 < rec.cancel_to_ack_ms < 1000
    assert rec.frames_dropped == rec.frames_dropped_client + rec.frames_dropped_local
    assert res.frames_dropped_client == rec.frames_dropped_client
    assert res.bot_status == UtteranceStatus.INTERRUPTED.value
    # 5. the next turn, same connection, played normally
    assert res.next_status == "finished" and 0 < res.next_ttfb_ms < 5000
    assert res.connections == 1
    # events and metrics
    assert rec in seen and barge.events.get_nowait() in (rec, *res.ignored)
    assert registry.get_sample_value("streamvox_bargein_total", {"outcome": "acked"}) == 1
    assert registry.get_sample_value("streamvox_bargein_onset_to_silence_seconds_count") == 1
    assert registry.get_sample_value("streamvox_bargein_cancel_ack_seconds_count") == 1
    assert registry.get_sample_value("streamvox_bargein_stale_frames_played_total") == 0


async def test_frames_arriving_after_the_cancel_are_dropped_and_counted(tts_server):
    out = make_output(SR)
    async with TTSClient(tts_server.url) as client, out:
        barge = BargeIn(out)  # driven by another VAD's events
        # a loaded machine can leave the server without a frame due during the stall: retry
        for _attempt in range(3):
            utt = await out.say(client, LONG_ANSWER)
            await utt.wait_playing(30)
            with contextlib.suppress(TimeoutError):  # the server is ahead: frames fall due steadily
                await until(lambda: out.jitter.depth_ms >= 250, timeout=5)
            dropped_before, frames_before = client.frames_dropped, utt.context.frames
            # the server keeps sending (paced, ~46 ms frames) while this loop is stalled: those
            # frames wait in the socket and are read only after the barge-in gated the context
            stall_this_loop(0.4)
            barge.speech_started()
            assert utt.status is UtteranceStatus.INTERRUPTED and not barge.ready
            await barge.wait_ready(5)
            rec = barge.records[-1]
            await asyncio.sleep(0.3)  # nothing more may arrive for it after the ack
            assert rec.outcome == "acked"
            assert utt.context.frames == frames_before
            assert client.frames_dropped - dropped_before == rec.frames_dropped_client
            assert out.stale_frames_played == 0
            if rec.frames_dropped_client:
                break
        nxt = await out.say(client, SHORT)
        assert await nxt.wait(30) is UtteranceStatus.FINISHED
        assert client.connections == 1

    print(f"\n[late frames] {rec.frames_dropped_client} dropped by the client, {rec.frames_dropped_local} locally")
    assert rec.frames_dropped_client >= 1
    assert out.sink.played_after(rec.silent_at) == nxt.samples_played  # only the next turn's audio


# ---------------------------------------------------------------------------- not barging in


async def test_silence_and_white_noise_do_not_barge_in(tts_server):
    out = make_output(SR)
    async with TTSClient(tts_server.url) as client, out:
        barge = new_barge(out)
        utt = await out.say(client, LONG_ANSWER)
        await utt.wait_playing(30)
        noise = np.random.default_rng(7).normal(0.0, 0.05, 3 * SR).astype(np.float32)  # -26 dBFS RMS
        events = feed_chunks(barge, np.zeros(2 * SR, np.float32))
        events += feed_chunks(barge, noise)
        assert events == [] and barge.records == [] and barge.ignored == []
        assert utt.active and out.sink.flushes == []
        out.stop()
        await utt.context.cancel()


async def test_burst_shorter_than_min_speech_does_not_barge_in(tts_server, speech):
    out = make_output(SR)
    async with TTSClient(tts_server.url) as client, out:
        barge = new_barge(out, min_speech_ms=600)
        utt = await out.say(client, LONG_ANSWER)
        await utt.wait_playing(30)
        silence = np.zeros(SR // 2, np.float32)
        # shorter than the VAD's own 200 ms: no speech start; the bot yielded and resumed
        events = feed_chunks(barge, np.concatenate((silence, burst(speech, 120), silence)))
        assert [e.kind for e in events] == ["onset", "onset_dropped"]
        assert [f.reason for f in barge.false_interruptions] == ["dropped"] and not out.paused
        # 400 ms: the VAD declares speech, but the caller stops before the 600 ms asked for
        events = feed_chunks(barge, np.concatenate((burst(speech, 400), silence, silence)))
        assert [e.kind for e in events] == ["onset", "speech_start", "speech_end"]
        assert barge.records == [] and [i.reason for i in barge.ignored] == ["too_short"]
        assert [f.reason for f in barge.false_interruptions] == ["dropped", "too_short"]
        assert utt.active and not out.paused and out.pauses == out.resumes == 2
        # control: the caller keeps talking: barge-in once 600 ms of speech were heard
        barge.reset_vad()
        feed_chunks(barge, np.concatenate((caller_clip(speech, 1.2), silence)), t0=time.monotonic())
        assert not utt.active
        await barge.wait_ready(5)
        rec = barge.records[-1]
        assert rec.outcome == "acked" and 600 <= rec.vad_decision_ms <= 700


async def test_utterance_that_denies_interruption_plays_to_the_end(tts_server, speech):
    registry = CollectorRegistry()
    out = make_output(SR)
    async with TTSClient(tts_server.url) as client, out:
        barge = new_barge(out, registry=registry)
        utt = await out.say(client, SHORT, allow_interruptions=False)
        await utt.wait_playing(30)
        events = feed_chunks(barge, caller_clip(speech, 0.8))
        assert [e.kind for e in events] == ["onset", "speech_start"]
        assert utt.active and out.pauses == 0  # no yield either
        assert await utt.wait(30) is UtteranceStatus.FINISHED
    assert barge.records == []
    assert isinstance(barge.ignored[0], BargeInIgnored) and barge.ignored[0].reason == "denied"
    assert out.sink.flushes == [] and utt.frames_played == utt.frames_in
    assert registry.get_sample_value("streamvox_bargein_ignored_total", {"reason": "denied"}) == 1


# ---------------------------------------------------------------------------- connection trouble


async def test_cancel_without_ack_times_out_reconnects_and_logs(tts_server, caplog):
    out = make_output(SR)
    async with TTSClient(tts_server.url, cancel_ack_timeout_s=0.3) as client, out:
        barge = BargeIn(out)
        utt = await out.say(client, LONG_ANSWER)
        await utt.wait_playing(30)
        await asyncio.sleep(0.3)
        # the server hangs for a second: the cancel goes out, no ack comes back in time
        tts_server.loop.call_soon_threadsafe(time.sleep, 1.0)
        await asyncio.sleep(0.05)
        with caplog.at_level(logging.WARNING):
            barge.speech_started()
            stop = out.last_stop
            await barge.wait_ready(10)
        rec = barge.records[-1]
        assert rec.outcome == "timeout" and not rec.acked
        assert any("no cancel ack" in r.getMessage() for r in caplog.records)
        # silence did not wait for the network
        assert rec.silent_at == stop.silent_at and out.sink.played_after(stop.silent_at) == 0
        # the client dropped the untrusted connection and reconnected; the next turn plays
        nxt = await out.say(client, SHORT)
        assert await nxt.wait(30) is UtteranceStatus.FINISHED
        assert client.connections == 2 and client.reconnects == 1


async def test_lost_connection_abandons_the_turn_and_never_replays(tts_server, speech, caplog):
    out = make_output(SR)
    async with TTSClient(tts_server.url) as client, out:
        barge = new_barge(out)
        utt = await out.say(client, LONG_ANSWER)
        await utt.wait_playing(30)
        await asyncio.sleep(1.0)

        async def kill_connections() -> int:
            conns = list(tts_server.server._connections)
            for conn in conns:
                await conn.ws.close()
            return len(conns)

        with caplog.at_level(logging.WARNING):
            assert await asyncio.to_thread(tts_server.run, kill_connections()) == 1
            assert await utt.wait(5) is UtteranceStatus.LOST
        stop = out.last_stop
        assert stop is not None and stop.utterance is utt
        assert any("abandoning" in r.getMessage() for r in caplog.records)
        frames_at_loss = utt.frames_in
        # what the caller heard is reported, as a prefix of the answer
        heard = [w.word for w in utt.heard_words]
        assert 0 < len(heard) < len(LONG_ANSWER.split()) and heard == LONG_ANSWER.split()[: len(heard)]
        # the caller talking now is ordinary turn-taking, not a barge-in
        feed_chunks(barge, caller_clip(speech, 0.8))
        assert barge.records == [] and [i.reason for i in barge.ignored] == ["not_speaking"]
        # the next turn reconnects and speaks new text: nothing of the old answer is replayed
        nxt = await out.say(client, SHORT)
        assert await nxt.wait(30) is UtteranceStatus.FINISHED
        assert client.connections == 2 and client.reconnects == 1
    assert utt.frames_in == frames_at_loss and out.stale_frames_played == 0
    assert out.sink.played_after(stop.silent_at) == nxt.samples_played == nxt.samples_in


# ---------------------------------------------------------------------------- the command


async def test_simulate_command_prints_the_summary_and_writes_json(tts_server, tmp_path, capsys):
    from tts_service.cli import main

    path = tmp_path / "bargein.json"
    argv = ["simulate", "barge-in", "--url", tts_server.url, "--runs", "1", "--at-ms", "600"]
    argv += ["--caller-text", "Wait, stop right there.", "--json", str(path)]
    # the command runs its own event loop: give it a thread, as a separate process would
    code = await asyncio.wait_for(asyncio.to_thread(main, argv), 120)
    text = capsys.readouterr().out
    print(text)
    assert code == 0, text
    lines = text.splitlines()
    assert any(line.startswith("onset to silence ms: median ") for line in lines)
    assert any(line.startswith("yield ms: median ") for line in lines)
    assert any(line.startswith("cancel to ack ms: median ") for line in lines)
    assert "stale frames played: 0" in lines
    report = json.loads(path.read_text())
    summary = report["summary"]
    assert summary["runs"] == 1 and summary["barge_ins"] == 1 and summary["acked"] == 1
    assert summary["stale_frames_played"] == 0 and summary["connections"] == 1
    assert summary["yield_ms"]["max"] < summary["onset_to_silence_ms"]["min"]
    assert all(r["ok"] and r["next_status"] == "finished" for r in report["runs"])
