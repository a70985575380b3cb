"""Assembled voice agents built from ``tts_service`` and ``agent`` (Pipecat pipeline, LiveKit worker)."""
