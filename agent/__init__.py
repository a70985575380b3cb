"""Voice-agent side of streamvox, in two halves.

* **Plug-ins** (this package's modules): ``pipecat`` and ``livekit`` (the TTS services users
  import), their adapters ``pipecat_echo``, ``pipecat_yield`` and ``livekit_echo``, and
  ``webrtc_uplink`` (aiortc). Each framework is imported only in its own modules.
* **Runtime** (:mod:`agent.runtime`): VAD, jitter buffer, playback, speech output, barge-in and
  echo cancellation, free of any framework so it is tested without one; the plug-ins use it,
  it never uses them.

``agent.vad``, ``agent.jitter``, ``agent.speech``, ``agent.bargein`` and ``agent.echo`` are the
runtime's old addresses, kept as re-exports for code written against them.
"""
