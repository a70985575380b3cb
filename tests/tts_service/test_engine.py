"""The Piper engine with the real bundled voice: exact windowed decoding, word timings, odd text."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from support.tts_helpers import rms
from tts_service.core.engine import Engine
from tts_service.piper.engine import HOP, MIN_SPAN, PiperEngine, Prepared, Window
from tts_service.piper.receptive import graph_reach, measure_reach
from tts_service.piper.voices import BACK_OUTPUT, DEC_IN, SPLIT_TAG

SENTENCES = [
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Hello.",
    "Would you like to book a table for two people this evening?",
    "She sells sea shells by the sea shore, and the shells she sells are surely sea shells!",
    "Okay, let me check that for you; it will only take a moment.",
]
TOLERANCE = 1e-6  # of full scale: windows of the decoder alone are exact (bit for bit here)


def schedule(frames: int, sizes: tuple[int, ...] = (6, 12, 24, 48, 64)) -> list[tuple[int, int]]:
    """The growing window plan the scheduler uses: 6, 12, 24, 48, 64, 64, ..."""
    spans, start = [], 0
    for size in itertools.chain(sizes, itertools.repeat(sizes[-1])):
        if start >= frames:
            return spans
        spans.append((start, min(frames, start + size)))
        start += size
    raise AssertionError  # pragma: no cover


@pytest.fixture(scope="module")
def prepared(engine: PiperEngine) -> list[Prepared]:
    out = [engine.prepare(s) for s in SENTENCES]
    assert all(p is not None for p in out)
    return out  # type: ignore[return-value]


@pytest.fixture(scope="module")
def whole(engine: PiperEngine, prepared: list[Prepared]) -> list[np.ndarray]:
    return [engine.decode_whole(p) for p in prepared]


def test_windowed_decode_equals_whole(engine: PiperEngine, prepared: list[Prepared], whole: list[np.ndarray]) -> None:
    for p, ref in zip(prepared, whole):
        assert len(ref) == p.frames * HOP
        chunks = [engine.decode([Window(p, s, e)])[0] for s, e in schedule(p.frames)]
        assert [len(c) for c in chunks] == [(e - s) * HOP for s, e in schedule(p.frames)]
        streamed = np.concatenate(chunks)
        assert streamed.shape == ref.shape
        assert np.max(np.abs(streamed - ref)) <= TOLERANCE, p.text


def test_batched_windows_of_several_streams_equal_whole(
    engine: PiperEngine, prepared: list[Prepared], whole: list[np.ndarray]
) -> None:
    """Each call decodes the next window of every stream at once, like one scheduler tick."""
    plans = [schedule(p.frames) for p in prepared]
    outputs: list[list[np.ndarray]] = [[] for _ in prepared]
    for step in range(max(len(plan) for plan in plans)):
        live = [i for i, plan in enumerate(plans) if step < len(plan)]
        windows = [Window(prepared[i], *plans[i][step]) for i in live]
        for i, audio in zip(live, engine.decode(windows)):
            outputs[i].append(audio)
    for i, ref in enumerate(whole):
        assert np.max(np.abs(np.concatenate(outputs[i]) - ref)) <= TOLERANCE, prepared[i].text
    # the same window of the same stream twice in one call (equal shapes: stacked in one run)
    p = prepared[0]
    a, b = engine.decode([Window(p, 64, 128), Window(p, 64, 128)])
    np.testing.assert_array_equal(a, b)


def test_the_engine_fits_the_core_protocol(engine: PiperEngine) -> None:
    """The runtime and the server read an engine only through ``core.engine.Engine``; ``/v1/voices``
    lists ``describe_voices``: every loaded voice, its rate and the model file it came from."""
    assert isinstance(engine, Engine)
    infos = engine.describe_voices()
    assert [v.name for v in infos] == list(engine.voices)
    assert all(v.sample_rate == engine.sample_rate and v.model.endswith(".onnx") for v in infos)


def test_decoder_context_is_read_from_the_graph_and_confirmed(engine: PiperEngine) -> None:
    """The joe voice ("medium": upsampling 8, 8, 4) needs 11 frames each side; the graph reading
    and a perturbation of the running session agree, and the engine uses that, not a constant."""
    import onnx

    v = engine.voices[engine.default_voice]
    computed, rate = graph_reach(onnx.load(str(v.files.back_path)).graph, DEC_IN, BACK_OUTPUT)
    measured = measure_reach(lambda x: v.back.run(None, {DEC_IN: x})[0], 192, HOP)
    assert rate == HOP
    assert (computed.left, computed.right) == (measured.left, measured.right) == (11, 11)
    assert v.reach == computed and engine.context == 11
    assert engine.free_frames() == MIN_SPAN - 11
    # the split cache is keyed on the split point too: a cache of another split is never reused
    assert v.files.back_path.parent.name.endswith(f"-{SPLIT_TAG}")


def test_windows_of_the_scheduler_plan_and_odd_cuts_are_exact(engine: PiperEngine) -> None:
    """Any cut of a segment (1-frame windows, cuts near both ends) reproduces the whole decode."""
    p = engine.prepare("Thanks for calling today. Is there anything else I can help you with?")
    assert p is not None
    ref = engine.decode_whole(p)
    cuts = [0, 1, 2, 13, 40, 41, 100, p.frames - 12, p.frames - 1, p.frames]
    chunks = [engine.decode([Window(p, a, b)])[0] for a, b in itertools.pairwise(cuts)]
    assert np.max(np.abs(np.concatenate(chunks) - ref)) <= TOLERANCE


def test_urgent_front_part_speaks_the_same(engine: PiperEngine) -> None:
    """The all-threads session of the front part (start-ups) gives a segment of the same shape;
    durations are sampled (noise_w), so lengths agree only roughly."""
    a = engine.prepare("Would you like a table for two?")
    b = engine.prepare("Would you like a table for two?", urgent=True)
    assert a is not None and b is not None
    assert a.z.shape[1] == b.z.shape[1] and abs(a.frames - b.frames) <= 0.2 * a.frames
    assert [w for w, _, _ in a.words] == [w for w, _, _ in b.words]
    assert rms(engine.decode_whole(b)) > 0.02


def test_equal_spans_batch_many_streams_in_one_call_exactly(
    engine: PiperEngine, prepared: list[Prepared], whole: list[np.ndarray]
) -> None:
    """Where batching pays (CUDA) the spans of a batch are widened to one length with real
    frames, so windows of many streams run as one call; still exact. A segment too short for
    the common span keeps its own call."""
    v = engine.voices[engine.default_voice]
    real = v.back
    calls: list[tuple[int, ...]] = []

    class Counting:
        def run(self, names, feed, run_options=None):
            calls.append(feed[DEC_IN].shape)
            return real.run(names, feed, run_options)

    # windows of 30, 48 and 96 frames: natural spans of 65 (widened), 70 and 118
    windows = [
        Window(p, s, min(p.frames, s + n)) for p in prepared for s, n in ((0, 30), (30, 48), (78, 96)) if s < p.frames
    ]
    counts = {}
    v.back = Counting()
    try:
        for equal in (False, True):
            engine.equal_spans, calls[:] = equal, []
            audio = engine.decode(windows)
            counts[equal] = len(calls)
            for w, a in zip(windows, audio):
                ref = whole[[id(p) for p in prepared].index(id(w.prepared))]
                assert np.max(np.abs(a - ref[w.start * HOP : w.end * HOP])) <= TOLERANCE
    finally:
        v.back, engine.equal_spans = real, False
    assert counts[True] < counts[False], counts  # fewer, fuller calls


def test_small_first_window(engine: PiperEngine, prepared: list[Prepared], whole: list[np.ndarray]) -> None:
    p, ref = prepared[0], whole[0]
    first = engine.decode([Window(p, 0, 6)])[0]
    assert len(first) == 6 * HOP  # ~70 ms of audio
    assert np.max(np.abs(first - ref[: 6 * HOP])) <= TOLERANCE


def test_decode_refuses_windows_outside_the_segment(engine: PiperEngine, prepared: list[Prepared]) -> None:
    p = prepared[1]
    for start, end in ((0, 0), (5, 3), (-1, 4), (0, p.frames + 1)):
        with pytest.raises(ValueError, match="outside"):
            engine.decode([Window(p, start, end)])


def test_audio_is_speech_level_and_clipped(whole: list[np.ndarray]) -> None:
    for audio in whole:
        assert audio.dtype == np.float32
        assert np.all(np.abs(audio) <= 1.0)
        assert rms(audio) > 0.02


@pytest.mark.parametrize("text", ["...", "—", "", "   ", "!?", "…", "- - -", "()"])
def test_unspeakable_text_gives_none(engine: PiperEngine, text: str) -> None:
    assert engine.prepare(text) is None


def test_word_timings(engine: PiperEngine, prepared: list[Prepared]) -> None:
    for p in [*prepared, engine.prepare("I paid $3.50 to Dr. Smith at example.com on Jan. 5th.")]:
        assert p is not None
        duration = p.frames * HOP / engine.sample_rate
        words = [w for w, _, _ in p.words]
        assert words == [w for w in p.text.split() if any(c.isalnum() for c in w)]
        starts = [s for _, s, _ in p.words]
        ends = [e for _, _, e in p.words]
        assert all(0.0 <= s < e <= duration + 1e-6 for s, e in zip(starts, ends)), p.words
        assert starts == sorted(starts) and ends == sorted(ends), p.words
        assert all(e <= s2 + 1e-6 for e, s2 in zip(ends, starts[1:])), p.words  # no overlap
        # The words span the utterance, not a corner of it: after the last word comes only the sentence's
        # closing pause (its length is sampled: up to ~0.3 s; a fraction of a short "Hello." was flaky).
        assert duration - ends[-1] < 0.45 and starts[0] < 0.2, (duration, p.words)


def test_word_timings_match_the_audio(engine: PiperEngine) -> None:
    """A word's span holds sound; the gap around the sentence is quiet."""
    p = engine.prepare("Apples, bananas, and cherries.")
    assert p is not None
    audio = engine.decode_whole(p)
    sr = engine.sample_rate
    for word, start, end in p.words:
        assert rms(audio[int(start * sr) : int(end * sr)]) > 0.02, word


