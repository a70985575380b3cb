"""Fixtures of the deploy suite: the real voice behind a real server, to check manifests against."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from support.tts_helpers import RunningServer, running_server


@pytest.fixture(scope="session")
def engine():
    from tts_service.piper.serve import load_piper_engine

    return load_piper_engine([], progress=lambda *_: None)


@pytest.fixture(scope="session")
async def deploy_server(engine) -> AsyncIterator[RunningServer]:
    async with running_server(engine) as srv:
        yield srv
