"""Issue 22, part 6: the admin credential is not the client key, and keys stay out of logs.

``/v1/admin/*`` takes only the admin key, from the ``Authorization`` header; the client key (every
agent holds it) gets a 403 that says so; without an admin key the endpoints are off and the refusal
says how to turn them on. The access log writes ``?token=`` / ``?api_key=`` values as ``***``: a
browser's WebSocket cannot send a header, so its key travels in the URL.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from support.tts_helpers import API_KEY, on_loopback, running_server
from tests.tts_service.test_hardening_drain import serve_process
from tts_service import protocol as P
from tts_service.cli import main
from tts_service.piper.engine import PiperEngine
from tts_service.protocol import ErrorCode
from tts_service.server import ServerConfig, redact_query

ADMIN_KEY = "adm1n-key-0123456789"


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _post(session: aiohttp.ClientSession, url: str, **kwargs) -> tuple[int, dict]:
    async with session.post(url, **kwargs) as resp:
        return resp.status, await resp.json()


async def test_admin_endpoints_take_the_admin_key_only(engine: PiperEngine) -> None:
    config = ServerConfig(api_key=API_KEY, admin_key=ADMIN_KEY, drain_timeout_s=5.0)
    async with running_server(engine, config=config) as srv, aiohttp.ClientSession() as session:
        drain = srv.http_url + P.ADMIN_DRAIN_PATH
        refusals = []
        status, body = await _post(session, drain, headers=_bearer(API_KEY))
        refusals.append(body)
        assert status == 403 and body["error"]["code"] == ErrorCode.UNAUTHORIZED
        assert "client API key" in body["error"]["message"] and "admin key" in body["error"]["message"]
        status, body = await _post(session, drain)
        refusals.append(body)
        assert status == 401 and "admin key" in body["error"]["message"]
        encoded = srv.http_url + "/v1/%61dmin/drain"  # routed as /v1/admin/drain: guarded the same
        status, body = await _post(session, encoded, headers=_bearer(API_KEY))
        assert status == 403
        status, body = await _post(session, drain, headers=_bearer("wrong"))
        refusals.append(body)
        assert status == 401
        status, body = await _post(session, f"{drain}?token={ADMIN_KEY}")  # never from the URL
        refusals.append(body)
        assert status == 401 and "never the URL" in body["error"]["message"]
        assert not any(key in str(refusals) for key in (ADMIN_KEY, API_KEY))  # no key echoed back
        assert not srv.server.draining
        # the admin key is not a client key either: each opens only its own door
        async with session.get(srv.http_url + "/v1/voices", headers=_bearer(ADMIN_KEY)) as resp:
            assert resp.status == 401
        async with session.get(srv.http_url + "/v1/voices", headers=_bearer(API_KEY)) as resp:
            assert resp.status == 200
        status, body = await _post(session, drain, headers=_bearer(ADMIN_KEY), json={"timeout_s": 1})
        assert status == 202 and body["draining"] is True
        assert srv.server.draining


async def test_without_an_admin_key_admin_is_off_and_says_how_to_turn_it_on(engine: PiperEngine) -> None:
    async with (
        running_server(engine, config=ServerConfig(api_key=API_KEY)) as srv,
        aiohttp.ClientSession() as session,
    ):
        status, body = await _post(session, srv.http_url + P.ADMIN_DRAIN_PATH, headers=_bearer(API_KEY))
        assert status == 403 and body["error"]["code"] == ErrorCode.UNAUTHORIZED
        message = body["error"]["message"]
        assert "admin endpoints are off" in message and "STREAMVOX_ADMIN_KEY" in message
        assert not srv.server.draining


@pytest.mark.parametrize(
    ("path_qs", "shown"),
    [
        ("/v1/stream?token=abc", "/v1/stream?token=***"),
        (
            "/tts/websocket?cartesia_version=2024-06-10&api_key=abc",
            "/tts/websocket?cartesia_version=2024-06-10&api_key=***",
        ),
        ("/v1/stream?TOKEN=abc&token=def", "/v1/stream?TOKEN=***&token=***"),
        ("/v1/voices?x=1", "/v1/voices?x=1"),  # nothing to hide: the line as it came
        ("/v1/voices", "/v1/voices"),
    ],
)
def test_redact_query(path_qs: str, shown: str) -> None:
    assert redact_query(path_qs) == shown


def test_require_api_key_refuses_to_serve_open(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("STREAMVOX_API_KEY", "STREAMVOX_API_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STREAMVOX_REQUIRE_API_KEY", "1")  # as the image sets it
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert "no API key given" in err and "STREAMVOX_API_KEY_FILE" in err and "Traceback" not in err


def test_the_admin_key_must_differ_from_the_client_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "key").write_text(API_KEY)
    assert main(["serve", "--api-key-file", str(tmp_path / "key"), "--admin-key", API_KEY]) == 2
    assert "admin key must differ" in capsys.readouterr().err
    (tmp_path / "empty").write_text("\n")
    assert main(["serve", "--admin-key-file", str(tmp_path / "empty")]) == 2
    assert "--admin-key-file" in capsys.readouterr().err


async def test_served_admin_key_from_a_file_and_an_access_log_without_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("STREAMVOX_API_KEY", "STREAMVOX_API_KEY_FILE", "STREAMVOX_ADMIN_KEY", "STREAMVOX_ADMIN_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "api").write_text(API_KEY + "\n")
    (tmp_path / "admin").write_text(ADMIN_KEY + "\n")
    args = ("--api-key-file", str(tmp_path / "api"), "--admin-key-file", str(tmp_path / "admin"))
    async with (
        serve_process(*args, "--access-log", "--log-level", "INFO") as (proc, port),
        aiohttp.ClientSession() as session,
    ):
        http = f"http://127.0.0.1:{port}"
        async with session.get(f"{http}/v1/voices?token={API_KEY}") as resp:
            assert resp.status == 200
        async with session.get(f"{http}/tts/websocket?api_key={API_KEY}") as resp:  # Cartesia's shape
            assert resp.status != 401
        status, _ = await _post(session, http + P.ADMIN_DRAIN_PATH, headers=_bearer(API_KEY))
        assert status == 403
        status, _ = await _post(session, http + P.ADMIN_DRAIN_PATH, headers=_bearer(ADMIN_KEY))
        assert status == 202
        rc = await asyncio.wait_for(proc.wait(), 20)  # nothing live: the drain ends at once
        err = (await proc.stderr.read()).decode(errors="replace")
    assert rc == 0, err[-2000:]
    access = [line for line in err.splitlines() if "streamvox.access" in line]
    assert any("/v1/voices?token=***" in line and '" 200 ' in line for line in access), err[-2000:]
    assert any("/tts/websocket?api_key=***" in line for line in access), access
    assert any(P.ADMIN_DRAIN_PATH in line and '" 403 ' in line for line in access), access
    assert API_KEY not in err and ADMIN_KEY not in err


async def test_clients_send_the_key_in_a_header_not_the_url() -> None:
    """TTSClient (so the LiveKit plug-in) and the bench's connection: the key goes in
    ``Authorization``, never in the URL a proxy would log."""
    from bench.wire import Conn, WireError
    from tts_service.client import TTSClient, TTSConnectionError

    seen: list[tuple[str, str]] = []

    async def refuse(request: aiohttp.web.Request) -> aiohttp.web.Response:
        seen.append((request.path_qs, request.headers.get("Authorization", "")))
        return aiohttp.web.Response(status=401)

    app = aiohttp.web.Application()
    app.router.add_get(P.WS_PATH, refuse)
    async with on_loopback(app) as (ws_url, _http):
        client = TTSClient(ws_url, api_key=API_KEY, connect_attempts=1)
        with pytest.raises(TTSConnectionError):
            await client.connect()
        await client.close()
        conn = Conn(ws_url, api_key=API_KEY)
        with pytest.raises(WireError, match="401"):
            await conn.connect(timeout=5)
        await conn.close()
    assert seen == [(P.WS_PATH, f"Bearer {API_KEY}")] * 2
