"""The demo room as a bounded resource: junk builds nothing, the N+1st call is refused, every
half-open thing is reaped, and foreign pages and hosts are turned away (issue 22, parts 1-2).

Driven over loopback against the real room app (``pipelines.pipecat_agent.room_app`` under
uvicorn), the real TTS server and a scripted LLM; the WebRTC caller is aiortc.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import uuid

import aiohttp
import pytest
import websockets

from pipelines.room_limits import Refusal, RoomLimits, check_offer, host_name, twilio_signature
from support.pipecat_harness import counting_server, fake_llm, room_server

# ---------------------------------------------------------------- the rules alone


def test_hosts_and_origins_default_to_the_page_on_loopback():
    limits = RoomLimits()
    for host in ("localhost:7860", "127.0.0.1:7860", "[::1]:7860", "localhost"):
        limits.check_host(host)
        limits.check_origin(None, host)
        limits.check_origin(f"http://{host}", host)
    for host in ("evil.example", "evil.example:7860", "localhost.evil.example:7860", None):
        with pytest.raises(Refusal, match="STREAMVOX_ALLOWED_HOSTS"):
            limits.check_host(host)
    for origin in ("https://evil.example", "http://localhost:9999", "null", "file://"):
        with pytest.raises(Refusal, match="STREAMVOX_ALLOWED_ORIGINS"):
            limits.check_origin(origin, "localhost:7860")
    assert host_name("[::1]:7860") == "::1" and host_name("Example.COM:80") == "example.com"


def test_settings_allow_more_and_bad_ones_are_one_line():
    env = {
        "STREAMVOX_ALLOWED_HOSTS": "abc.ngrok.app, 192.168.1.5",
        "STREAMVOX_ALLOWED_ORIGINS": "https://app.example",
        "STREAMVOX_MAX_CALLS": "3",
    }
    limits = RoomLimits.from_env(env, bind_host="demo.lan")
    assert limits.max_calls == 3
    for host in ("abc.ngrok.app", "192.168.1.5:7860", "demo.lan:7860"):
        limits.check_host(host)
    limits.check_origin("https://app.example", "localhost:7860")
    assert RoomLimits.from_env({}).max_calls == max(1, os.cpu_count() or 1)
    for bad, message in [
        ({"STREAMVOX_MAX_CALLS": "0"}, "STREAMVOX_MAX_CALLS must be a whole number of calls"),
        ({"STREAMVOX_MAX_CALLS": "2.5"}, "STREAMVOX_MAX_CALLS must be a whole number"),
        ({"STREAMVOX_ALLOWED_ORIGINS": "app.example"}, "origins like https://app.example"),
        ({"STREAMVOX_TWILIO_SIGNATURE": "on"}, "needs TWILIO_AUTH_TOKEN"),
    ]:
        with pytest.raises(ValueError, match=message):
            RoomLimits.from_env(bad)


def test_twilio_signature_is_checked_when_a_token_is_set():
    # Twilio's documented example: this URL and POST parameters, signed with token 12345
    url = "https://mycompany.com/myapp.php?foo=1&bar=2"
    params = {"CallSid": "CA1234567890ABCDE", "Caller": "+12349013030", "Digits": "1234", "From": "+12349013030"}
    params["To"] = "+18005551212"
    assert twilio_signature("12345", url, params) == "0/KCTR6DLpKmkAf8muzZqo1nDgQ="
    limits = RoomLimits(twilio_auth_token="secret")
    good = twilio_signature("secret", "wss://abc.ngrok.app/ws")
    limits.check_twilio(good, "abc.ngrok.app", "/ws", "")
    for signature in (None, "", twilio_signature("other", "wss://abc.ngrok.app/ws")):
        with pytest.raises(Refusal):
            limits.check_twilio(signature, "abc.ngrok.app", "/ws", "")
    RoomLimits().check_twilio(None, "abc.ngrok.app", "/ws", "")  # no token: not required


def test_junk_offers_are_named():
    sdp = "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n"
    assert check_offer({"sdp": sdp, "type": "offer"})["sdp"] == sdp
    for junk, reason in [
        ([], "a JSON object"),
        ({"sdp": "x", "type": "offer"}, "starting 'v=0'"),
        ({"sdp": 12345, "type": "offer"}, "starting 'v=0'"),
        ({"sdp": sdp, "type": "answer"}, "expected type 'offer'"),
        ({"sdp": "v=0\r\ns=-\r\n", "type": "offer"}, "no audio section"),
        ({"sdp": sdp, "type": "offer", "pc_id": 7}, "pc_id must be"),
        ({"sdp": sdp, "type": "offer", "restart_pc": "yes"}, "restart_pc must be"),
    ]:
        with pytest.raises(Refusal, match=reason):
            check_offer(junk)


# ---------------------------------------------------------------- the real room


@contextlib.contextmanager
def _uvicorn_errors():
    """What uvicorn logs as errors meanwhile (its logger does not reach pytest's root handler)."""
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler, log = Keep(level=logging.ERROR), logging.getLogger("uvicorn.error")
    log.addHandler(handler)
    try:
        yield seen
    finally:
        log.removeHandler(handler)


SHORT = RoomLimits(
    max_calls=1,
    connect_timeout_s=1.5,
    ws_start_timeout_s=3.0,  # longer than opening max_waiting_sockets takes on a loaded CI machine
    max_waiting_sockets=20,
    max_sessions=8,
    max_body_bytes=16384,
)


@pytest.fixture(scope="module")
def engine():
    from tts_service.piper.serve import load_piper_engine

    return load_piper_engine([], progress=lambda *_: None)


async def _real_offer() -> tuple[object, dict]:
    """An aiortc caller's offer (audio), its connection left open (never given the answer)."""
    from aiortc import RTCPeerConnection

    from support.pipecat_harness import Microphone

    pc = RTCPeerConnection()
    pc.addTrack(Microphone())
    await pc.setLocalDescription(await pc.createOffer())
    return pc, {"sdp": pc.localDescription.sdp, "type": "offer"}


def _twilio_start() -> list[str]:
    sid = f"MZ{uuid.uuid4().hex}"
    start = {
        "streamSid": sid,
        "accountSid": "AC0",
        "callSid": f"CA{uuid.uuid4().hex}",
        "tracks": ["inbound"],
        "customParameters": {},
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
    }
    return [
        json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}),
        json.dumps({"event": "start", "sequenceNumber": "1", "start": start, "streamSid": sid}),
    ]


