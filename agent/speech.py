"""Moved to :mod:`agent.runtime.speech`; this address stays for code written against it."""

from agent.runtime.speech import PauseResult, SpeechOutput, SpeechStats, StopResult, Utterance, UtteranceStatus

__all__ = ["PauseResult", "SpeechOutput", "SpeechStats", "StopResult", "Utterance", "UtteranceStatus"]
