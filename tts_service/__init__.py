"""streamvox TTS service: incremental (not chunked-batch) speech synthesis over WebSocket and HTTP."""

__version__ = "0.1.0"
