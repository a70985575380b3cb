"""Issue 13, drain on shutdown: readiness 503 at once, an in-band ``draining`` notice, new
contexts refused with ``draining`` + ``retry_after_ms``, live contexts finish within the drain
timeout, then an explicit ``shutting_down`` error and a 1001 close; an HTTP stream at the
deadline is truncated so the client can tell; a second SIGTERM stops at once.

The signal tests run the real ``streamvox serve`` in a subprocess; the admin endpoint
(issue 14; its own key since issue 22, see test_admin_key.py) is tested in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from support.tts_helpers import API_KEY, raw_connection, running_server
from tts_service import protocol as P
from tts_service.localproc import free_port
from tts_service.piper.engine import PiperEngine
from tts_service.protocol import CloseCode, ErrorCode, MsgType
from tts_service.server import ServerConfig

SHORT = "This is the last thing I will say before I stop."
LONG = (
    "Once upon a time, in a quiet village by the sea, there lived an old fisherman and his wife. "
    "Every morning he rowed his little boat out past the rocks, cast his nets into the cold water, "
    "and waited patiently for the tide to turn, hoping for a good catch and a calm evening."
)
AUTH = {"Authorization": f"Bearer {API_KEY}"}
ADMIN_KEY = "drain-admin-key"  # issue 22: the admin endpoints take their own key, not API_KEY
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@contextlib.asynccontextmanager
async def serve_process(*args: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, int]]:
    """``python -m tts_service`` on a free port, ready; killed on exit if still running."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "tts_service", "--port", str(port), "--log-level", "WARNING", *args),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(600):  # the voice loads in a few seconds, longer on a busy machine
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(f"http://127.0.0.1:{port}/readyz") as resp:
                        if resp.status == 200:
                            break
                assert proc.returncode is None, (await proc.stderr.read()).decode()[-2000:]
                await asyncio.sleep(0.1)
        yield proc, port
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _readyz(session: aiohttp.ClientSession, http: str) -> tuple[int, dict]:
    async with session.get(http + "/readyz") as resp:
        return resp.status, await resp.json()


async def _read_ws(ws: aiohttp.ClientWebSocketResponse) -> tuple[list[dict], int]:
    """Every JSON message until the close, and how many audio frames came."""
    seen: list[dict] = []
    frames = 0
    async for msg in ws:
        if msg.type == aiohttp.WSMsgType.TEXT:
            seen.append(json.loads(msg.data))
        elif msg.type == aiohttp.WSMsgType.BINARY:
            frames += 1
    return seen, frames


async def test_sigterm_drains_live_websocket_and_http_streams() -> None:
    drain_s = 7.0  # room for the short context on a busy machine; the long one has ~15 s to say
    # --capacity: three streams are admitted whatever the measured cost on a busy machine
    args = ("--drain-timeout", str(drain_s), "--capacity", "100")
    async with serve_process(*args) as (proc, port), aiohttp.ClientSession() as session:
        http = f"http://127.0.0.1:{port}"
        ws = await session.ws_connect(f"ws://127.0.0.1:{port}{P.WS_PATH}")
        assert json.loads((await ws.receive()).data)["type"] == MsgType.READY
        await ws.send_str(P.start("short", text=SHORT, pace=True))  # finishes within the drain
        await ws.send_str(P.end("short"))
        await ws.send_str(P.start("long", text=LONG, pace=True))  # ~15 s of audio: cut at the deadline
        await ws.send_str(P.end("long"))
        resp = await session.post(http + P.HTTP_TTS_PATH, json={"text": LONG, "pace": True})
        assert resp.status == 200
        await resp.content.readany()
        reading = asyncio.ensure_future(_read_ws(ws))
        await asyncio.sleep(0.3)

        t_sig = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        for _ in range(40):  # "at once": the first poll after the signal is handled, bounded generously
            status, ready = await _readyz(session, http)
            if status == 503:
                break
            await asyncio.sleep(0.05)
        assert time.monotonic() - t_sig < 2.0
        assert status == 503 and ready["draining"] is True and ready["ready"] is False
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:  # no new connection during the drain
            await session.ws_connect(f"ws://127.0.0.1:{port}{P.WS_PATH}")
        assert refused.value.status == 503
        await ws.send_str(P.start("new", text="Hello.", pace=True))  # nor a new context on a live one

        truncated = False
        try:
            async for _ in resp.content.iter_any():
                pass
        except aiohttp.ClientPayloadError:
            truncated = True
        http_end = time.monotonic() - t_sig
        seen, frames = await asyncio.wait_for(reading, drain_s + 10)
        closed_after = time.monotonic() - t_sig
        rc = await asyncio.wait_for(proc.wait(), 10)
        exited_after = time.monotonic() - t_sig

    by_ctx = {(m.get("context_id"), m["type"], m.get("code")) for m in seen}
    notice = next(m for m in seen if m["type"] == MsgType.DRAINING)
    assert notice["retry_after_ms"] > 0 and 0 < notice["deadline_ms"] <= 1000 * drain_s
    assert ("short", MsgType.DONE, None) in by_ctx  # a live context finished
    refusal = next(m for m in seen if m.get("context_id") == "new")
    assert refusal["code"] == ErrorCode.DRAINING and refusal["retry_after_ms"] > 0 and refusal["context_ended"]
    cut = next(m for m in seen if m.get("context_id") == "long" and m["type"] == MsgType.ERROR)
    assert cut["code"] == ErrorCode.SHUTTING_DOWN and cut["context_ended"] is True
    assert not any(m.get("context_id") == "long" and m["type"] == MsgType.DONE for m in seen)
    assert frames > 0 and ws.close_code == CloseCode.GOING_AWAY
    assert truncated and drain_s - 0.5 < http_end < drain_s + 3  # the client sees the truncation
    assert drain_s - 0.5 < closed_after < drain_s + 3
    assert rc == 0 and exited_after < drain_s + 5


