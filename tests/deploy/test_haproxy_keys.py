"""The shipped haproxy.cfg keeps keys out of its log and admin requests away from the replicas.

HAProxy runs the shipped config (addresses rewritten to loopback, as in test_haproxy_e2e.py) in
front of a stand-in backend that records what reaches it: no TTS work is needed to read a log
line, so this stays cheap. A browser's WebSocket sends its key as ``?token=``; the log line must
not hold it, and ``/v1/admin/*`` (in any spelling the server would route) never reaches a
replica through the balancer.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil

import aiohttp
import pytest
from aiohttp import web

from support.tts_helpers import on_loopback
from tests.deploy.test_haproxy_e2e import CFG, local_config
from tts_service.localproc import free_port

HAPROXY = shutil.which("haproxy")
SECRET = "k3y-that-must-not-be-logged"

pytestmark = pytest.mark.skipif(HAPROXY is None, reason="haproxy is not installed (apt-get install haproxy)")


def test_the_log_format_has_no_query_string_and_no_captured_header() -> None:
    cfg = CFG.read_text()
    (fmt,) = re.findall(r"^\s*log-format (.+)$", cfg, re.M)
    assert not re.search(r"%\{[^}]*\}?r\b|%r\b|%HU\b|%HQ\b|%hr\b|%hrl\b", fmt), fmt  # request line, URI, query, headers
    assert "%HPO" in fmt
    assert not re.search(r"^\s*option httplog", cfg, re.M), "httplog's format logs the whole request line"
    assert not re.search(r"^\s*(http-request )?capture request header", cfg, re.M | re.I)


async def test_a_query_token_is_not_logged_and_admin_is_refused(tmp_path) -> None:
    seen: list[str] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(request.path_qs)
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    async with on_loopback(app) as (_ws, http):
        backend = int(http.rsplit(":", 1)[1])
        front = free_port()
        cfg = tmp_path / "haproxy.cfg"
        cfg.write_text(local_config(front, [(backend, free_port())]))  # no agent: its weight stays
        proc = await asyncio.create_subprocess_exec(
            HAPROXY, "-db", "-f", str(cfg), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        url = f"http://127.0.0.1:{front}"
        try:
            async with aiohttp.ClientSession() as session:
                for _ in range(100):  # haproxy is listening
                    with contextlib.suppress(aiohttp.ClientError):
                        async with session.get(f"{url}/v1/voices?token={SECRET}") as resp:
                            if resp.status == 200:
                                break
                    await asyncio.sleep(0.1)
                assert resp.status == 200
                refused = []
                for path in ("/v1/admin/drain", "/v1/%61dmin/drain", "/V1/ADMIN/drain"):
                    async with session.post(f"{url}{path}", headers={"Authorization": f"Bearer {SECRET}"}) as resp:
                        refused.append((resp.status, (await resp.json()).get("error", {}).get("code")))
            await asyncio.sleep(0.3)  # the log line is written when the response is done
        finally:
            proc.terminate()
            out = (await asyncio.wait_for(proc.communicate(), 10))[0].decode(errors="replace")
    assert refused == [(403, "unauthorized")] * 3
    assert not any("admin" in p.lower() or "%61dmin" in p for p in seen), seen
    lines = [line for line in out.splitlines() if "/v1/voices" in line]
    assert lines and all(" 200 " in line for line in lines), out[-2000:]
    assert SECRET not in out, out[-2000:]
    assert "ALERT" not in out, out[-2000:]
