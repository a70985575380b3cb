"""The demo in a real browser, offline: headless Chromium opens our page, its fake microphone talks.

Real: the whole demo as ``make demo`` starts it (``python -m pipelines.pipecat_agent``: the TTS
server, the local LLM, Whisper, Silero VAD, Pipecat's SmallWebRTC transport), Chromium's WebRTC
and WebAudio, and Whisper again to check what the page heard. Fake: only the microphone, a WAV
spoken by the bundled voice (Chromium's ``--use-file-for-fake-audio-capture``).

The page runs with headphones on (echo cancellation off): a fake microphone has no echo to
cancel, and with it on Chromium suppresses the caller's voice while the agent talks (see
docs/BENCHMARKS.md). The bounds are in ``harness.Bounds``; screenshots and the session's JSON go
to ``out/browser/``.

A second session adds the agent's own voice back into what the page sends (``echo_path.js``: a
loudspeaker in a small room, after the browser's processing): the agent must not stop or answer
with the caller silent. The echo path itself is checked first, against a stand-in agent on a
loopback peer connection (``echo_loopback.js``), so that a silent echo cannot pass for a good agent.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from pipelines.pipecat_agent import GREETING
from pipelines.pipecat_room import WEB_DIR
from support.browser import harness as H

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def chromium() -> tuple[str, str]:
    paths = H.chromium_paths()
    if isinstance(paths, str):
        pytest.skip(paths)
    return paths


@pytest.fixture(scope="module")
def plan() -> H.MicPlan:
    return H.make_mic_wav(H.OUT / "mic.wav")


@pytest.fixture(scope="module")
def demo(chromium):
    with H.Demo() as running:
        yield running


# timing-sensitive: make test runs these alone, after the rest (pyproject: markers)
pytestmark = pytest.mark.solo

_words = H.words


def _unheard_greeting_bigrams(heard_part: str) -> set[str]:
    """Pairs of consecutive greeting words from the part the caller cut off."""
    rest = _words(GREETING)[len(_words(heard_part)) :]
    return {f"{a} {b}" for a, b in itertools.pairwise(rest)}


def test_talk_to_the_demo_in_a_real_browser(chromium, plan, demo) -> None:
    browser, driver = chromium
    s = H.run_session(
        demo.base, plan, headphones=True, browser=browser, driver_path=driver, shots=H.OUT, record_audio=True
    )
    (H.OUT / "session.json").write_text(json.dumps({"figures": s.figures(), "page": s.page}, indent=1, default=str))
    page, b = s.page, H.BOUNDS
    assert page["state"] == "connected", f"the page says: {page['error']}"
    assert page["echoMode"] == "raw-mic"  # headphones: the page sent the raw microphone

    # offline and clean: nothing but the agent that served the page, no console error
    assert s.requests, "the browser log recorded no request at all"
    assert s.foreign_requests() == []
    assert s.console_errors == []

    # the greeting is heard, as words and as audio, before the caller talks over it
    greeting = next((seg for seg in page["botSegments"] if s.mic_t(seg["start"]) < plan.barge_in[0]), None)
    assert greeting is not None, f"no agent audio before the barge-in at {plan.barge_in[0]} s: {page['botSegments']}"
    assert s.mic_t(greeting["start"]) < b.greeting_s
    spoken = page["transcript"][0]
    # as many of its words as came before the barge-in (on a loaded CI machine the greeting may
    # start 0.3 s before it: then "Hello!" alone is right), in order, from its start
    said = _words(spoken["text"])
    assert spoken["who"] == "agent" and said and said == _words(GREETING)[: len(said)], page["transcript"]

    # talking over it silences it at the page, fast; the server cancelled and got its ack
    barge = s.barge_in()
    assert barge is not None, f"no barge-in measured at the page: {page['records']}"
    assert barge["silence_ms"] <= b.barge_in_silent_ms, barge
    assert barge["yield_ms"] <= b.barge_in_yield_ms, barge
    assert barge["interrupted"] and spoken["interrupted"]
    assert barge.get("server") and barge["server"]["cancel_ack"] is not None, barge

    # nothing of the interrupted greeting is heard afterwards
    whisper = H.load_whisper()
    after_barge = H.transcribe(s.audio["after_barge_in"][1], whisper)
    leaked = {bg for bg in _unheard_greeting_bigrams(spoken["text"]) if bg in " ".join(_words(after_barge))}
    assert not leaked, f"the cut-off greeting was heard after the barge-in: {after_barge!r}"
    later_words = " ".join(w["text"] for w in page["botWords"] if w["t"] > barge["t"]).lower()
    assert not {bg for bg in _unheard_greeting_bigrams(spoken["text"]) if bg in later_words}, later_words

    # the question gets a spoken English answer, soon enough; the server's stages came with it
    answer = s.answer()
    assert answer is not None, f"no reply to the question measured at the page: {page['records']}"
    assert answer["v2v_ms"] <= b.answer_ms, answer
    assert answer.get("server") and answer["server"]["tts_first_audio"] is not None, answer
    heard = H.transcribe(s.audio["after_question"][1], whisper)
    print(f"page figures: {json.dumps(s.figures())}\nanswer heard: {heard!r}")
    assert len(_words(heard)) >= b.answer_words, f"the answer is not English speech: {heard!r}"
    assert [p.name for p in s.screenshots] == ["1-greeting.png", "2-answered.png"]
    assert s.self_interruptions()["count"] == 0, s.self_interruptions()
    # the browser's jitter buffer, each second of the call (what browser_scenario reports): read, and sane
    series = page["jitterSeries"]
    assert len(series) >= 5 and all(0 <= x["ms"] < 2000 for x in series), series


# ---------------------------------------------------------------- the agent's echo


ECHO = H.EchoPath(db=-6.0, delay_ms=200.0)


def _rt60(h: np.ndarray, rate: int) -> float:
    """Schroeder's backward integration, the -5 to -25 dB slope extrapolated to 60 dB (T20)."""
    tail = np.cumsum((h.astype(np.float64) ** 2)[::-1])[::-1]
    edc = 10 * np.log10(tail / tail[0])
    i5, i25 = np.argmax(edc <= -5), np.argmax(edc <= -25)
    return 3.0 * (i25 - i5) / rate


