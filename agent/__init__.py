"""Voice-agent side of streamvox: VAD, jitter buffer, playback sinks, barge-in.

Everything here is framework-neutral; Pipecat and LiveKit code lives only in
their own plug-in modules so this core can be tested without either.
"""
