"""Session fixtures of the LiveKit suite: the real bundled voice behind a real (counting) server,
Silero VAD, Whisper tiny.en, and one sentence of real speech for barge-in.

No LiveKit server exists here: the plug-in and an ``AgentSession`` run in-process, with the
stand-ins of ``tests.livekit.helpers`` where a room would be.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import numpy as np
import pytest


def _have_livekit() -> bool:
    try:
        return importlib.util.find_spec("livekit.agents") is not None
    except ModuleNotFoundError:
        return False


if not _have_livekit():  # the plug-in's framework is an extra: pip install '.[livekit]'
    collect_ignore_glob = ["test_*.py"]

if TYPE_CHECKING:
    from tests.livekit.helpers import RunningServer

BARGE_IN_SENTENCE = "Wait, stop. I have a different question."


@pytest.fixture(scope="session")
def engine():
    from tts_service.piper.serve import load_piper_engine

    return load_piper_engine([], progress=lambda *_: None)


@pytest.fixture(scope="session")
async def lk_server(engine) -> AsyncIterator[RunningServer]:
    from tests.livekit.helpers import running_server

    async with running_server(engine) as srv:
        yield srv


@pytest.fixture(scope="session")
def silero_vad():
    from livekit.plugins import silero

    return silero.VAD.load()


@pytest.fixture(scope="session")
def whisper_stt():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from pipelines.livekit_agent import WhisperSTT

    return WhisperSTT().load()


@pytest.fixture(scope="session")
async def barge_in_speech(lk_server: RunningServer) -> np.ndarray:
    """int16 16 kHz: a caller saying ``BARGE_IN_SENTENCE`` (our voice, synthesised once)."""
    from agent.livekit import StreamvoxTTS

    tts = StreamvoxTTS(url=lk_server.url, sample_rate=16000)
    try:
        frame = await tts.synthesize(BARGE_IN_SENTENCE).collect()
    finally:
        await tts.aclose()
    return np.frombuffer(frame.data, dtype=np.int16).copy()
