"""Fixtures of the Pipecat plug-in suite: the real bundled voice behind a real server on loopback.

The engine (about 2 s to load) is shared by the session; every test gets a server of its own
(a fresh Synthesizer, milliseconds to start) so that it can count the WebSocket connections that
server accepted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from support.pipecat_harness import CountingServer, counting_server


@pytest.fixture(scope="session")
def engine():
    from tts_service.piper.serve import load_piper_engine

    return load_piper_engine([], progress=lambda *_: None)


@pytest.fixture
async def server(engine) -> AsyncIterator[CountingServer]:
    async with counting_server(engine) as srv:
        yield srv
