"""The Piper engine: pure compute, no asyncio, no sockets, no clocks.

``prepare(text, voice)`` runs the front part of the split graph (phonemes -> text encoder,
durations and flow -> the decoder's input frames) and maps durations back to word timings.
``decode(windows)`` runs the back part (the HiFi-GAN decoder alone) over windows of latent
frames, from any number of streams in one call.

Why windows with context: the decoder is a stack of convolutions, so each output sample depends
on a few latent frames around it (its receptive field, read from the graph for each voice and
confirmed at load: :mod:`tts_service.piper.receptive`). Decoding ``[start, end)`` with exactly that
many extra frames on each side and keeping only the middle reproduces a whole-segment decode
(the tests hold it to 1e-6; on the bundled voice it is bit for bit). A small first window gives
a fast first byte; later, larger windows amortise the context.

Windows of equal padded length are stacked into one batch; different lengths run as separate
calls. Padding to a common length would change the convolutions' edge behaviour for windows
at the end of an utterance, so we do not pad.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import unicodedata
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.engine import Engine, VoiceInfo
from .receptive import Reach, UnsupportedGraph, graph_reach, measure_reach
from .scheduler import HOP, Prepared
from .voices import BACK_OUTPUT, DEC_IN, DURATIONS, VoiceError, VoiceFiles, split_voice

log = logging.getLogger(__name__)

# onnxruntime's CPU convolutions take another code path for inputs of 64 frames or fewer, whose
# sums differ from a long input's in the last bits (on every layer of the joe voice, any thread
# count or optimisation level). Every decoded span is widened with real neighbouring frames to at
# least this, so a window equals a whole decode bit for bit. It costs little: a call's fixed costs
# dominate a short span, and the first window of a stream (no left context) may then hold
# MIN_SPAN - right-context frames of audio for the price of a short one (docs/BENCHMARKS.md).
MIN_SPAN = 65
DEFAULT_GAIN = 1.5  # raw peaks sit near 0.5-0.7; piper normalises per sentence, which needs the whole sentence
# Speaking rates a stream may ask for (``start``'s ``speed``): where the rendered length follows
# the rate and Whisper still hears the words (measured, docs/BENCHMARKS.md "Speaking rate").
SPEED_RANGE = (0.5, 2.0)
_WARM_UP_FIRST = "Warming up the voice, one two three."  # as long as a typical first segment
_WARM_UP_TEXT = "Thanks for waiting: we are almost ready to talk, and the voice sounds fine."
_WORD_RE = re.compile(r"\S+")
_SPEAKABLE_RE = re.compile(r"\w")
# Phoneme symbols that are not sounds of their own: stress marks, length, punctuation.
_NON_SOUNDS = set("ˈˌː.,;:!?¡¿—…\"'()-") | {"\u0329", "\u0303", "\u032a"}


@dataclass(frozen=True, slots=True)
class Window:
    """Latent frames ``[start, end)`` of a prepared segment to turn into audio."""

    prepared: Prepared
    start: int
    end: int


@dataclass(slots=True)
class _Voice:
    files: VoiceFiles
    front: object  # onnxruntime.InferenceSession, one intra-op thread: segments read ahead
    front_urgent: object  # the same part with all threads: a segment the listener waits for
    back: object
    espeak_voice: str
    id_map: dict[str, list[int]]
    scales: np.ndarray
    sample_rate: int
    reach: Reach  # decoder context per window side, from the graph, confirmed at load
    word_cache: dict[str, int] = field(default_factory=dict)


class PiperEngine(Engine):
    """Loads Piper voices split for streaming and runs their two parts."""

    speed_range: tuple[float, float] | None = SPEED_RANGE

    def __init__(
        self,
        *,
        device: str = "cpu",
        threads: int | None = None,
        gain: float = DEFAULT_GAIN,
        noise_scale: float | None = None,
    ) -> None:
        import onnxruntime as ort

        self._ort = ort
        if device not in ("cpu", "cuda"):
            raise VoiceError(f"device {device!r} is not supported; use 'cpu' or 'cuda'")
        if device == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
            raise VoiceError(
                "--device cuda needs the CUDA provider of onnxruntime: pip install onnxruntime-gpu "
                f"(this onnxruntime offers {ort.get_available_providers()})"
            )
        if device == "cuda" and hasattr(ort, "preload_dlls"):
            # CUDA and cuDNN from pip's nvidia-* wheels are not on the loader's path by themselves:
            # without this a CUDA session silently falls back to the CPU. Libraries it cannot find
            # are not an error here: the session check in _session says what is missing.
            try:
                ort.preload_dlls()
            except Exception as exc:  # any loader failure: the session check reports what is missing
                log.warning("onnxruntime.preload_dlls() failed: %s", exc)
        self.device = device
        self.threads = threads
        self.gain = gain
        self.noise_scale = noise_scale
        # Widen a batch's spans to one length so it runs as one call: pays on a GPU (issue 12),
        # costs compute on a CPU, where the scheduler sends one window per batch anyway.
        self.equal_spans = device == "cuda"
        self.cost_per_audio_s: float | None = None  # measured at warm-up (the slowest voice)
        self.startup_cost_s: float | None = None  # seconds of a stream's start-up, likewise
        self.voices: dict[str, _Voice] = {}
        self.default_voice: str | None = None
        self._phonemizer = None
        self._espeak_lock = threading.Lock()  # espeak-ng keeps global state: one caller at a time

    # ------------------------------------------------------------------ loading
    def load_voice(self, model_path: str | Path, *, progress=print) -> str:
        """Load (once) and return the voice's name; the first voice loaded is the default."""
        files = split_voice(model_path, progress=progress)
        if files.name in self.voices:
            return files.name
        cfg = files.config
        if int(cfg.get("num_speakers", 1)) > 1:
            raise VoiceError(f"{files.name} is a multi-speaker voice; streamvox serves single-speaker voices")
        if cfg.get("phoneme_type", "espeak") != "espeak":
            raise VoiceError(f"{files.name} uses phoneme type {cfg.get('phoneme_type')!r}; only espeak is supported")
        progress(f"loading {files.name} ({self.device}) ...")
        inf = cfg.get("inference", {})
        noise = inf.get("noise_scale", 0.667) if self.noise_scale is None else self.noise_scale
        scales = np.array([noise, inf.get("length_scale", 1.0), inf.get("noise_w", 0.8)], dtype=np.float32)
        back = self._session(files.back_path)
        voice = _Voice(
            files=files,
            front=self._session(files.front_path, threads=1),
            front_urgent=self._session(files.front_path),
            back=back,
            espeak_voice=cfg.get("espeak", {}).get("voice", "en-us"),
            id_map=cfg["phoneme_id_map"],
            scales=scales,
            sample_rate=int(cfg["audio"]["sample_rate"]),
            reach=self._decoder_reach(files, back),
        )
        if self.voices and voice.sample_rate != self.sample_rate:
            raise VoiceError(
                f"{files.name} is {voice.sample_rate} Hz but the loaded voices are {self.sample_rate} Hz; "
                "serve voices of one native rate per process"
            )
        self.voices[files.name] = voice
        self.default_voice = self.default_voice or files.name
        self._warm_up(files.name)
        return files.name

    def _session(self, path: Path, *, threads: int | None = None):
        opts = self._ort.SessionOptions()
        # onnxruntime's own default thread count ran several times slower here (it counts the
        # machine's cores, not ours): pin it to the CPUs this process may use (``threads``:
        # fewer, for the front part's read-ahead session, see prepare()). The decoder's
        # convolutions gain from two threads.
        opts.intra_op_num_threads = threads or self.threads or len(os.sched_getaffinity(0))
        # Spinning worker threads fight the event loop (and any neighbour) for the same cores: on a
        # busy machine a window takes a fraction of the time with spinning off.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.inter_op_num_threads = 1
        providers = (
            ["CUDAExecutionProvider", "CPUExecutionProvider"] if self.device == "cuda" else ["CPUExecutionProvider"]
        )
        session = self._ort.InferenceSession(str(path), opts, providers=providers)
        if self.device == "cuda" and session.get_providers()[0] != "CUDAExecutionProvider":
            # a GPU figure measured on the CPU would be a lie: refuse to serve like this
            raise VoiceError(
                f"{path.name}: onnxruntime listed CUDAExecutionProvider but the session fell back to "
                f"{session.get_providers()[0]}; the CUDA 12 / cuDNN 9 libraries it needs were not found "
                "(install them, or pip install onnxruntime-gpu[cuda,cudnn])"
            )
        return session

    def _decoder_reach(self, files: VoiceFiles, back) -> Reach:
        """The decoder's receptive field: read from its graph, then checked on the running session.

        Perturbing one input frame shows which output frames move; if that is wider than the
        graph reading (a node we read wrongly), the measurement wins and we say so. If the graph
        cannot be read at all, the measurement alone is used.
        """
        import onnx

        channels = int(back.get_inputs()[0].shape[1])

        def run(x: np.ndarray) -> np.ndarray:
            return back.run(None, {DEC_IN: x})[0]

        measured = measure_reach(run, channels, HOP)
        try:
            computed, rate = graph_reach(onnx.load(str(files.back_path)).graph, DEC_IN, BACK_OUTPUT)
        except UnsupportedGraph as exc:
            log.warning("%s: decoder context measured only (%s): %s", files.name, exc, measured)
            return measured
        if rate != HOP:
            raise VoiceError(f"{files.name}: the decoder makes {rate} samples per frame; streamvox expects {HOP}")
        if measured.left > computed.left or measured.right > computed.right:
            log.warning("%s: measured decoder context %s exceeds the graph's %s", files.name, measured, computed)
            return Reach(max(measured.left, computed.left), max(measured.right, computed.right))
        return computed

    @property
    def context(self) -> int:
        """The widest context per window side over the loaded voices (the scheduler's cost model)."""
        return max((max(v.reach.left, v.reach.right) for v in self.voices.values()), default=0)

    def _warm_up(self, voice: str) -> None:
        """First runs allocate arenas and pick kernels; do it before serving real users. A second
        pass is timed: a stream's start-up (a first segment's front part and first window) and
        worker seconds per audio second of a typical reply, which seed admission until real
        batches refine them (a fixed guess, right for no machine, refused much of the capacity)."""
        free = self.free_frames(voice)
        for timed in (False, True):
            t0 = time.perf_counter()
            first = self.prepare(_WARM_UP_FIRST, voice, urgent=True)  # (warms that session too)
            if first is None:  # pragma: no cover - espeak always speaks this
                return
            self.decode([Window(first, 0, min(first.frames, free))])
            t1 = time.perf_counter()
            prepared = self.prepare(_WARM_UP_TEXT, voice)
            assert prepared is not None
            start, size = 0, free
            while start < prepared.frames:
                end = min(prepared.frames, start + size)
                self.decode([Window(prepared, start, end)])
                start, size = end, 96
            if timed:
                audio_s = prepared.frames * HOP / self.voices[voice].sample_rate
                cost = (time.perf_counter() - t1) / audio_s
                self.cost_per_audio_s = max(self.cost_per_audio_s or 0.0, cost)
                self.startup_cost_s = max(self.startup_cost_s or 0.0, t1 - t0)

    @property
    def sample_rate(self) -> int:
        if not self.voices:
            raise VoiceError("no voice loaded: call load_voice() first")
        return next(iter(self.voices.values())).sample_rate

    def describe_voices(self) -> list[VoiceInfo]:
        return [VoiceInfo(name, v.sample_rate, str(v.files.model_path)) for name, v in self.voices.items()]

    # ------------------------------------------------------------------ front part
    def _phonemize(self, voice: _Voice, text: str) -> list[str]:
        with self._espeak_lock:
            if self._phonemizer is None:
                from piper.phonemize_espeak import EspeakPhonemizer

                self._phonemizer = EspeakPhonemizer()
            sentences = self._phonemizer.phonemize(voice.espeak_voice, text)
        phonemes: list[str] = []
        for sentence in sentences:
            if phonemes and sentence:
                phonemes.append(" ")
            phonemes.extend(sentence)
        return phonemes

    def run_options(self):
        """A handle to abort runs from another thread (``.terminate = True``): the runtime uses
        it to drop a batch that only cancelled streams still wait for."""
        return self._ort.RunOptions()

    def prepare(
        self, text: str, voice: str | None = None, run_options=None, *, urgent: bool = False, speed: float = 1.0
    ) -> Prepared | None:
        """Front part for one segment; ``None`` when the text has nothing to speak.

        ``speed``: the speaking rate relative to the voice's own; it divides the voice's length
        scale, which only the duration predictor reads, so a stream's rate is fixed in its
        prepared frames and the decoder (batched across streams) never sees it.

        ``urgent``: the listener is waiting for this segment's first audio (a stream's start-up):
        run it on all intra-op threads. Segments prepared ahead run on one: under outside load
        two threads cut the front part's wall time but cost more CPU in all, and wall time only
        matters where somebody waits."""
        name = self.resolve(voice)
        v = self.voices[name]
        text = unicodedata.normalize("NFC", text).strip()
        if not _SPEAKABLE_RE.search(text):
            return None
        phonemes = [p for p in self._phonemize(v, text) if p in v.id_map]
        if not any(p not in _NON_SOUNDS and p != " " for p in phonemes):
            return None
        front = v.front_urgent if urgent else v.front
        z, durations = front.run([DEC_IN, DURATIONS], self._feed(v, phonemes, speed), run_options)
        durations = durations.reshape(-1)
        words = self._word_times(v, text, phonemes, durations)
        return Prepared(text=text, z=z.astype(np.float32, copy=False), words=words, voice=name)

    @staticmethod
    def _feed(v: _Voice, phonemes: list[str], speed: float = 1.0) -> dict[str, np.ndarray]:
        x = np.asarray([_phonemes_to_ids(phonemes, v.id_map)], dtype=np.int64)
        scales = v.scales
        if speed != 1.0:  # scales is one [3] vector per call (not per row): the front part runs one segment a call
            scales = scales.copy()
            scales[1] = scales[1] / speed
        return {"input": x, "input_lengths": np.asarray([x.shape[1]], dtype=np.int64), "scales": scales}

    def front_feed(self, text: str, voice: str | None = None, speed: float = 1.0) -> dict[str, np.ndarray]:
        """The front part's inputs for ``text`` (benchmarks run the part alone)."""
        v = self.voices[self.resolve(voice)]
        return self._feed(v, [p for p in self._phonemize(v, text) if p in v.id_map], speed)

    def _word_times(
        self, v: _Voice, text: str, phonemes: list[str], durations: np.ndarray
    ) -> list[tuple[str, float, float]]:
        """Map per-phoneme-id durations back to the words of ``text``."""
        sec_per_frame = HOP / v.sample_rate
        # ids = [BOS, PAD, p0, PAD, p1, PAD, ..., EOS]: phoneme k is id 2+2k; starts[i] = start of id i.
        starts = np.concatenate([[0.0], np.cumsum(durations)])
        spans: list[tuple[float, float]] = []  # one (start, end) in frames per sounding phoneme
        groups: list[list[int]] = [[]]  # phoneme-word -> indices into spans
        for k, p in enumerate(phonemes):
            if p == " ":
                if groups[-1]:
                    groups.append([])
                continue
            if p in _NON_SOUNDS:
                continue
            groups[-1].append(len(spans))
            spans.append((float(starts[2 + 2 * k]), float(starts[3 + 2 * k])))
        groups = [g for g in groups if g]
        text_words = [w for w in _WORD_RE.findall(text) if _SPEAKABLE_RE.search(w)]
        if not spans or not text_words:
            return []
        counts = [self._phoneme_words(v, w) for w in text_words]
        out: list[tuple[str, float, float]] = []
        if sum(counts) == len(groups) and all(counts):
            # espeak kept word boundaries: each text word owns whole phoneme words.
            i = 0
            for word, n in zip(text_words, counts):
                first, last = groups[i][0], groups[i + n - 1][-1]
                out.append((word, spans[first][0] * sec_per_frame, spans[last][1] * sec_per_frame))
                i += n
            return out
        # espeak merged or split words (e.g. "of the" -> one phoneme word): share the sounding
        # phonemes out in proportion to each word's length, monotonically.
        weights = np.asarray([max(1, len(w)) for w in text_words], dtype=np.float64)
        edges = np.round(np.concatenate([[0.0], np.cumsum(weights)]) / weights.sum() * len(spans)).astype(int)
        for j, word in enumerate(text_words):
            lo = min(edges[j], len(spans) - 1)
            hi = max(lo, edges[j + 1] - 1)
            out.append((word, spans[lo][0] * sec_per_frame, spans[min(hi, len(spans) - 1)][1] * sec_per_frame))
        return out

    def _phoneme_words(self, v: _Voice, word: str) -> int:
        """How many phoneme words espeak makes of one text word alone (numbers make several)."""
        cached = v.word_cache.get(word)
        if cached is None:
            phonemes = self._phonemize(v, word)
            cached = len([g for g in "".join(p for p in phonemes if p not in _NON_SOUNDS).split(" ") if g])
            if len(v.word_cache) < 50_000:
                v.word_cache[word] = cached
        return cached

    # ------------------------------------------------------------------ back part
    def decode(self, windows: list[Window], run_options=None) -> list[np.ndarray]:
        """Audio (float32, fixed gain, clipped to [-1, 1]) for each window, in order."""
        results: list[np.ndarray | None] = [None] * len(windows)
        groups: dict[tuple[str, int], list[int]] = defaultdict(list)
        spans = []
        for w in windows:
            if not 0 <= w.start < w.end <= w.prepared.frames:
                raise ValueError(f"window [{w.start}, {w.end}) outside 0..{w.prepared.frames}")
            spans.append(self._span(w))
        if self.equal_spans and len(windows) > 1:
            # One call for the whole batch where batching pays: widen every span to the widest
            # with real frames of its own segment (exact, like MIN_SPAN); a segment too short
            # to reach it keeps its own length (zero padding would change its edge samples).
            widest = max(hi - lo for lo, hi in spans)
            spans = [self._widen(lo, hi, widest, w.prepared.frames) for (lo, hi), w in zip(spans, windows)]
        for i, (w, (lo, hi)) in enumerate(zip(windows, spans)):
            groups[(w.prepared.voice, hi - lo)].append(i)
        for (voice, _), members in groups.items():
            z = np.concatenate([windows[i].prepared.z[:, :, spans[i][0] : spans[i][1]] for i in members])
            audio = self.voices[voice].back.run(None, {DEC_IN: z}, run_options)[0].reshape(len(members), -1)
            for row, i in enumerate(members):
                w, lo = windows[i], spans[i][0]
                chunk = audio[row, (w.start - lo) * HOP : (w.end - lo) * HOP] * self.gain
                results[i] = np.clip(chunk, -1.0, 1.0).astype(np.float32, copy=False)
        return results  # type: ignore[return-value]

    def _span(self, w: Window) -> tuple[int, int]:
        """Frames to decode for ``w``: its receptive field, widened with real frames to ``MIN_SPAN``."""
        reach, frames = self.voices[w.prepared.voice].reach, w.prepared.frames
        lo, hi = max(0, w.start - reach.left), min(frames, w.end + reach.right)
        return self._widen(lo, hi, MIN_SPAN, frames)

    @staticmethod
    def _widen(lo: int, hi: int, span: int, frames: int) -> tuple[int, int]:
        """``[lo, hi)`` grown to ``span`` frames within ``[0, frames)``: right first, then left."""
        short = span - (hi - lo)
        if short > 0:
            grown = min(frames, hi + short)
            lo, hi = max(0, lo - (short - (grown - hi))), grown
        return lo, hi

    def free_frames(self, voice: str | None = None) -> int:
        """The largest first window (from frame 0) that costs no more than the smallest one."""
        v = self.voices[self.resolve(voice)]
        return MIN_SPAN - v.reach.right

    def decode_whole(self, prepared: Prepared) -> np.ndarray:
        """Whole-segment decode: the batch baseline, and the reference in tests."""
        return self.decode([Window(prepared, 0, prepared.frames)])[0]


def _phonemes_to_ids(phonemes: list[str], id_map: dict[str, list[int]]) -> list[int]:
    """Piper's id layout: BOS, PAD, then each phoneme followed by PAD, then EOS."""
    ids = list(id_map["^"]) + list(id_map["_"])
    for p in phonemes:
        ids.extend(id_map[p])
        ids.extend(id_map["_"])
    ids.extend(id_map["$"])
    return ids