async def _health(http, base) -> dict:
    async with http.get(f"{base}/healthz") as resp:
        return await resp.json()


async def test_junk_builds_nothing_and_the_second_call_is_refused(engine):
    from pipelines.pipecat_agent import AgentConfig

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    async with counting_server(engine) as tts, fake_llm() as (llm_url, _requests):
        config = AgentConfig(tts_url=tts.ws_url, llm_base_url=llm_url, llm_model="fake", greeting=None, room=SHORT)
        async with room_server(config) as (base, agents), aiohttp.ClientSession() as http:
            ws_url = base.replace("http://", "ws://") + "/ws"
            tasks_before = len(asyncio.all_tasks())
            # junk: every one a 4xx with a reason, none builds an agent
            offer = f"{base}/api/offer"
            plain = {"Content-Type": "text/plain"}  # what a cross-site page may send without a preflight
            garbage = {"pc_id": "nope", "candidates": [{"candidate": "x", "sdp_mid": "0", "sdp_mline_index": 0}]}
            junk = [
                ("POST", offer, {"json": {"sdp": "x", "type": "offer"}}, 400),
                ("POST", offer, {"json": {"sdp": 12345, "type": "offer"}}, 400),
                ("POST", offer, {"json": {"sdp": "v=0\r\nm=audio 9 RTP 0\r\n", "type": "answer"}}, 400),
                ("POST", offer, {"data": '{"sdp": "x", "type": "offer"}', "headers": plain}, 415),
                ("POST", offer, {"data": b"{" * 40000, "headers": {"Content-Type": "application/json"}}, 413),
                ("POST", offer, {"data": "{nope", "headers": {"Content-Type": "application/json"}}, 400),
                ("PATCH", offer, {"json": garbage}, 400),
                ("PATCH", offer, {"json": {"pc_id": 5}}, 400),
                ("POST", f"{base}/start", {"data": "{}", "headers": plain}, 415),
                ("POST", f"{base}/sessions/{uuid.uuid4()}/api/offer", {"json": {}}, 404),
            ]
            for _ in range(20):
                for method, url, kw, status in junk:
                    async with http.request(method, url, **kw) as resp:
                        body = await resp.json()
                        assert resp.status == status, (url, kw, body)
                        assert body["error"] and "Traceback" not in body["error"]
            # idle phone sockets that never say `start`: closed after the deadline; past the cap, refused
            idle = [await websockets.connect(ws_url) for _ in range(SHORT.max_waiting_sockets)]
            with pytest.raises(websockets.InvalidStatus):
                await websockets.connect(ws_url)
            for ws in idle:
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await asyncio.wait_for(ws.recv(), 10)
                assert closed.value.rcvd.code == 1008 and "start" in closed.value.rcvd.reason
            health = await _health(http, base)
            assert agents == [] and health["calls"] == 0
            assert set(health["loop"]) == {"stalls", "worst_ms"}, health  # the room's loop watch (pipelines.loop_watch)
            # a caller who hangs up before its `start`: a refusal in the log, not a traceback
            with _uvicorn_errors() as errors:
                for _ in range(5):
                    gone = await websockets.connect(ws_url)
                    await gone.close()
                await asyncio.sleep(0.5)
            assert not [e for e in errors if "Exception in ASGI application" in e], errors

            # /start sessions are bounded: the oldest make room
            ids = []
            for _ in range(3 * SHORT.max_sessions):
                async with http.post(f"{base}/start", json={}) as resp:
                    ids.append((await resp.json())["sessionId"])
            async with http.post(f"{base}/sessions/{ids[0]}/api/offer", json={"sdp": "x", "type": "offer"}) as resp:
                assert resp.status == 404  # pruned
            async with http.post(f"{base}/sessions/{ids[-1]}/api/offer", json={"sdp": "x", "type": "offer"}) as resp:
                assert resp.status == 400  # known, the junk offer refused

            # one line: a real offer takes it, the next call is refused (HTTP 503, the phone: busy, hang-up)
            pc, real = await _real_offer()
            try:
                async with http.post(offer, json=real) as resp:
                    assert resp.status == 200 and (await resp.json())["type"] == "answer"
                await asyncio.sleep(0.2)
                assert len(agents) == 1 and (await _health(http, base))["calls"] == 1
                pc2, real2 = await _real_offer()
                async with http.post(offer, json=real2) as resp:
                    assert resp.status == 503 and "lines are busy" in (await resp.json())["error"]
                    assert resp.headers["Retry-After"]
                await pc2.close()
                async with http.post(f"{base}/start", json={}) as resp:
                    assert resp.status == 503
                async with http.get(f"{base}/readyz") as resp:
                    assert resp.status == 503 and (await resp.json())["full"] is True
                async with websockets.connect(ws_url) as ws:
                    for message in _twilio_start():
                        await ws.send(message)
                    media = b""
                    with pytest.raises(websockets.ConnectionClosed) as closed:
                        while True:
                            event = json.loads(await asyncio.wait_for(ws.recv(), 15))
                            if event["event"] == "media":
                                media += base64.b64decode(event["media"]["payload"])
                    assert closed.value.rcvd.code == 1013
                    assert len(media) / 8000 > 2.0  # "Sorry, all our lines are busy..." was spoken
                assert len(agents) == 1
                # the offer never connects (the caller never took the answer): reaped, the line is free again
                for _ in range(60):
                    if (await _health(http, base))["calls"] == 0:
                        break
                    await asyncio.sleep(0.1)
                assert (await _health(http, base))["calls"] == 0
            finally:
                await pc.close()
            await asyncio.sleep(0.3)
            assert len(asyncio.all_tasks()) <= tasks_before + 2  # nothing left behind by junk or the reaped call


