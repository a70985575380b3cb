"""Pipecat's Silero VAD analyzer on one ONNX session per process, not one per call.

Why: ``SileroVADAnalyzer()`` builds an ONNX Runtime session in its constructor, and the demo
builds each call's pipeline on the event loop. Every call's start then held the loop for 50-170 ms
(``pipelines.loop_watch`` logged it at each page session), and every other call's audio waited
through it: the downlink's packets leave in a burst afterwards, which the caller hears and the
echo canceller reads as its echo path moving.

The session is stateless (``InferenceSession.run`` is thread-safe, and Silero's recurrent state
is an input and an output of each run), so :class:`SharedSileroVAD` gives each call its own
:class:`~pipecat.audio.vad.silero.SileroOnnxModel` state around the one session that
``agent.runtime.vad.shared_session`` keeps for the whole process: the YieldGate's own Silero
uses it too, and ``pipelines.pipecat_agent.preload`` loads it before the first call.
"""

from __future__ import annotations

from importlib import resources

from pipecat.audio.vad.silero import SileroOnnxModel, SileroVADAnalyzer
from pipecat.audio.vad.vad_analyzer import VADAnalyzer, VADParams

from agent.runtime.vad import shared_session

__all__ = ["SharedSileroVAD", "pipecat_model_path"]


def pipecat_model_path() -> str:
    """The Silero model Pipecat's analyzer loads (bundled in the pipecat-ai wheel)."""
    return str(resources.files("pipecat.audio.vad.data").joinpath("silero_vad.onnx"))


class SharedSileroVAD(SileroVADAnalyzer):
    """``SileroVADAnalyzer`` whose model state is its own and whose ONNX session is shared.

    Pipecat's constructor is not called (it loads the model); this one sets what it sets: the
    base analyzer, the model wrapper and the two reset counters. ``tests/pipecat`` checks that it
    scores audio exactly as Pipecat's own analyzer does, and that analyzers do not share state.
    """

    def __init__(self, *, sample_rate: int | None = None, params: VADParams | None = None) -> None:
        VADAnalyzer.__init__(self, sample_rate=sample_rate, params=params)
        model = SileroOnnxModel.__new__(SileroOnnxModel)
        model.session = shared_session(pipecat_model_path())
        model.reset_states()
        model.sample_rates = [8000, 16000]
        self._model = model
        self._windows_since_reset = 0
        self._low_confidence_windows = 0