def test_the_echo_path_adds_the_agents_voice_late_and_at_its_level(chromium, page_without_agent) -> None:
    browser, driver_path = chromium
    mic = H.MicPlan(H.OUT / "silence.wav", (0, 0), (0, 0))
    H.write_silence(mic.path, 10.0)
    driver = H.open_browser(mic.path, browser=browser, driver=driver_path, echo=ECHO)
    try:
        driver.get(page_without_agent)
        driver.set_script_timeout(30)
        got = driver.execute_async_script((H.ROOT / "tests/browser/echo_loopback.js").read_text())
        rooms = [
            np.array(driver.execute_script("return Array.from(window.streamvoxEcho.impulse(...arguments));", *a))
            for a in ((1, 0.3, 16000), (1, 0.3, 16000), (2, 0.3, 16000), (1, 0.6, 16000))
        ]
    finally:
        driver.quit()
    assert "error" not in got, got
    assert got["echo"]["remoteTracks"] == 1 and got["echo"]["micStreams"] == 1, got
    # late by the delay (plus one WebAudio hop, a few tens of ms), at the level asked for
    lag = got["onsetSentMs"] - got["onsetHeardMs"]
    assert ECHO.delay_ms <= lag <= ECHO.delay_ms + 120, got
    assert abs(got["sentDb"] - got["heardDb"] - ECHO.db) <= 2.0, got
    # the page's meters still hear the caller alone (here: the silent file)
    assert got["meterMaxDb"] < -80, got
    # the room: its seed makes it, its RT60 is the one asked for, unit energy
    assert np.array_equal(rooms[0], rooms[1]) and not np.array_equal(rooms[0], rooms[2])
    assert abs(float(np.sum(rooms[0] ** 2)) - 1.0) < 1e-3
    assert 0.24 <= _rt60(rooms[0], 16000) <= 0.36 and 0.48 <= _rt60(rooms[3], 16000) <= 0.72