async def test_foreign_pages_and_hosts_are_refused(engine):
    from pipelines.pipecat_agent import AgentConfig

    async with counting_server(engine) as tts, fake_llm() as (llm_url, _requests):
        config = AgentConfig(tts_url=tts.ws_url, llm_base_url=llm_url, llm_model="fake", greeting=None, room=SHORT)
        async with room_server(config) as (base, agents), aiohttp.ClientSession() as http:
            port = base.rsplit(":", 1)[1]
            ws_url = base.replace("http://", "ws://") + "/ws"
            evil = {"Origin": "https://evil.example"}
            async with http.post(f"{base}/start", json={}, headers=evil) as resp:
                assert resp.status == 403 and "STREAMVOX_ALLOWED_ORIGINS" in (await resp.json())["error"]
            async with http.post(f"{base}/api/offer", json={"sdp": "x", "type": "offer"}, headers=evil) as resp:
                assert resp.status == 403
            async with http.post(f"{base}/start", json={}, headers={"Host": f"evil.example:{port}"}) as resp:
                assert resp.status == 403 and "STREAMVOX_ALLOWED_HOSTS" in (await resp.json())["error"]
            async with http.get(f"{base}/", headers={"Host": "evil.example"}) as resp:
                assert resp.status == 403  # DNS rebinding: not even the page
            with pytest.raises(websockets.InvalidStatus) as refused:
                await websockets.connect(ws_url, origin="https://evil.example")
            assert refused.value.response.status_code == 403
            # our own page is welcome
            own = {"Origin": f"http://127.0.0.1:{port}"}
            async with http.post(f"{base}/start", json={}, headers=own) as resp:
                assert resp.status == 200
            assert agents == []


async def test_the_phone_socket_requires_twilios_signature_when_a_token_is_set(engine):
    from pipelines.pipecat_agent import AgentConfig

    limits = RoomLimits(max_calls=1, ws_start_timeout_s=0.5, twilio_auth_token="secret")
    async with counting_server(engine) as tts, fake_llm() as (llm_url, _requests):
        config = AgentConfig(tts_url=tts.ws_url, llm_base_url=llm_url, llm_model="fake", greeting=None, room=limits)
        async with room_server(config) as (base, agents):
            host = base.removeprefix("http://")
            ws_url = f"ws://{host}/ws"
            for headers in ({}, {"X-Twilio-Signature": twilio_signature("wrong", f"wss://{host}/ws")}):
                with pytest.raises(websockets.InvalidStatus) as refused:
                    await websockets.connect(ws_url, additional_headers=headers)
                assert refused.value.response.status_code == 403
            signed = {"X-Twilio-Signature": twilio_signature("secret", f"wss://{host}/ws")}
            async with websockets.connect(ws_url, additional_headers=signed) as ws:
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await asyncio.wait_for(ws.recv(), 5)  # accepted; no `start`: closed at the deadline
                assert closed.value.rcvd.code == 1008
            assert agents == []
