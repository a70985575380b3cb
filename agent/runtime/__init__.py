"""The agent's framework-free runtime: what a voice agent does with audio, whatever hosts it.

VAD (:mod:`.vad`), the adaptive jitter buffer (:mod:`.jitter`), playback sinks (:mod:`.playback`),
a TTS context played through them (:mod:`.speech`), barge-in with yield-then-confirm
(:mod:`.bargein`) and the echo canceller fed with the bot's exact reference (:mod:`.echo`).

Why a package of its own: none of this imports Pipecat, LiveKit or aiortc, so it is tested and
simulated (``sim``) without either framework, and the plug-ins beside it (``agent.pipecat_echo``,
``agent.livekit_echo``, ``agent.pipecat_yield``) stay thin adapters over it.
``tests/test_layout.py`` keeps the direction: plug-ins may use the runtime, never the reverse.
Nothing is imported here, so ``import agent.runtime.jitter`` does not load onnxruntime.
"""