def test_echo_path_options_are_checked() -> None:
    with pytest.raises(ValueError, match="echo delay -5 ms"):
        H.EchoPath(delay_ms=-5)
    with pytest.raises(ValueError, match="room RT60 9 s"):
        H.EchoPath(rt60_s=9)
    assert "window.__streamvoxEchoOptions = " in ECHO.script()


# through the question (17-18.4 s); the baseline's 3-9 self-interruptions per 30 s leave several in 20 s
LOUDSPEAKER_S = 20.0


class SelfInterrupted(AssertionError):
    """The agent stopped or answered with the caller silent: what the canceller is for."""


@pytest.mark.xfail(
    raises=SelfInterrupted,
    # strict: a session with no self-interruption fails it (the echo did not reach the agent, or the
    # page now cancels it: then this xfail goes)
    strict=True,
    reason="with headphones on, the page does not ask for the agent's echo canceller (with no echo at all,"
    " it can duck a caller who talks over the bot's first second: docs/BENCHMARKS.md, 'Echo')",
)
def test_on_loudspeakers_the_agent_does_not_interrupt_itself(chromium, plan, demo) -> None:
    browser, driver = chromium
    # the first self-interruption is all this control needs: the session ends there (else at LOUDSPEAKER_S)
    s = H.run_session(
        demo.base,
        plan,
        headphones=True,
        browser=browser,
        driver_path=driver,
        echo=ECHO,
        session_s=LOUDSPEAKER_S,
        stop_when=lambda so_far: so_far.self_interruptions()["count"] > 0,
    )
    report = s.self_interruptions()
    (H.OUT / "session-echo.json").write_text(json.dumps({"figures": s.figures(), "page": s.page}, indent=1))
    assert s.page["state"] == "connected", f"the page says: {s.page['error']}"
    # the echo was there: the agent's track fed it, and it was loud in what the page sent
    assert s.echo and s.echo["error"] is None and s.echo["remoteTracks"] >= 1, s.echo
    assert s.echo["echoPeakDb"] > -40, s.echo
    assert report["count"] or report["session_s"] >= LOUDSPEAKER_S - 1, report
    if report["count"]:
        transcript = [(x["who"], x["text"], x["interrupted"]) for x in s.page["transcript"]]
        raise SelfInterrupted(f"{ECHO.describe()}: {report}; transcript {transcript}")


def test_on_loudspeakers_in_the_pages_default_mode_the_agent_cancels_and_hears_a_caller_over_it(
    chromium, plan, demo
) -> None:
    """The page's default (headphones off, no loudspeakers setting: the raw microphone, the agent
    cancels alone, "agent-aec" in /start, STREAMVOX_ECHO_CANCEL=auto) with the same echo path.
    Without a canceller the agent stopped or answered itself ~16 times in 30 s (docs/BENCHMARKS.md,
    "Echo"); with it 0-1 a session at this level: a generous bound. And the caller who talks over
    the greeting is heard, and stops it: the bounds are generous (the figures live in the benchmark:
    the agent silent ~0.28 s after the caller began, median, p95 1.3 s, "Wait, stop." itself heard in
    34 of 42 sessions; with the browser's canceller, the page's default until 12-07, 0.89 s and 2 of 14)."""
    browser, driver = chromium
    s = H.run_session(
        demo.base,
        plan,
        headphones=False,
        loudspeakers=None,
        browser=browser,
        driver_path=driver,
        echo=ECHO,
        session_s=LOUDSPEAKER_S,
    )
    report = s.self_interruptions()
    assert s.page["state"] == "connected", f"the page says: {s.page['error']}"
    assert s.page["echoMode"] == "agent-aec"
    assert s.echo and s.echo["error"] is None and s.echo["echoPeakDb"] > -40, s.echo  # the echo was there
    transcript = [(x["who"], x["text"], x["interrupted"]) for x in s.page["transcript"]]
    assert report["count"] <= 2, f"{ECHO.describe()}: {report}; transcript {transcript}"
    heard = {w for who, text, _ in transcript if who == "you" for w in H.words(text)}
    assert heard & set(H.words(H.BARGE_IN)), f"the caller over the greeting was not heard: {transcript}"
    silence = s.from_file()["barge_in_silence_ms"]  # at the ear: from the caller's onset in the mic file
    assert silence is not None and silence < 2500, (silence, transcript)


