"""Live servers for the bench's end-to-end tests: streamvox and the batch baseline, in-process.

They run on their own event loop in a background thread, so that a test may drive them from
pytest's loop or through the CLI's own ``asyncio.run`` alike. streamvox gets a very high
admission capacity: on a busy 2-core test machine its measured cost can refuse the second
context of a test, and admission is not what these tests are about.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@dataclass(frozen=True)
class LiveServers:
    streaming: str  # ws:// URL
    baseline: str


@pytest.fixture(scope="session")
def live_servers() -> Iterator[LiveServers]:
    from aiohttp import web

    from bench.baseline import BaselineServer, load_voice
    from tts_service import protocol as P
    from tts_service.piper.runtime import PiperSynthesizer
    from tts_service.piper.scheduler import PiperSchedulerOptions
    from tts_service.piper.serve import load_piper_engine
    from tts_service.server import Server

    engine = load_piper_engine([], progress=lambda *_: None)
    voice, name = load_voice()
    loop = asyncio.new_event_loop()
    runners: list[web.AppRunner] = []

    async def start(app: web.Application) -> str:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        host, port = runner.addresses[0][:2]
        return f"ws://{host}:{port}{P.WS_PATH}"

    async def start_all() -> LiveServers:
        streaming = Server(PiperSynthesizer(engine, options=PiperSchedulerOptions(capacity=1000.0)))
        return LiveServers(await start(streaming.app), await start(BaselineServer(voice, voice_name=name).app))

    thread = threading.Thread(target=loop.run_forever, name="bench-test-servers", daemon=True)
    thread.start()
    servers = asyncio.run_coroutine_threadsafe(start_all(), loop).result(60)
    try:
        yield servers
    finally:

        async def stop_all() -> None:
            for runner in runners:
                await runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop_all(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
