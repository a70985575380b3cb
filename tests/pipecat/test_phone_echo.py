"""A phone caller on speakerphone: the agent's own voice comes back in the uplink, and it must not answer it.

The Twilio caller plays what the agent sends into a small room (``support.echo_path.EchoPath``,
150 ms later, at -6 dB and at 0 dB) and that echo goes back up the line with whatever the caller
says. Before the agent cancelled its echo, its greeting was cut after "Hello," and it talked to
itself for the rest of the call (issue 18). Here the caller stays silent through a long greeting,
then asks one question: the greeting must play on (generous bounds: at most one ``clear``), the LLM
must be asked exactly once (the question, not the greeting), and the agent must answer.

Real: Silero VAD, Whisper tiny.en, the streamvox server and voice, Pipecat's Twilio transport,
WebRTC's AEC3. Fake: the LLM.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

import pytest
import websockets

from support.echo_path import EchoPath, Room
from support.pipecat_harness import TwilioCaller, counting_server, fake_llm, first_time, room_server, speech, voiced

GREETING = (
    "Hello, and welcome to the travel desk! I can help you plan a trip by train, by bus or by plane, "
    "and tell you what it costs. Where would you like to go today?"
)
QUESTION = "Can you tell me the capital of Italy?"


@contextlib.asynccontextmanager
async def _speakerphone_call(engine, echo_db: float, utterance: str, echo_cancel: str):
    """A Twilio caller on speakerphone (what the agent sends comes back in the uplink 150 ms later at
    ``echo_db``, through a small room) calling the demo with the long ``GREETING``. Yields (the
    caller, ``utterance`` as the line carries it, the agents, the LLM's requests) while the caller's
    send and receive tasks run."""
    from pipelines.pipecat_agent import AgentConfig, barge_in_confirm_mode, barge_in_lull_ms, phone_stt_rule

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    async with counting_server(engine) as tts_server, fake_llm() as (llm_url, llm_requests):
        said = await speech(tts_server.ws_url, utterance, sample_rate=8000, encoding="mulaw")
        config = AgentConfig(
            tts_url=tts_server.ws_url,
            llm_base_url=llm_url,
            llm_model="fake",
            greeting=GREETING,
            echo_cancel=echo_cancel,
            phone_stt=phone_stt_rule(os.environ),  # STREAMVOX_PHONE_STT: measured both ways (BENCHMARKS, "Echo")
            barge_in_confirm=barge_in_confirm_mode(os.environ),  # STREAMVOX_BARGE_IN_CONFIRM: the same
            barge_in_lull_ms=barge_in_lull_ms(os.environ),  # STREAMVOX_BARGE_IN_LULL_MS: the same
        )
        async with room_server(config) as (base, agents):
            async with websockets.connect(base.replace("http://", "ws://") + "/ws") as ws:
                echo = EchoPath(sample_rate=8000, delay_ms=150, gain_db=echo_db, room=Room(rt60_s=0.3, seed=7))
                caller = TwilioCaller(ws, echo=echo)
                await caller.hello()
                tasks = [asyncio.create_task(caller.send_audio()), asyncio.create_task(caller.receive())]
                try:
                    yield caller, said, agents, llm_requests
                finally:
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)


def _paused_s(pause) -> float:
    """How long one of the YieldGate's pauses held the bot's audio back."""
    return (pause.ended_at or pause.paused_at) - pause.paused_at


def _pauses(pauses) -> str:
    """Each pause, for the printed line: trigger, w (waits for words), s (a VAD segment in it), b (kept
    through the caller's breath after a word, once per b), outcome, how long, the wait for the
    decode after Pipecat's VAD stop, and the longest run of speech our VAD dropped in it."""
    out = []
    for p in pauses:
        flags = ("w" if p.by_words else "") + ("s" if p.segment else "") + ("b" * p.breaths)
        decode = ""
        if p.stopped_at is not None and p.decoded_at is not None:
            decode = f" decode {p.decoded_at - p.stopped_at:.2f}"
        run = f" run {p.run_ms / 1000:.2f}" if p.run_ms else ""
        out.append(f"{p.trigger}{'/' + flags if flags else ''} {p.outcome} {_paused_s(p):.2f}{decode}{run}")
    return "; ".join(out)


def _timeline(events: list[tuple[float, dict]], t0: float) -> str:
    """Voiced runs and clears, in seconds from ``t0``: what the assertion messages show."""
    out, run = [], None
    for t, ev in events:
        if ev["event"] == "clear":
            out.append(f"clear@{t - t0:.2f}")
        elif voiced(ev):
            run = [t, t] if run is None or t - run[1] > 0.3 else [run[0], t]
            if out and out[-1].startswith("voiced") and run[0] != t:
                out.pop()
            out.append(f"voiced {run[0] - t0:.2f}-{run[1] - t0:.2f}")
    return ", ".join(out)


# solo: under CPU load (load average 6-7 on 2 cores) the greeting reached the phone in bursts and the
# agent stopped itself in three runs of three (docs/BENCHMARKS.md, "On the phone line"); quiet, after
# the timing fixes of 12-03, 2 calls of 16 still did (AEC3's own lapses, issue 18 keeps them open);
# make test runs this check alone
@pytest.mark.solo
@pytest.mark.slow
# PHONE_ECHO_DB=-6,0 (and STREAMVOX_ECHO_CANCEL=off for the before) repeats it as a measurement;
# each call prints one summary line (pytest -s): docs/BENCHMARKS.md "On the phone line"
@pytest.mark.parametrize("echo_db", [float(x) for x in os.environ.get("PHONE_ECHO_DB", "-6").split(",")])
async def test_speakerphone_echo_is_not_a_caller(engine, echo_db: float) -> None:
    from pipelines.pipecat_agent import echo_mode

    async with _speakerphone_call(engine, echo_db, QUESTION, echo_mode(os.environ)) as (
        caller,
        question,
        agents,
        llm_requests,
    ):
        events = caller.events
        first = await first_time(events, lambda t, ev: voiced(ev), 30, "the greeting")
        # the greeting plays out: 1 s without a voiced packet after it started
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            last = max((t for t, ev in events if voiced(ev)), default=first)
            if time.monotonic() - last > 1.0:
                break
            await asyncio.sleep(0.1)
        greeting_s = last - first
        asked = time.monotonic()
        caller.outgoing.put_nowait(question)
        await first_time(events, lambda t, ev: t > asked + 0.5 and voiced(ev), 30, "the answer to the question")
    cleared = [t for t, ev in caller.events if ev["event"] == "clear"]
    timeline = _timeline(caller.events, first)
    echo_stats = [a.echo.canceller.stats for a in agents if getattr(a, "echo", None) is not None]
    pauses = [p for a in agents for p in a.gate.yields if p.paused_at < asked]

    before = [r for r in llm_requests if r["_received_at"] < asked]
    print(
        f"\nphone echo {echo_db:+} dB, canceller {echo_mode(os.environ)}: greeting {greeting_s:.1f} s, "
        f"self-interruptions {len([t for t in cleared if t < asked])}, LLM requests before the question {len(before)}, "
        f"in all {len(llm_requests)}, the bot paused in the greeting {len(pauses)} times "
        f"({sum(_paused_s(p) for p in pauses):.2f} s: echo residue the YieldGate's VAD took for an onset)"
        f"{': ' + _pauses(pauses) if pauses else ''}"
    )
    # Generous bounds: what this one call can hold every time. Without the canceller the greeting stops
    # after "Hello," and the agent talks to itself (8-29 self-interruptions, 13 LLM requests a call);
    # with it, a residue that still passes as the caller is rare - about one call in 8-15 at -6 and
    # 0 dB (the rate: this test repeated with PHONE_ECHO_DB=-6,0, docs/BENCHMARKS.md "Echo", command
    # c'; issue 18 keeps it open) - and is then one: it cuts the greeting, and the empty turn after
    # it may have the LLM ask the silent caller to repeat. A single call cannot tell that rate from
    # zero, so one such residue passes here (it failed CI on 12-05 when only the count allowed it).
    cut = [t for t in cleared if t < asked]
    assert len(cut) <= 1, f"the agent interrupted itself {len(cut)} times: {timeline}"
    assert greeting_s > 3.0 or cut, f"the greeting stopped after {greeting_s:.1f} s (it is ~9 s long): {timeline}"
    assert len(before) <= len(cut), f"the agent answered its own echo: {[r['messages'][-1] for r in before]}"
    asked_llm = [r for r in llm_requests if r["_received_at"] >= asked]
    assert len(asked_llm) == 1, f"{len(asked_llm)} LLM requests for one question"
    users = [m["content"] for m in asked_llm[0]["messages"] if m["role"] == "user"]
    assert any("capital" in u.lower() for u in users), users  # tiny.en on 8 kHz: "Italy" is often misheard
    if echo_stats:  # the canceller located the echo on the line
        assert echo_stats[0].delay_ms is not None, echo_stats[0]


def test_echo_mode_setting() -> None:
    from pipelines.pipecat_agent import AgentConfig, barge_in_confirm_mode, barge_in_lull_ms, cancels_echo, echo_mode

    assert barge_in_lull_ms({}) == 600.0
    assert barge_in_lull_ms({"STREAMVOX_BARGE_IN_LULL_MS": " 0 "}) == 0.0
    for bad in ("-5", "3000", "soon"):
        with pytest.raises(ValueError, match=f"LULL_MS must be milliseconds from 0 to 2000, got '{bad}'"):
            barge_in_lull_ms({"STREAMVOX_BARGE_IN_LULL_MS": bad})
    assert barge_in_confirm_mode({}) == "vad"
    assert barge_in_confirm_mode({"STREAMVOX_BARGE_IN_CONFIRM": " Words "}) == "words"
    with pytest.raises(ValueError, match="STREAMVOX_BARGE_IN_CONFIRM must be vad or words, got 'asr'"):
        barge_in_confirm_mode({"STREAMVOX_BARGE_IN_CONFIRM": "asr"})
    assert echo_mode({}) == "phone"
    assert echo_mode({"STREAMVOX_ECHO_CANCEL": " ON "}) == "on"
    assert AgentConfig.from_env().echo_cancel == os.environ.get("STREAMVOX_ECHO_CANCEL", "auto").strip().lower()
    # who gets the canceller: phone calls, and page calls on loudspeakers (auto, the Pipecat default)
    assert cancels_echo("auto", phone=True) and cancels_echo("phone", phone=True)
    assert cancels_echo("auto", phone=False, page_echo="browser-aec")
    assert cancels_echo("auto", phone=False, page_echo="agent-aec")  # loudspeakers, the raw microphone
    assert not cancels_echo("auto", phone=False, page_echo="raw-mic") and not cancels_echo("auto", phone=False)
    assert not cancels_echo("phone", phone=False, page_echo="browser-aec")
    assert cancels_echo("on", phone=False) and not cancels_echo("off", phone=True)
    with pytest.raises(ValueError, match="STREAMVOX_ECHO_CANCEL must be one of auto, phone, on, off, got 'yes'"):
        echo_mode({"STREAMVOX_ECHO_CANCEL": "yes"})


BARGE_IN = "Wait, can you tell me the capital of Italy?"


def _silent_at(events: list[tuple[float, dict]], after: float, gap_s: float = 0.5) -> float | None:
    """When the downlink fell silent after ``after``: its last voiced packet before ``gap_s`` without
    one (``after`` itself when it was already silent then)."""
    times = [t for t, ev in events if voiced(ev)]
    prev = max((t for t in times if t < after), default=after - gap_s)
    for t in (t for t in times if t >= after):
        if t - prev >= gap_s:
            return max(prev, after)
        prev = t
    return None


@pytest.mark.solo
@pytest.mark.slow
# A measurement of an open gap, not yet a check make test can hold: heard in 12 of 12 calls at 12-05's
# tree (silent 267 / 702 ms median / p95), but the caller's words are lost now and then (a residue that
# cut the bot just before, "I didn't know.", in 1 of 18 calls at -6 dB) and the p95 is over issue 18's
# 450 ms (docs/BENCHMARKS.md, "Echo", command i). PHONE_BARGE_DB=-6,0 runs it.
@pytest.mark.skipif(
    "PHONE_BARGE_DB" not in os.environ,
    reason="issue 18, open: a speakerphone caller's words over the echo are still lost now and then; "
    "PHONE_BARGE_DB=-6,0 measures it",
)
@pytest.mark.parametrize("echo_db", [float(x) for x in os.environ.get("PHONE_BARGE_DB", "-6").split(",")])
async def test_a_speakerphone_caller_talking_over_the_greeting_stops_it(engine, echo_db: float) -> None:
    """Double talk on the phone path: the caller on speakerphone (the greeting's echo in the uplink)
    talks over the greeting 3 s into it. The bot falls silent (the YieldGate's pause, then Pipecat's
    interruption), the phone gets ``clear``, and the LLM is asked the caller's question. Generous
    bounds; the figures are the printed line (docs/BENCHMARKS.md, "Echo"). A start strategy that
    waited for the caller to be heard for certain over the bot failed this (its transcript dropped)."""
    async with _speakerphone_call(engine, echo_db, BARGE_IN, "phone") as (caller, barge, agents, llm_requests):
        first = await first_time(caller.events, lambda t, ev: voiced(ev), 30, "the greeting")
        await asyncio.sleep(max(0.0, first + 3.0 - time.monotonic()))  # 3 s into the greeting
        barge_at = time.monotonic()
        caller.outgoing.put_nowait(barge)
        # what the caller meets over the next 14 s (the greeting would have ended by then), read
        # afterwards: the printed line says it whatever the outcome
        await asyncio.sleep(14.0)
    silent = _silent_at(caller.events, barge_at)
    cleared = min((t for t, ev in caller.events if ev["event"] == "clear" and t > barge_at), default=None)
    users = [m["content"] for r in llm_requests for m in r["messages"] if m["role"] == "user"]
    heard = "never" if silent is None else f"{1000 * (silent - barge_at):.0f} ms"
    print(
        f"\nphone barge-in over the echo {echo_db:+} dB (barge-in at {barge_at - first:.2f} s): silent {heard}, "
        f"clear {'never' if cleared is None else f'{1000 * (cleared - barge_at):.0f} ms'} after the onset; "
        f"LLM saw {users}; {_timeline(caller.events, first)}; pauses after it: "
        f"{_pauses([p for a in agents for p in a.gate.yields if p.paused_at >= barge_at - 0.5]) or 'none'}"
    )
    # generous (issue 18 asks 0.3 s at the ear; measured 0-1.62 s silent, 0.10-1.70 s to clear, BENCHMARKS)
    assert silent is not None and silent - barge_at < 2.5, _timeline(caller.events, first)
    assert cleared is not None and cleared - barge_at < 3.5, _timeline(caller.events, first)
    # the caller's words, through the canceller (tiny.en on the line: "Can you tell me the... of Beverly.")
    assert any(w in u.lower() for u in users for w in ("capital", "tell me", "italy")), users