# ---------------------------------------------------------------- the page's failure messages


class _NoAgent(SimpleHTTPRequestHandler):
    """The page's files at / and /assets/, and no agent behind them (a demo that has stopped)."""

    def translate_path(self, path: str) -> str:
        path = path.split("?")[0]
        return super().translate_path("/index.html" if path == "/" else path.removeprefix("/assets"))

    def do_POST(self) -> None:
        self.send_error(502, "no agent")

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def page_without_agent():
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_NoAgent, directory=str(WEB_DIR)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def _message_after_connect(driver, url: str) -> str:
    driver.get(url)
    driver.find_element("id", "connect").click()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if driver.execute_script("return window.streamvox.state") == "failed":
            return driver.find_element("id", "message").text
        time.sleep(0.2)
    raise AssertionError("the page did not report the failure")


def test_the_page_says_when_the_agent_is_down(chromium, page_without_agent) -> None:
    browser, driver_path = chromium
    plan = H.MicPlan(H.OUT / "silence.wav", (0, 0), (0, 0))
    H.write_silence(plan.path, 2.0)
    driver = H.open_browser(plan.path, browser=browser, driver=driver_path)
    try:
        text = _message_after_connect(driver, page_without_agent)
    finally:
        driver.quit()
    assert "not answering" in text and "make demo" in text, text


def test_the_page_says_when_the_microphone_is_denied(chromium, page_without_agent) -> None:
    browser, driver_path = chromium
    driver = H.open_browser(None, browser=browser, driver=driver_path, deny_microphone=True)
    try:
        text = _message_after_connect(driver, page_without_agent)
    finally:
        driver.quit()
    assert "Microphone access was denied" in text, text


def test_the_page_says_which_echo_mode_it_is_in(chromium, page_without_agent) -> None:
    from selenium.webdriver.support.ui import Select

    browser, driver_path = chromium
    driver = H.open_browser(None, browser=browser, driver=driver_path)
    try:
        driver.get(f"{page_without_agent}/?headphones=0")
        label = driver.find_element("id", "echo-mode")
        before = (label.text, label.get_attribute("data-mode"))
        driver.find_element("id", "headphones").click()
        after = (label.text, label.get_attribute("data-mode"))
        loudspeakers = driver.find_element("id", "loudspeakers")
        disabled_with_headphones = not loudspeakers.is_enabled()
        driver.find_element("id", "headphones").click()
        Select(loudspeakers).select_by_value("browser")
        browser_aec = (label.text, label.get_attribute("data-mode"))
        driver.get(f"{page_without_agent}/")  # the choice is kept for the next visit
        kept = driver.find_element("id", "echo-mode").get_attribute("data-mode")
        driver.get(f"{page_without_agent}/?loudspeakers=agent")  # and a link can override it
        asked = driver.find_element("id", "echo-mode").get_attribute("data-mode")
        driver.execute_script("localStorage.clear();")
    finally:
        driver.quit()
    # the default on loudspeakers: the raw microphone, the agent cancels (docs/BENCHMARKS.md, "Echo")
    assert before == ("echo: raw microphone, cancelled by the agent", "agent-aec"), before
    assert after == ("echo: raw microphone (headphones: none to cancel)", "raw-mic"), after
    assert disabled_with_headphones
    assert browser_aec == ("echo: cancelled by the browser, and what it lets through by the agent", "browser-aec")
    assert (kept, asked) == ("browser-aec", "agent-aec")
