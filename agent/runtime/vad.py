"""Streaming Silero voice-activity detection on onnxruntime, without torch.

Why this exists: barge-in (the caller talking over the bot) starts here, and the two things that
matter are *when* the caller really started speaking and *how soon* we can say so. Silero VAD is
small and cheap enough to run every 32 ms window on one CPU core beside the rest of the agent, and
accurate on telephone and wide-band audio (what barge-in takes end to end:
docs/BENCHMARKS.md, "Barge-in"). Its official Python package imports torch, which an agent
process should not pay for, so we drive the bundled ONNX graph directly with onnxruntime.

Model contract (checked when the model is loaded):

* ``input``  float32 [B, context + window]: 64 + 512 samples at 16 kHz, 32 + 256 at 8 kHz.
  The context is the tail of the previous call's input; without it the model sees a hard
  edge every window and its probabilities drift, so we carry it like the reference wrapper.
* ``state``  float32 [2, B, 128]: the recurrent state, carried between windows.
* ``sr``     int64 scalar: 16000 or 8000.
* outputs: ``output`` [B, 1] speech probability and ``stateN`` (the new state).

Streaming: :meth:`SileroVAD.feed` takes chunks of any length, keeps the remainder that does not
fill a 32 ms window, and runs whole windows only. Because the window grid is fixed from the start
of the stream, feeding a signal in pieces gives exactly the same probabilities and events as
feeding it whole (the tests check this).

Decision logic (hysteresis, as in Silero's own ``VADIterator``):

* a candidate run starts at the first window with ``prob >= threshold``; it survives windows
  down to ``neg_threshold`` (short dips inside words) and is dropped below it;
* ``speech_start`` is declared once the run has lasted ``min_speech_ms`` and the current window
  is itself above ``threshold``. Its ``onset_s`` is the start of the run's *first* window (when
  the caller began), ``decided_s`` the end of the deciding window (when we knew);
* with ``report_onsets`` on, the run's first window is also reported at once as ``onset`` and a
  run dropped before ``speech_start`` as ``onset_dropped``: the barge-in controller pauses the
  bot on the first and resumes it on the second (yield, then confirm), so the caller hears the
  bot stop ~32 ms after they start rather than after ``min_speech_ms``;
* while speaking, the first window below ``neg_threshold`` opens a tentative end; any window at or
  above ``threshold`` cancels it; after ``min_silence_ms`` of it ``speech_end`` is declared,
  with ``onset_s`` at the start of that silence.

Times are seconds of audio since the VAD was created or last :meth:`SileroVAD.reset`, not wall
clock, so the VAD is deterministic and testable; the caller maps them to its own clock.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import onnxruntime as ort

__all__ = [
    "ENV_MODEL_PATH",
    "SileroVAD",
    "VADEvent",
    "VADParams",
    "find_model_path",
    "shared_session",
]

ENV_MODEL_PATH = "STREAMVOX_VAD_MODEL"

# (top-level package, path of the model inside it). Found with find_spec, never imported:
# importing silero_vad pulls in torch, and pipecat/livekit are heavy and optional.
_BUNDLED_MODELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("silero_vad", ("data", "silero_vad.onnx")),
    ("pipecat", ("audio", "vad", "data", "silero_vad.onnx")),
    ("livekit", ("plugins", "silero", "resources", "silero_vad.onnx")),
)

# samples per window and of carried context, per sample rate
_WINDOW = {16000: 512, 8000: 256}
_CONTEXT = {16000: 64, 8000: 32}
_STATE_SHAPE_TAIL = 128


def find_model_path(model_path: str | os.PathLike[str] | None = None) -> Path:
    """Locate the Silero VAD ONNX file.

    Order: explicit ``model_path``, env ``STREAMVOX_VAD_MODEL``, then the copy bundled in the
    installed ``silero-vad``, ``pipecat-ai`` or ``livekit-plugins-silero`` package.
    """
    if model_path is not None:
        path = Path(model_path)
        if not path.is_file():
            raise FileNotFoundError(f"Silero VAD model not found at model_path={str(path)!r}")
        return path
    env = os.environ.get(ENV_MODEL_PATH)
    if env:
        path = Path(env)
        if not path.is_file():
            raise FileNotFoundError(f"{ENV_MODEL_PATH}={env!r} does not point to a file; fix or unset it")
        return path
    for package, parts in _BUNDLED_MODELS:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        # namespace packages (livekit) may span several directories
        for root in (spec.submodule_search_locations or []) if spec else []:
            path = Path(root).joinpath(*parts)
            if path.is_file():
                return path
    raise FileNotFoundError(
        "No Silero VAD ONNX model found. Pass model_path=..., set "
        f"{ENV_MODEL_PATH}=/path/to/silero_vad.onnx, or install a package that bundles it: "
        "`pip install --no-deps silero-vad` (the file only, no torch needed), "
        "`pipecat-ai[silero]` or `livekit-plugins-silero`."
    )


@functools.lru_cache(maxsize=4)
def shared_session(path: str) -> ort.InferenceSession:
    """One session per model file, shared by every VAD in the process (Pipecat's analyzers too:
    ``pipelines.pipecat_vad``).

    ``InferenceSession.run`` is thread-safe and each :class:`SileroVAD` keeps its own state, so
    sharing is safe. One thread: the model is tiny and must not contend with TTS inference.
    """
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    session = ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])
    _check_model_io(session, path)
    return session


def _check_model_io(session: ort.InferenceSession, path: str) -> None:
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
    missing = {"input", "state", "sr"} - inputs.keys()
    state_shape = inputs["state"].shape if "state" in inputs else None
    if (
        missing
        or len(outputs) != 2
        or state_shape is None
        or len(state_shape) != 3
        or state_shape[0] != 2
        or state_shape[2] != _STATE_SHAPE_TAIL
    ):
        raise ValueError(
            f"{path} is not a Silero VAD v5/v6 model: expected inputs input/state[2,B,128]/sr "
            f"and two outputs, got inputs {sorted(inputs)} (state {state_shape}), "
            f"outputs {outputs}"
        )


@dataclass(frozen=True, slots=True)
class VADParams:
    """Decision parameters. ``neg_threshold=None`` means ``threshold - 0.15``."""

    threshold: float = 0.5
    neg_threshold: float | None = None
    min_speech_ms: float = 200.0
    min_silence_ms: float = 300.0
    sample_rate: int = 16000

    def __post_init__(self) -> None:
        if self.sample_rate not in _WINDOW:
            raise ValueError(
                f"Silero VAD supports sample_rate 16000 or 8000, got {self.sample_rate}; "
                "resample the audio first (e.g. with soxr)"
            )
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"threshold must be in (0, 1), got {self.threshold}")
        if self.neg_threshold is None:
            object.__setattr__(self, "neg_threshold", max(0.01, self.threshold - 0.15))
        elif not 0.0 <= self.neg_threshold <= self.threshold:
            raise ValueError(f"neg_threshold must be in [0, threshold={self.threshold}], got {self.neg_threshold}")
        if self.min_speech_ms < 0 or self.min_silence_ms < 0:
            raise ValueError("min_speech_ms and min_silence_ms must be >= 0")

    @property
    def window_samples(self) -> int:
        return _WINDOW[self.sample_rate]

    @property
    def window_s(self) -> float:
        return _WINDOW[self.sample_rate] / self.sample_rate


@dataclass(frozen=True, slots=True)
class VADEvent:
    """A speech boundary.

    ``onset_s``: where the boundary really is in the audio (first speech window for
    ``speech_start``, first silent window for ``speech_end``). ``decided_s``: the stream time at
    which the VAD declared it; ``decided_s - onset_s`` is the decision delay. ``onset``: a
    candidate run's first window (``decided_s`` is its end); ``onset_dropped``: that run ended
    before ``speech_start`` (``onset_s`` is the run's start, ``decided_s`` the end of the window
    that dropped it).
    """

    kind: Literal["speech_start", "speech_end", "onset", "onset_dropped"]
    onset_s: float
    decided_s: float
    probability: float = field(default=0.0, compare=False)

    @property
    def delay_s(self) -> float:
        return self.decided_s - self.onset_s


class SileroVAD:
    """Streaming Silero VAD for one mono audio stream.

    Not thread-safe: one instance per stream (they share the ONNX session).
    """

    def __init__(
        self,
        params: VADParams | None = None,
        *,
        model_path: str | os.PathLike[str] | None = None,
        report_onsets: bool = False,
    ) -> None:
        self.params = params if params is not None else VADParams()
        # off by default: consumers that know only speech_start/speech_end see nothing new
        self.report_onsets = report_onsets
        self.model_path = find_model_path(model_path)
        self._session = shared_session(str(self.model_path))
        sr = self.params.sample_rate
        self._window = _WINDOW[sr]
        self._context_len = _CONTEXT[sr]
        self._sr = np.array(sr, dtype=np.int64)
        # windows needed for a decision; ceil so that e.g. 200 ms needs 7 x 32 ms, never fewer
        window_ms = 1000.0 * self._window / sr
        self._min_speech_windows = max(1, math.ceil(self.params.min_speech_ms / window_ms - 1e-9))
        self._min_silence_windows = max(1, math.ceil(self.params.min_silence_ms / window_ms - 1e-9))
        self.reset()

    def reset(self) -> None:
        """Forget all audio: state, context, partial window, speech status and stream time."""
        self._state = np.zeros((2, 1, _STATE_SHAPE_TAIL), dtype=np.float32)
        # the model input is [context | window]; we keep it as one buffer and roll the context
        self._input = np.zeros((1, self._context_len + self._window), dtype=np.float32)
        self._pending = np.zeros(0, dtype=np.float32)
        self._windows_done = 0
        self._speaking = False
        self._run_start: int | None = None  # first window of a candidate speech run
        self._silence_start: int | None = None  # first window of a tentative end
        self._last_prob = 0.0

    @property
    def speaking(self) -> bool:
        """True between a ``speech_start`` and the following ``speech_end``."""
        return self._speaking

    @property
    def last_prob(self) -> float:
        """Speech probability of the most recent window (0.0 before any)."""
        return self._last_prob

    @property
    def time_s(self) -> float:
        """Seconds of audio processed in whole windows since creation or reset."""
        return self._windows_done * self.params.window_s

    def feed(self, pcm: np.ndarray | bytes | bytearray | memoryview) -> list[VADEvent]:
        """Add mono audio at ``params.sample_rate``; return the events it completes.

        ``pcm``: int16 samples (array or little-endian bytes) or float32 in [-1, 1].
        Any length; samples that do not fill a window wait for the next call.
        """
        samples = _to_float32(pcm)
        if self._pending.size:
            samples = np.concatenate((self._pending, samples))
        n_windows = samples.size // self._window
        events: list[VADEvent] = []
        for k in range(n_windows):
            prob = self._infer(samples[k * self._window : (k + 1) * self._window])
            for event in self._decide(prob):
                if self.report_onsets or event.kind in ("speech_start", "speech_end"):
                    events.append(event)
        self._pending = samples[n_windows * self._window :].copy()
        return events

    def _infer(self, window: np.ndarray) -> float:
        ctx = self._context_len
        self._input[0, ctx:] = window
        prob, self._state = self._session.run(None, {"input": self._input, "state": self._state, "sr": self._sr})
        # next call's context = last samples of this call's input
        self._input[0, :ctx] = self._input[0, -ctx:]
        return float(prob.reshape(-1)[0])

    def _decide(self, prob: float) -> list[VADEvent]:
        p = self.params
        i = self._windows_done
        self._windows_done += 1
        self._last_prob = prob
        win_s = p.window_s
        decided = self._windows_done * win_s
        assert p.neg_threshold is not None  # resolved in VADParams.__post_init__

        if not self._speaking:
            events: list[VADEvent] = []
            if self._run_start is None:
                if prob >= p.threshold:
                    self._run_start = i
                    events.append(VADEvent("onset", i * win_s, decided, prob))
            elif prob < p.neg_threshold:
                events.append(VADEvent("onset_dropped", self._run_start * win_s, decided, prob))
                self._run_start = None
            if (
                self._run_start is not None
                and prob >= p.threshold
                and i - self._run_start + 1 >= self._min_speech_windows
            ):
                self._speaking = True
                self._silence_start = None
                onset = self._run_start * win_s
                self._run_start = None
                events.append(VADEvent("speech_start", onset, decided, prob))
            return events

        if prob >= p.threshold:
            self._silence_start = None
        elif prob < p.neg_threshold and self._silence_start is None:
            self._silence_start = i
        if self._silence_start is not None and i - self._silence_start + 1 >= self._min_silence_windows:
            self._speaking = False
            onset = self._silence_start * win_s
            self._silence_start = None
            return [VADEvent("speech_end", onset, decided, prob)]
        return []


def _to_float32(pcm: np.ndarray | bytes | bytearray | memoryview) -> np.ndarray:
    if isinstance(pcm, (bytes, bytearray, memoryview)):
        if len(pcm) % 2:
            raise ValueError("int16 PCM bytes must have an even length")
        pcm = np.frombuffer(pcm, dtype="<i2")
    arr = np.asarray(pcm)
    if arr.ndim != 1:
        raise ValueError(f"expected mono 1-D audio, got shape {arr.shape}")
    if arr.dtype == np.int16:
        return arr.astype(np.float32) / 32768.0
    if arr.dtype.kind == "f":
        return arr.astype(np.float32, copy=False)
    raise TypeError(f"expected int16 or float audio, got dtype {arr.dtype}")
