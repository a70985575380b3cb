"""The demo in a real browser, offline: headless Chromium opens our page, its fake microphone talks.

Real: the whole demo as ``make demo`` starts it (``python -m pipelines.pipecat_agent``: the TTS
server, the local LLM, Whisper, Silero VAD, Pipecat's SmallWebRTC transport), Chromium's WebRTC
and WebAudio, and Whisper again to check what the page heard. Fake: only the microphone, a WAV
spoken by the bundled voice (Chromium's ``--use-file-for-fake-audio-capture``).

The page runs with headphones on (echo cancellation off): a fake microphone has no echo to
cancel, and with it on Chromium suppresses the caller's voice while the agent talks (see
docs/BENCHMARKS.md). The bounds are in ``harness.Bounds``; screenshots and the session's JSON go
to ``out/browser/``.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipelines.pipecat_agent import GREETING
from pipelines.pipecat_room import WEB_DIR
from tests.browser import harness as H

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def chromium() -> tuple[str, str]:
    paths = H.chromium_paths()
    if isinstance(paths, str):
        pytest.skip(paths)
    return paths


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def _unheard_greeting_bigrams(heard_part: str) -> set[str]:
    """Pairs of consecutive greeting words from the part the caller cut off."""
    rest = _words(GREETING)[len(_words(heard_part)) :]
    return {f"{a} {b}" for a, b in itertools.pairwise(rest)}


def test_talk_to_the_demo_in_a_real_browser(chromium) -> None:
    browser, driver = chromium
    plan = H.make_mic_wav(H.OUT / "mic.wav")
    with H.Demo() as demo:
        s = H.run_session(
            demo.base, plan, headphones=True, browser=browser, driver_path=driver, shots=H.OUT, record_audio=True
        )
    (H.OUT / "session.json").write_text(json.dumps({"figures": s.figures(), "page": s.page}, indent=1, default=str))
    page, b = s.page, H.BOUNDS
    assert page["state"] == "connected", f"the page says: {page['error']}"

    # offline and clean: nothing but the agent that served the page, no console error
    assert s.requests, "the browser log recorded no request at all"
    assert s.foreign_requests() == []
    assert s.console_errors == []

    # the greeting is heard, as words and as audio, before the caller talks over it
    greeting = next((seg for seg in page["botSegments"] if s.mic_t(seg["start"]) < plan.barge_in[0]), None)
    assert greeting is not None, f"no agent audio before the barge-in at {plan.barge_in[0]} s: {page['botSegments']}"
    assert s.mic_t(greeting["start"]) < b.greeting_s
    spoken = page["transcript"][0]
    assert spoken["who"] == "agent" and _words(spoken["text"])[:2] == ["hello", "i"], page["transcript"]

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