@pytest.mark.parametrize(
    ("text", "min_s", "max_s"),
    [
        ("I paid $3.50 to Dr. Smith at example.com on Jan. 5th.", 3.0, 9.0),
        ("Call 555-0123 or visit https://www.example.org/help now.", 3.0, 12.0),
        ("The U.S. GDP grew 2.5% in Q3, e.g. faster than the E.U.", 3.0, 12.0),
        ("1,000,000", 0.5, 4.0),
    ],
)
def test_numbers_abbreviations_urls_are_spoken(engine: PiperEngine, text: str, min_s: float, max_s: float) -> None:
    p = engine.prepare(text)
    assert p is not None
    audio = engine.decode_whole(p)
    seconds = len(audio) / engine.sample_rate
    assert min_s <= seconds <= max_s, seconds
    assert rms(audio) > 0.03
    # no long silent stretch inside (a garbled or dropped token would show as one)
    frame = engine.sample_rate // 20
    levels = [rms(audio[i : i + frame]) for i in range(0, len(audio) - frame, frame)]
    inner = levels[2:-2]
    runs = [len(list(g)) for quiet, g in itertools.groupby(lv < 0.005 for lv in inner) if quiet]
    assert max(runs, default=0) * 0.05 < 0.8


def test_voice_metadata(engine: PiperEngine) -> None:
    assert engine.sample_rate == 22050
    assert engine.default_voice in engine.voices
    assert engine.resolve(None) == engine.default_voice
    with pytest.raises(KeyError):
        engine.resolve("no-such-voice")


def test_a_cuda_session_that_falls_back_to_the_cpu_is_refused(engine: PiperEngine) -> None:
    """onnxruntime quietly runs a CUDA session on the CPU when it lacks the CUDA libraries (here:
    it has no CUDA provider at all); a server on --device cuda must say so, not serve from the CPU."""
    from tts_service.piper.voices import VoiceError

    cuda = PiperEngine()  # the CPU build here: only the session check is under test
    cuda.device = "cuda"
    with pytest.raises(VoiceError, match="fell back to CPUExecutionProvider"):
        cuda._session(engine.voices[engine.default_voice].files.back_path)