async def test_second_sigterm_stops_at_once_and_the_key_comes_from_a_file(tmp_path: Path) -> None:
    key_file = tmp_path / "api-key"
    key_file.write_text(API_KEY + "\n")
    async with serve_process("--api-key-file", str(key_file)) as (proc, port), aiohttp.ClientSession() as session:
        cmdline = await asyncio.to_thread(Path(f"/proc/{proc.pid}/cmdline").read_bytes)
        assert API_KEY.encode() not in cmdline  # the key is not in the process list
        url = f"ws://127.0.0.1:{port}{P.WS_PATH}"
        with pytest.raises(aiohttp.WSServerHandshakeError):
            await session.ws_connect(url)
        ws = await session.ws_connect(url, headers=AUTH)
        await ws.receive()
        await ws.send_str(P.start("long", text=LONG, pace=True))  # keeps the (30 s) drain busy
        await ws.receive()  # started
        proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.5)
        assert proc.returncode is None  # draining, not gone
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(proc.wait(), 10)
        assert time.monotonic() - t0 < 4.0
        await ws.close()
    assert rc == 0


async def test_admin_drain_needs_the_admin_key_and_runs_the_same_drain(engine: PiperEngine) -> None:
    config = ServerConfig(api_key=API_KEY, admin_key=ADMIN_KEY, drain_timeout_s=30.0)
    async with (
        running_server(engine, config=config) as srv,
        raw_connection(srv.ws_url, headers=AUTH) as conn,
        aiohttp.ClientSession() as session,
    ):
        drain_url = srv.http_url + P.ADMIN_DRAIN_PATH
        async with session.post(drain_url) as resp:
            assert resp.status == 401
        async with session.post(drain_url, headers=AUTH) as resp:  # the client key is not enough
            assert resp.status == 403
        async with session.post(drain_url, headers=ADMIN, json={"timeout_s": "soon"}) as resp:
            assert resp.status == 400
        assert not srv.server.draining
        await conn.send(P.start("idle", pace=True))  # never gets text: live until the deadline
        await conn.expect(MsgType.STARTED, context_id="idle")
        await conn.send(P.start("talk", text="Just a moment.", pace=False))  # finishes well within the drain
        await conn.send(P.end("talk"))
        async with session.post(drain_url, headers=ADMIN, json={"timeout_s": 4}) as resp:
            assert resp.status == 202
            body = await resp.json()
        assert body["draining"] is True and 0 < body["deadline_ms"] <= 4000 and body["active_streams"] == 2
        notice = await conn.expect(MsgType.DRAINING)
        assert notice["retry_after_ms"] > 0
        async with session.post(srv.http_url + P.HTTP_TTS_PATH, headers=AUTH, json={"text": "Hi."}) as resp:
            assert resp.status == 503 and (await resp.json())["error"]["code"] == ErrorCode.DRAINING
            assert int(resp.headers["Retry-After"]) >= 1
        await conn.expect(MsgType.DONE, context_id="talk", timeout=10)
        cut = await conn.expect(MsgType.ERROR, context_id="idle", timeout=5)
        assert cut["code"] == ErrorCode.SHUTTING_DOWN
        await asyncio.wait_for(srv.server.drained.wait(), 5)
        for _ in range(100):
            if conn.closed:
                break
            await asyncio.sleep(0.05)
        assert conn.closed and conn.ws.close_code == CloseCode.GOING_AWAY
        assert srv.synth.scheduler.active == 0


async def test_admin_drain_is_off_without_an_admin_key(engine: PiperEngine) -> None:
    async with running_server(engine) as srv, aiohttp.ClientSession() as session:
        async with session.post(srv.http_url + P.ADMIN_DRAIN_PATH) as resp:
            assert resp.status == 403 and "admin key" in (await resp.json())["error"]["message"]
        assert not srv.server.draining


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # the subprocess must not inherit a drain timeout or key from the developer's shell
    for name in (
        "STREAMVOX_DRAIN_TIMEOUT",
        "STREAMVOX_API_KEY",
        "STREAMVOX_API_KEY_FILE",
        "STREAMVOX_ADMIN_KEY",
        "STREAMVOX_ADMIN_KEY_FILE",
        "STREAMVOX_ACCESS_LOG",
        "STREAMVOX_REQUIRE_API_KEY",
    ):
        monkeypatch.delenv(name, raising=False)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
