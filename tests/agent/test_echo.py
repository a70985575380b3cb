"""The agent's echo canceller on the bundled voice through a synthetic loudspeaker-and-room path.

Real parts: the Piper voice for the bot, WebRTC's AEC3 (``livekit.rtc``), espeak-ng for a caller
who is not the bot (skipped where espeak-ng is missing; ``make test`` installs it). Bounds are
generous; the figures are in docs/BENCHMARKS.md (``scripts/echo_bench.py``).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import numpy as np
import pytest
import soxr

from agent.runtime.echo import DelayEstimator, EchoCanceller, echo_transcript, residue_transcript
from support.echo_path import EchoPath, Room, erle_windows, longest_loud_run, through_canceller, to_int16

SR = 16000


@pytest.fixture(scope="module")
def bot_voice(bot_voices) -> np.ndarray:
    """The bot's greeting at its own rate, without Piper's sampling noise (``bot_voices``, conftest):
    a random render changes what the canceller leaves, and bounds set on some renders failed on others."""
    return bot_voices[1]


def _caller(text: str) -> np.ndarray:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (make test installs it)")
    wav = subprocess.run(["espeak-ng", "-v", "en-gb+m3", "-s", "160", "--stdout", text], capture_output=True).stdout
    audio = np.frombuffer(wav[44:], np.int16).astype(np.float32) / 32768.0
    return soxr.resample(audio, 22050, SR).astype(np.float32)


def _scene(far: np.ndarray, *, delay_ms: float, gain_db: float, drift: float = 0.0, tail_s: float = 1.0):
    path = EchoPath(
        sample_rate=SR, delay_ms=delay_ms, gain_db=gain_db, room=Room(rt60_s=0.3, seed=3), drift_ms_per_s=drift
    )
    path.push(far, at_sample=0)
    n = (len(far) + int(tail_s * SR)) // 320 * 320
    echo = path.pull(n)
    noise = np.random.default_rng(0).standard_normal(n).astype(np.float32) * 1e-3
    return echo, noise


# 200 ms: within AEC3's own reach; 600 ms: beyond it, our estimate shifts the reference
@pytest.mark.parametrize(("delay_ms", "gain_db", "drift"), [(200, -6, 3.0), (600, 0, 0.0)])
def test_echo_is_removed_after_convergence(bot_voice, delay_ms, gain_db, drift) -> None:
    """The echo is found at its delay (within AEC3's reach or beyond it) and removed well below audibility."""
    echo, noise = _scene(bot_voice, delay_ms=delay_ms, gain_db=gain_db, drift=drift)
    canceller = EchoCanceller()
    out = through_canceller(canceller, to_int16(echo + noise), to_int16(bot_voice), rate=SR).astype(np.float32) / 32768
    windows = erle_windows((echo + noise)[: len(out)], out, echo[: len(out)], rate=SR)
    after = [e for t, e in windows if t >= 1.0]
    assert len(after) > 20
    assert np.median(after) >= 20.0, (canceller.stats, windows)  # generous: the figure is in BENCHMARKS (~30-40 dB)
    assert canceller.stats.delay_ms is not None
    seconds = len(out) / SR  # the delay drifts: compare with where it ended
    assert abs(canceller.stats.delay_ms - (delay_ms + drift * seconds)) < 40.0, canceller.stats.delay_history
    # without the canceller the same windows are the echo itself: the test can fail
    raw = erle_windows((echo + noise)[: len(out)], (echo + noise)[: len(out)], echo[: len(out)], rate=SR)
    assert max(e for _t, e in raw) < 1.0


def test_the_caller_over_the_bot_is_kept(bot_voices) -> None:
    """Double talk: the caller's speech passes, about as much of it as AEC3 itself lets through.

    AEC3's own suppressor ducks some of a caller who talks over the bot at the echo's level; the
    residue gate adds to that, by render (the four fixed ones: +1 / +8 / +2 / +1 points of the
    caller's loud frames; +1 / +54 / +10 / +3 before the caller's frames, which the bot's audio does
    not predict, were kept out of what AEC3 is measured to remove: BENCHMARKS "Echo") but must not
    mute the caller.
    """
    caller = _caller("Wait, can you tell me the capital of Italy?")
    added, kept_db = [], []
    for bot_voice in bot_voices:
        echo, noise = _scene(bot_voice, delay_ms=200, gain_db=-6)
        voice = np.zeros_like(echo)
        k = int(3.0 * SR)
        voice[k : k + len(caller)] = caller[: len(voice) - k]
        talk = _loud_frames(voice, k, caller)

        mic, far = to_int16(echo + voice + noise), to_int16(bot_voice)
        alone, _ = _lost(False, mic, far, voice, talk, slice(k, k + len(caller)))
        gated, power = _lost(True, mic, far, voice, talk, slice(k, k + len(caller)))
        added.append(round(gated - alone, 2))
        kept_db.append(round(float(10 * np.log10(power / np.mean(caller**2))), 1))
    print(
        f"\n[caller kept] loud caller frames the gate ducks beyond AEC3, per render: {added}; energy kept {kept_db} dB"
    )
    assert np.mean(added) <= 0.1, added  # measured: 0.03 on average (0.15 before CALLER_CORR)
    assert max(added) <= 0.3, added  # measured: 0.08 at most (0.54 on one render before)
    assert min(kept_db) > -10.0, kept_db  # most of the caller's energy is there on every render


def _loud_frames(voice: np.ndarray, k: int, said: np.ndarray) -> list[int]:
    """Where in ``voice`` (``said`` placed at ``k``) the caller's 10 ms frames are louder than their mean."""
    level = np.mean(said**2)
    return [i for i in range(k, k + len(said) - 160, 160) if np.mean(voice[i : i + 160] ** 2) > level]


def _lost(gate: bool, mic, far, voice: np.ndarray, talk: list[int], said: slice) -> tuple[float, float]:
    """Through a canceller (with or without the residue gate): the share of the caller's loud 10 ms
    frames ducked by 20 dB or more, and the power left where the caller spoke."""
    out = through_canceller(EchoCanceller(gate_residue=gate), mic, far, rate=SR).astype(np.float32) / 32768
    ducked = [i for i in talk if np.mean(out[i : i + 160] ** 2) < 0.01 * np.mean(voice[i : i + 160] ** 2)]
    return len(ducked) / len(talk), float(np.mean(out[said] ** 2))


def test_delay_estimator_finds_a_known_lag() -> None:
    rng = np.random.default_rng(1)
    est = DelayEstimator(max_delay_ms=500, window_s=1.0)
    ref = rng.standard_normal(est.max_lag + est.window).astype(np.float32)
    lag = int(0.3 * SR)
    near = 0.5 * ref[est.max_lag - lag : est.max_lag - lag + est.window]
    delay, confidence = est.estimate(near + 0.05 * rng.standard_normal(est.window), ref)
    assert delay == lag and confidence > 8.0


def test_truncated_reference_is_not_expected_as_echo() -> None:
    """After a barge-in drops the bot's queued audio, the canceller's reference is silent from then on."""
    clock = {"t": 10.0}
    canceller = EchoCanceller(clock=lambda: clock["t"])
    tone = (0.3 * np.sin(np.arange(SR) * 2 * np.pi * 440 / SR) * 32767).astype(np.int16)
    canceller.far(tone.tobytes(), SR, t=10.0)  # one second queued to play from t=10
    canceller.truncate_far(t=10.25)
    ring = canceller._ref
    at = round(10.0 * SR)
    assert np.abs(ring.read(at, at + SR // 4)).max() > 0.2
    assert not ring.read(at + SR // 4, at + SR).any()


def test_an_echo_still_on_its_way_is_not_measured_as_no_echo(bot_voices) -> None:
    """A phone call's first echo came back 0.7 s after the bot's first audio (the speakerphone test,
    once in ~8 calls): the quiet microphone before it had been taken as "no echo here" (an ERL of
    -70 dB), so the gate passed the echo when it came, AEC3 not cancelling yet, and the agent
    stopped its greeting for it. The microphone's level says nothing of the echo until the bot's
    audio has been arriving for the whole delay range, or the delay is located."""
    longest = []
    for bot_voice in bot_voices:  # the four fixed renders: the longest run differs with the render
        echo, noise = _scene(bot_voice, delay_ms=700, gain_db=0)
        mic, far = to_int16(echo + noise), to_int16(bot_voice)
        early = EchoCanceller()
        through_canceller(early, mic[: int(0.65 * SR)], far, rate=SR)  # up to just before the echo arrives
        assert early.stats.far_frames > 50  # the bot was playing all along
        assert early.stats.erl_db is None, early.stats  # and nothing was concluded from the silence
        # the whole greeting: what the gate lets through while the echo is there is a few frames, not
        # the run of echo a VAD takes for a caller (measured: the loud frames were 26 before and after)
        full = EchoCanceller()
        out = through_canceller(full, mic, far, rate=SR).astype(np.float32) / 32768
        longest.append(longest_loud_run(out))
    print(f"\n[echo on its way] longest run of loud 10 ms frames per render: {longest}")
    # no 150 ms of echo in a row (Pipecat's VAD wants 200 ms; random renders: up to 13-17 frames,
    # 26 before the fix)
    assert max(longest) <= 15, longest


def _echo_of(x: np.ndarray, delay_ms: float, n: int, gain_db: float) -> np.ndarray:
    """The first ``n`` samples of ``x``'s echo through a small room, ``delay_ms`` late."""
    path = EchoPath(sample_rate=SR, delay_ms=delay_ms, gain_db=gain_db, room=Room(rt60_s=0.3, seed=3))
    path.push(x, at_sample=0)
    return path.pull(n)


@pytest.mark.parametrize("gain_db", [-6, 0])
def test_a_reply_after_a_silence_whose_echo_moved_leaves_no_run_of_residue(bot_voices, gain_db, monkeypatch) -> None:
    """Between two replies the echo's path moves (a browser's jitter buffer starts each talk spurt
    afresh; the page's traces: the reply after a question cut ~1 s in by its own residue, AEC3
    removing 2-5 dB of it). Here the second reply's echo comes 60 ms sooner, after 2 s of silence:
    AEC3 follows within a second or two, and until then what it leaves must not pass the gate as
    a run a VAD takes for a caller. The canceller measures what AEC3 removes afresh at each talk
    spurt (``REPLY_GAP``); the control, without that, passes a run of ~20 frames."""
    import agent.runtime.echo as echo_module

    first, second = bot_voices[1], bot_voices[3]
    gap = 2 * SR

    n2 = (len(second) + SR) // 320 * 320
    mic = np.concatenate([_echo_of(first, 200, len(first) + gap, gain_db), _echo_of(second, 140, n2, gain_db)])
    mic += np.random.default_rng(0).standard_normal(len(mic)).astype(np.float32) * 1e-3
    far = np.concatenate([first, np.zeros(gap, np.float32), second])
    start = len(first) + gap

    def longest_in_the_second_reply() -> int:
        out = through_canceller(EchoCanceller(), to_int16(mic), to_int16(far), rate=SR).astype(np.float32) / 32768
        return longest_loud_run(out[start : start + 2 * SR])

    measured = longest_in_the_second_reply()
    monkeypatch.setattr(echo_module, "REPLY_GAP", 10**12)  # never a new talk spurt: the ERLE of the first reply holds
    control = longest_in_the_second_reply()
    print(f"\n[moved echo, {gain_db} dB] longest loud run in the second reply: {measured} (control {control})")
    assert control >= 10, control  # the premise: the moved echo's residue passes as a run without it
    assert measured <= 5, (measured, control)  # generous: 2-3 frames offline, 20-21 in the control


@pytest.mark.parametrize(
    ("transcript", "played", "echo"),
    [
        ("Hello and welcome.", "Hello, and welcome! I can help you plan a trip.", True),
        ("I'm here for", "I'm here for you. What can I do?", True),
        ("Welcome to my website!", "Hello, and welcome! I can help you.", False),
        ("Paris.", "Would you like to go to Paris?", False),  # one word of the caller's own
        ("No, I want the bus to Paris", "Would you like to go to Paris by train?", False),
        ("Hello and welcome.", "", False),
        ("the cap.", "The capital of France is Paris.", True),  # the segment cut mid-word
        ("the car.", "The capital of France is Paris.", False),
        ("a ca", "Take a cab to the station.", False),  # a fragment under three letters matches nothing
    ],
)
def test_echo_transcript(transcript: str, played: str, echo: bool) -> None:
    assert echo_transcript(transcript, played) is echo


@pytest.mark.parametrize(
    ("transcript", "played", "margin_db", "echo"),
    [
        ("for your love.", "I'm sorry for your loss.", 12.0, True),  # both heard at the page, 0 dB
        ("I'm so prepared.", "I'm sorry", 9.0, True),
        ("for your love.", "I'm sorry for your loss.", 30.0, False),  # the audio stood clear: a caller
        ("for your love.", "I'm sorry for your loss.", None, False),  # nothing audible handed on
        ("Wait, stop.", "I'm sorry for your loss.", 5.0, False),  # not the bot's words
        ("I would rather take the train.", "Would you like the train or the bus?", 10.0, False),  # 3 of 6
        ("Paris.", "Would you like to go to Paris?", 5.0, False),  # one word is never judged
        ("the train", "Would you like the train or the bus?", 10.0, True),  # what residue alone cannot tell
        ("Thank you.", "I'm sorry for your loss.", 12.0, True),  # Whisper's stock phrase for a sound
        ("Thank you.", "I'm sorry for your loss.", 30.0, False),  # a caller's thanks, clear of the echo
    ],
)
def test_residue_transcript(transcript: str, played: str, margin_db: float | None, echo: bool) -> None:
    assert residue_transcript(transcript, played, margin_db) is echo
    assert not echo_transcript(transcript, played) or transcript == "the train"  # the strict rule misses them


def test_garbled_words_of_the_residue_are_dropped_a_callers_are_not(bot_voices) -> None:
    """``PipecatEcho.is_echo`` under the bot: words the bot's echo alone left at 0 dB (AEC3's residue
    through the real canceller) that mostly repeat the bot are dropped, and never where the STT says
    no bot audio overlapped the segment; the same words from audio that stood clear of the residue (a
    caller saying "for your love." over the bot) are kept."""
    from agent.pipecat_echo import PipecatEcho

    dropped = kept = 0
    for bot_voice in bot_voices:
        echo, noise = _scene(bot_voice, delay_ms=200, gain_db=0, tail_s=0.0)
        end = int(4.0 * SR) // 320 * 320
        residue = PipecatEcho()
        through_canceller(residue.canceller, to_int16(echo[:end] + noise[:end]), to_int16(bot_voice), rate=SR)
        residue.spoken("I'm sorry for your loss.")
        dropped += residue.is_echo("for your love.", bot_audio=True)
        assert not residue.is_echo("for your love.", bot_audio=False)
        said = _caller("for your love.")
        k = end - len(said) - int(0.05 * SR)
        voice = np.zeros(end, np.float32)
        voice[k : k + len(said)] = said
        caller = PipecatEcho()
        through_canceller(caller.canceller, to_int16(echo[:end] + voice + noise[:end]), to_int16(bot_voice), rate=SR)
        caller.spoken("I'm sorry for your loss.")
        kept += not caller.is_echo("for your love.", bot_audio=True)
    print(f"\n[residue words] dropped {dropped} of {len(bot_voices)} from the echo alone; kept {kept} from a caller")
    assert dropped >= len(bot_voices) - 1, dropped
    assert kept >= len(bot_voices) // 2, kept  # AEC3 ducks some callers under loud echo (the margin test above)


def test_a_caller_who_repeats_the_bots_words_after_it_is_not_its_echo() -> None:
    """Answering "Where would you like to go today?" with "I would like to go." repeats the bot's words:
    the words alone call it echo; a segment the STT says the bot's audio did not overlap never is."""
    from agent.pipecat_echo import PipecatEcho

    echo = PipecatEcho()
    echo.spoken("Where would you like to go today?")
    assert echo.is_echo("I would like to go.")  # the words alone (an STT that does not say)
    assert not echo.is_echo("I would like to go.", bot_audio=False)
    assert echo.is_echo("I would like to go.", bot_audio=True)


def test_a_callers_word_over_the_bot_stands_clear_of_the_residue(bot_voices) -> None:
    """``caller_margin_db``: a caller's short word over the bot's echo is surely the caller (the
    YieldGate then keeps its pause through their breath), what is left of the echo alone is not.
    AEC3 ducks some words under loud echo, so the check may miss a caller (the gate then resumes at
    once, as it did before the breath existed); residue taken for the caller costs a silent caller a
    pause of the bot (``lull_ms``), and is rare: the bot's four fixed renders, two words, two places."""
    from agent.runtime.echo import SURE_DB

    sure, residue = [], []
    for bot_voice in bot_voices:
        echo, noise = _scene(bot_voice, delay_ms=200, gain_db=-6, tail_s=0.0)
        for word in ("Wait,", "Stop."):
            said = _caller(word)
            for at_s in (3.0, 4.5):
                k = int(at_s * SR)
                end = (k + len(said) - int(0.05 * SR)) // 320 * 320  # asked as the VAD drops the word's run
                voice = np.zeros(end, np.float32)
                voice[k:end] = said[: end - k]
                with_caller, echo_only = EchoCanceller(), EchoCanceller()
                through_canceller(with_caller, to_int16(echo[:end] + voice + noise[:end]), to_int16(bot_voice), rate=SR)
                through_canceller(echo_only, to_int16(echo[:end] + noise[:end]), to_int16(bot_voice), rate=SR)
                sure.append(_rounded(with_caller.caller_margin_db(0.25)))
                residue.append(_rounded(echo_only.caller_margin_db(0.25)))
    print(f"\n[caller margin] a word over the bot: {sure} dB; the echo alone: {residue} dB (sure from {SURE_DB})")
    assert sum(m is not None and m >= SURE_DB for m in residue) <= 1, residue
    assert sum(m is not None and m >= SURE_DB for m in sure) >= len(sure) // 2, sure


def _rounded(margin: float | None) -> float | None:
    return None if margin is None else round(margin, 1)


def test_the_reference_ring_holds_what_was_written_and_silence_elsewhere() -> None:
    """The canceller's reference on the sample clock (read with slices, as the canceller reads seconds
    of it per 10 ms frame) against a plain record of every sample: writes that go on, leave a gap or
    overlap the last one, truncations (a barge-in drops the audio still queued), reads anywhere."""
    from agent.runtime.echo import _Ring

    rng = np.random.default_rng(7)
    for _ in range(200):
        size = int(rng.integers(8, 200))
        ring, held, end, high = _Ring(size), {}, 0, 0  # held: absolute sample -> value; high: the furthest end
        for _ in range(40):
            if rng.random() < 0.7:  # as the canceller writes: on from the end, a little back, or after a gap
                start = max(0, end + int(rng.integers(-size // 4, 40)))
                x = rng.standard_normal(int(rng.integers(0, 2 * size + 5))).astype(np.float32)
                ring.write(start, x)
                held.update({start + i: v for i, v in enumerate(x)})
                end = max(end, start + len(x))
            else:  # the audio after ``at`` never played (not further back than the queue)
                at = int(rng.integers(max(0, end - size // 4), end + 5))
                ring.truncate(at)
                held = {k: v for k, v in held.items() if k < at}
                end = min(end, at)
            high = max(high, end)
            a = int(rng.integers(max(0, end - 3 * size), end + 10))
            b = a + int(rng.integers(0, 3 * size))
            # held: the last ``size`` samples up to the furthest end reached (older ones were overwritten)
            want = [held.get(k, 0.0) if high - size <= k < end else 0.0 for k in range(a, b)]
            assert np.array_equal(ring.read(a, b), np.asarray(want, np.float32))


async def test_the_pipecat_canceller_on_its_own_thread_cleans_as_it_does_inline() -> None:
    """``PipecatEcho`` runs the canceller on a thread of the call's own (the event loop every call
    shares keeps moving while AEC3 works); the far end, its truncation and the caller's frames reach
    it in the pipeline's order, so the cleaned audio is the same as inline, frame for frame."""
    import threading

    from pipecat.frames.frames import InputAudioRawFrame, OutputAudioRawFrame

    from agent.pipecat_echo import PipecatEcho

    rng = np.random.default_rng(3)
    bot = (rng.standard_normal(24000 * 4) * 4000).astype(np.int16)  # 4 s of the bot at 24 kHz
    now = [0.0]
    echoes = [PipecatEcho(clock=lambda: now[0], thread=t) for t in (True, False)]
    outs: list[list[bytes]] = [[], []]
    for i in range(200):  # 20 ms steps: the bot's frame out, the caller's frame (its echo, 8 kHz) in
        now[0] = i * 0.02
        far = bot[i * 480 : (i + 1) * 480] if i < 150 else np.zeros(480, np.int16)
        near = (soxr.resample(far.astype(np.float32), 24000, 8000) * 0.3).astype(np.int16)
        near = (near + rng.standard_normal(160) * 50).astype(np.int16).tobytes()
        for echo, out in zip(echoes, outs, strict=True):
            if i == 120:
                echo.interrupted()  # a barge-in: the queued audio is dropped
            echo.played(OutputAudioRawFrame(audio=far.tobytes(), sample_rate=24000, num_channels=1))
            frame = InputAudioRawFrame(audio=near, sample_rate=8000, num_channels=1)
            await echo.clean(frame)
            out.append(frame.audio)
            assert frame.sample_rate == 16000 and frame.num_frames == len(frame.audio) // 2
    assert outs[0] == outs[1]
    assert echoes[0].canceller.stats.frames == echoes[1].canceller.stats.frames > 380  # the resampler holds a few
    threads = {t.name for t in threading.enumerate() if t.name.startswith("echo")}
    assert threads, "the canceller ran inline"
    echoes[0].close()
    echoes[0].close()  # once more: a no-op (each of the three taps closes it)
    await asyncio.sleep(0.2)
    assert not {t.name for t in threading.enumerate() if t.name.startswith("echo")} & threads


@pytest.mark.parametrize("gain_db", [-6, 0])
def test_the_bots_last_words_come_back_later_than_located_and_are_not_a_caller(
    bot_voices, gain_db, monkeypatch
) -> None:
    """The page's echo path jumps by hundreds of ms (its jitter buffer): in a trace, a reply's last
    word came back 0.4 s later than the located delay, after the reference there had gone quiet, and
    passed the gate ("no bot audio arriving") as a caller: the bot answered "Paris.". Here a long reply
    locates the echo at ~250 ms, then a short phrase's echo comes 400 ms later than that. The frames
    that correlate with the bot's audio at a later lag are muted; a caller answering just after the
    phrase does not correlate and is kept. The control (the check off) passes a run a VAD takes."""
    import agent.runtime.echo as echo_module

    first, phrase = bot_voices[1], bot_voices[2][int(0.3 * SR) : int(1.1 * SR)]
    n1, tail = len(first), 2 * SR
    far = np.concatenate([first, phrase, np.zeros(tail, np.float32)])
    echo = np.zeros(len(far), np.float32)
    echo[: n1 + SR // 4] += _echo_of(first, 250, n1 + SR // 4, gain_db)
    echo[n1:] += _echo_of(phrase, 650, len(far) - n1, gain_db)
    noise = np.random.default_rng(0).standard_normal(len(far)).astype(np.float32) * 1e-3
    caller = _caller("Sorry, I need a train to Boston.")
    voice = np.zeros_like(echo)
    k = n1 + len(phrase) + int(0.4 * SR)  # 0.4 s after the phrase ended at the located delay
    voice[k : k + len(caller)] = caller[: len(voice) - k]

    def run(mic: np.ndarray) -> tuple[np.ndarray, EchoCanceller]:
        canceller = EchoCanceller()
        out = through_canceller(canceller, to_int16(mic), to_int16(far), rate=SR).astype(np.float32) / 32768
        return out, canceller

    out, canceller = run(echo + noise)
    late = longest_loud_run(out[n1:])
    talk = _loud_frames(voice, k, caller)
    ducked, _ = _lost(True, to_int16(echo + voice + noise), to_int16(far), voice, talk, slice(k, k + len(caller)))
    monkeypatch.setattr(echo_module, "LATE_CORR", 2.0)  # a correlation never reaches it: the check off
    control = longest_loud_run(run(echo + noise)[0][n1:])
    print(
        f"\n[late echo, {gain_db} dB] longest loud run after the reply: {late} (control {control}); "
        f"late frames muted {canceller.stats.late_frames}; caller frames ducked {ducked:.0%} of {len(talk)}"
    )
    assert abs(canceller.stats.delay_history[0][1] - 250) < 60  # the echo was located at the old delay first
    assert control >= 30, control  # the premise: half a second of echo passes without the check
    assert late <= 20, (late, control)  # measured: 17
    assert canceller.stats.late_frames > 0
    assert ducked <= 0.1, (ducked, len(talk))  # the caller answering is kept


@pytest.mark.parametrize("onset_s", [2.0, 3.5])
def test_a_caller_over_a_quiet_echo_does_not_move_its_delay(bot_voice, onset_s) -> None:
    """A caller well above a quiet echo (-12 dB) talks over the bot: their speech puts a false peak
    into the delay search (offline, 710-770 ms against the true ~300), and adopting it cost the
    caller a second of being heard. Frames whose mic stands clear of the loudest echo count as the
    caller's for the estimator's guard, with the double-talk pass off as well. The control (a margin
    nothing clears: the guard then never fires, as before) adopts the false delay."""
    echo, noise = _scene(bot_voice, delay_ms=300, gain_db=-12, drift=1.0)
    caller = _caller("Wait, stop. Can you tell me the capital of Italy?")
    voice = np.zeros_like(echo)
    k = int(onset_s * SR)
    voice[k : k + len(caller)] = caller[: len(voice) - k]
    mic, far = to_int16(echo + voice + noise), to_int16(bot_voice)

    def delays(**kw) -> list[float]:
        canceller = EchoCanceller(**kw)
        through_canceller(canceller, mic, far, rate=SR)
        return [round(d) for _t, d, _c in canceller.stats.delay_history]

    measured, control = delays(), delays(double_talk_margin_db=float("inf"))
    print(f"\n[caller over a quiet echo, {onset_s} s] delays adopted {measured} (control {control})")
    assert any(abs(d - 300) > 150 for d in control), control  # the premise: the caller moves it without the guard
    assert measured and all(abs(d - 300) < 60 for d in measured), measured


@pytest.mark.parametrize("gain_db", [-6, 0])
def test_an_echo_path_that_moves_while_the_bot_speaks_leaves_no_run_of_residue(bot_voice, gain_db, monkeypatch) -> None:
    """The page's echo path can move *while the bot speaks* (a trace: ~33 ms, AEC3 then removing
    0-3 dB for ~250 ms while the gate still expected its converged 29 dB, and the bot stopped for its
    own residue). Here the path shortens by 30 ms 5.5 s into the greeting. The frames AEC3 removes
    little from are judged by how well the bot's audio around the located delay predicts them:
    echo AEC3 lost is muted (``ECHO_CORR``). The control (the check off) passes a run a VAD takes
    for a caller."""
    import agent.runtime.echo as echo_module

    n = (len(bot_voice) + SR) // 320 * 320
    before, after = _echo_of(bot_voice, 250, n, gain_db), _echo_of(bot_voice, 220, n, gain_db)
    k = int(5.5 * SR)
    moved = np.clip((np.arange(n) - k) / 160, 0.0, 1.0).astype(np.float32)  # a 10 ms crossfade
    mic = before * (1 - moved) + after * moved + np.random.default_rng(0).standard_normal(n).astype(np.float32) * 1e-3

    def longest_after_the_move() -> tuple[int, EchoCanceller]:
        canceller = EchoCanceller()
        out = through_canceller(canceller, to_int16(mic), to_int16(bot_voice), rate=SR).astype(np.float32) / 32768
        return longest_loud_run(out[k:]), canceller

    measured, canceller = longest_after_the_move()
    monkeypatch.setattr(echo_module, "ECHO_CORR", 2.0)  # a correlation never reaches it: the check off
    control, _ = longest_after_the_move()
    print(
        f"\n[path moved mid-speech, {gain_db} dB] longest loud run after the move: {measured} (control {control}); "
        f"lost echo muted {canceller.stats.lost_frames}"
    )
    assert control >= 20, control  # the premise: without the check the residue passes as a run (27)
    assert measured <= 15, (measured, control)  # generous: 10 offline
    assert canceller.stats.lost_frames > 0


def _answer_after(bot_voice: np.ndarray, gap_s: float) -> tuple[np.ndarray, slice]:
    """A microphone with no echo at all: the line's noise, and a caller answering ``gap_s`` after the
    bot's audio ends (``through_canceller`` plays both from the same first sample); where they speak."""
    caller = _caller("Sorry, I need a train to Boston.")
    k = len(bot_voice) + int(gap_s * SR)
    n = (k + len(caller) + SR) // 320 * 320
    mic = np.random.default_rng(0).standard_normal(n).astype(np.float32) * 1e-3
    mic[k : k + len(caller)] += caller
    return mic, slice(k, k + len(caller))


def test_with_no_echo_a_caller_right_after_the_bot_costs_no_correlation(bot_voice, monkeypatch) -> None:
    """Headphones: no echo is ever located, and after ``ABSENT_FRAMES`` of the bot the caller's audio
    passes as it came. A caller who answers 0.4 s after the bot stops is still within the search
    range of its audio, but the correlation check (0.5 ms a frame over the whole range) has nothing
    to tell apart there and must not run; the caller passes untouched either way. (At 0.2 s this
    caller put up a false first delay: the next test.)"""
    mic, said = _answer_after(bot_voice, 0.4)
    calls = []
    original = EchoCanceller._bot_corr
    monkeypatch.setattr(EchoCanceller, "_bot_corr", lambda self, *a: calls.append(a) or original(self, *a))
    canceller = EchoCanceller()
    out = through_canceller(canceller, to_int16(mic), to_int16(bot_voice), rate=SR).astype(np.float32) / 32768
    kept_db = 10 * np.log10(np.mean(out[said] ** 2) / np.mean(mic[said] ** 2))
    assert canceller.stats.delay_ms is None  # the premise: no echo located
    assert kept_db > -1.0, kept_db  # the caller passes as it came
    # on the sample clock (through_canceller's first sample plays at 1.0 s): after the bot's audio
    # ended, where only the caller is; the call's first frames (the line's noise floor not yet
    # measured, no verdict on the echo yet) may run it
    after_the_bot = [a for a in calls if a[0] >= SR + len(bot_voice)]
    assert after_the_bot == [], len(after_the_bot)


def test_a_caller_answering_just_after_the_bot_with_no_echo_locates_no_delay(bot_voice, monkeypatch) -> None:
    """No echo at all (a handset, headphones), and a caller who answers 0.2 s after the bot stops:
    two GCC-PHAT windows holding the caller's first words against the bot's last put up a sure peak
    at ~700 ms, and the canceller then left its "no echo" state (AEC3 ducks a caller over the bot's
    next reply). A first delay is adopted only where the microphone's loudness follows the bot's at
    that lag (``FIRST_ENVELOPE_R``; an echo's does, r 0.5-0.99 offline, under a caller too). The
    control, the check off, adopts the false delay."""
    import agent.runtime.echo as echo_module

    mic, _said = _answer_after(bot_voice, 0.2)

    def run() -> EchoCanceller:
        canceller = EchoCanceller()
        through_canceller(canceller, to_int16(mic), to_int16(bot_voice), rate=SR)
        return canceller

    measured = run()
    monkeypatch.setattr(echo_module, "FIRST_ENVELOPE_R", -2.0)  # any first peak adopted, as before
    control = run()
    print(f"\n[no echo, a quick answer] delay {measured.stats.delay_ms} (control {control.stats.delay_ms} ms)")
    assert control.stats.delay_ms is not None, "the premise: the false peak is adopted without the check"
    assert measured.stats.delay_ms is None, measured.stats.delay_history
    assert measured.stats.false_firsts >= 1
