"""Moved to :mod:`agent.runtime.vad`; this address stays for code written against it."""

from agent.runtime.vad import ENV_MODEL_PATH, SileroVAD, VADEvent, VADParams, find_model_path, shared_session

__all__ = ["ENV_MODEL_PATH", "SileroVAD", "VADEvent", "VADParams", "find_model_path", "shared_session"]
