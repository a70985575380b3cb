"""Issue 13 over a real loopback socket with the real voice: the races, floods and bad input
real agents produce. Nothing stale is spoken, nothing leaks, no connection is cut unannounced.

Drain on shutdown is in ``test_hardening_drain.py``, the random-sequence property in
``test_hardening_fuzz.py``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading

import aiohttp
import pytest

from support.hardening_helpers import NonReadingPeer, strict_json
from support.tts_helpers import (
    API_KEY,
    NO_ADMISSION_LIMIT,
    RunningServer,
    eventually,
    raw_connection,
    running_server,
)
from tts_service import protocol as P
from tts_service import ws as ws_module
from tts_service.piper.engine import PiperEngine
from tts_service.piper.scheduler import PiperSchedulerOptions
from tts_service.protocol import CloseCode, ErrorCode, Limits, MsgType
from tts_service.server import ServerConfig

LONG = (
    "And then we can talk about the weather for a while. It will be sunny and warm all day long by the sea, "
    "with a light breeze in the afternoon and a clear sky at night."
)
SHORT = "Thank you for calling."


def _connection(srv: RunningServer) -> ws_module.Connection:
    (conn,) = srv.server._connections
    return conn


# ---------------------------------------------------------------- 1. finished ids stay finished


async def test_late_tokens_after_cancel_never_speak_nor_leak(engine: PiperEngine) -> None:
    limits = Limits(max_contexts=4)
    async with running_server(engine, config=ServerConfig(limits=limits)) as srv, raw_connection(srv.ws_url) as conn:
        await conn.send(P.start("turn", text=LONG, pace=True))
        first = await conn.expect(MsgType.STARTED, context_id="turn")
        await conn.expect(MsgType.WORDS, context_id="turn")  # it is speaking
        await conn.send(P.cancel("turn"))
        await conn.expect(MsgType.CANCELLED, context_id="turn")
        mark = len(conn.log)
        # the barge-in race: the LLM's tokens for the cancelled turn are still in flight
        for token in ("and then ", "we can ", "talk about the weather. "):
            await conn.send(P.text("turn", token))
        await conn.send(P.flush("turn"))
        await conn.send(P.end("turn"))
        # 20 more turns cancelled with a late token each: five times max_contexts
        for i in range(20):
            await conn.send(P.start(f"z{i}", pace=True))
            await conn.send(P.cancel(f"z{i}"))
            await conn.send(P.text(f"z{i}", "late words. "))
        await conn.ping_pong("after-late")
        await asyncio.sleep(0.5)  # time for a wrongly started stream to produce audio
        late = conn.log[mark:]
        assert [ev for ev in late if ev.msg is None] == []  # not one frame
        assert [ev.msg for ev in late if ev.type == MsgType.ERROR] == []  # dropped silently
        assert not [ev for ev in late if ev.type == MsgType.STARTED and ev.msg["context_id"] == "turn"]
        assert srv.synth.scheduler.active == 0 and _connection(srv).contexts == {}
        assert _connection(srv).late_dropped == 25
        # an explicit start reuses the id, and max_contexts was never exhausted
        started, frames, _, done = await conn.speak("turn", SHORT, pace=False)
        assert started["stream"] != first["stream"] and frames and done["frames"] == len(frames)
    await eventually(lambda: srv.synth.scheduler.active == 0)


async def test_late_messages_after_done_or_refusal_get_one_error(live: RunningServer) -> None:
    async with raw_connection(live.ws_url) as conn:
        await conn.speak("d", "Done now.", pace=False)
        await conn.send(P.start("v", voice="nobody"))  # refused at start
        await conn.expect(MsgType.ERROR, context_id="v")
        mark = len(conn.log)
        for cid in ("d", "v"):
            await conn.send(P.text(cid, "late words. "))
            await conn.send(P.text(cid, "more late words. "))
            await conn.send(P.end(cid))
        await conn.ping_pong("after-late")
        await asyncio.sleep(0.5)
        late = conn.log[mark:]
        assert [ev for ev in late if ev.msg is None] == []
        assert not [ev for ev in late if ev.type == MsgType.STARTED]
        errors = [ev.msg for ev in late if ev.type == MsgType.ERROR]
        # "d" gets exactly one error saying it ended; "v" was already told when it was refused
        assert [(e["context_id"], e["code"], e["context_ended"]) for e in errors] == [
            ("d", ErrorCode.BAD_REQUEST, True)
        ]
        assert "start" in errors[0]["message"]
        _, frames, _, _ = await conn.speak("d", SHORT, pace=False)  # a fresh start works
        assert frames


async def test_tombstones_are_bounded(live: RunningServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ws_module, "TOMBSTONES", 8)
    async with raw_connection(live.ws_url) as conn:
        for i in range(30):
            await conn.send(P.cancel(f"c{i}"))
        await conn.ping_pong()
        (server_conn,) = [c for c in live.server._connections if len(c.ended) > 0]
        assert list(server_conn.ended) == [f"c{i}" for i in range(22, 30)]


# ---------------------------------------------------------------- 3. size limits that answer


async def test_a_1mb_message_is_answered_next_to_a_live_context(live: RunningServer) -> None:
    async with raw_connection(live.ws_url) as conn:
        await conn.send(P.start("live", text=LONG + " " + LONG, pace=True))
        started = await conn.expect(MsgType.STARTED, context_id="live")
        await conn.expect(MsgType.WORDS, context_id="live")
        big = "x" * 1_000_000
        await conn.send(P.text("big", big))
        err = await conn.expect(MsgType.ERROR, context_id="big")
        assert err["code"] == ErrorCode.TEXT_TOO_LONG
        await conn.send(json.dumps({"type": "text", "context_id": "live", "text": big}))
        err = await conn.expect(MsgType.ERROR, context_id="live")
        assert err["code"] == ErrorCode.TEXT_TOO_LONG and err["context_ended"] is False
        await conn.send("[" * 1_000_000)  # deep nesting
        assert (await conn.expect(MsgType.ERROR))["code"] == ErrorCode.BAD_REQUEST
        await conn.send(b"\x00" * 1_000_000)  # a 1 MB binary frame
        assert (await conn.expect(MsgType.ERROR))["code"] == ErrorCode.BAD_REQUEST
        frames_then = sum(1 for ev in conn.log if ev.stream == started["stream"])
        await eventually(lambda: sum(1 for ev in conn.log if ev.stream == started["stream"]) > frames_then)
        await conn.send(P.cancel("live"))
        await conn.expect(MsgType.CANCELLED, context_id="live")
        assert not conn.closed


async def test_beyond_the_cap_the_connection_closes_with_1009_and_a_reason(live: RunningServer) -> None:
    cap = Limits().message_cap()
    assert cap >= 1_000_000
    async with aiohttp.ClientSession() as session, session.ws_connect(live.ws_url) as ws:
        await ws.receive()  # ready
        await ws.send_str(P.text("huge", "x" * (cap + 1)))
        msg = await ws.receive(timeout=10)
        while msg.type == aiohttp.WSMsgType.TEXT:  # nothing should come first, but be exact about the close
            msg = await ws.receive(timeout=10)
        assert msg.type == aiohttp.WSMsgType.CLOSE
        assert msg.data == CloseCode.TOO_BIG
        assert str(cap) in msg.extra and "limit" in msg.extra


# ---------------------------------------------------------------- 4. bounded queues

FLOOD_CAP = 2_000_000  # pings; the server closes a non-reading peer long before (a few thousand here)


async def test_a_peer_that_never_reads_is_closed_and_others_are_untouched(
    engine: PiperEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ws_module, "CLOSE_WAIT_S", 3.0)  # the peer reads its backlog within this
    async with running_server(engine) as srv, raw_connection(srv.ws_url) as neighbour:
        peer = await asyncio.to_thread(NonReadingPeer, srv.ws_url)  # blocking socket: off the server's loop
        ping = P.ping("x" * 200)  # each pong is ~230 bytes
        stop = threading.Event()

        # until the server gives up on the peer (then `stop`) or the socket fails: a fixed count
        # (40,000) was sometimes all sent before a loaded server's outbox filled (fresh-clone run)
        def flood() -> int:
            for i in range(FLOOD_CAP):
                if stop.is_set() or not peer.send_text(ping):
                    return i
            return FLOOD_CAP

        flooding = asyncio.ensure_future(asyncio.to_thread(flood))
        most_queued = 0
        try:
            async with asyncio.timeout(60):
                while not srv.synth.metrics.connections_closed.labels("not_reading")._value.get():
                    most_queued = max([most_queued, *(c.queued for c in srv.server._connections)])
                    await asyncio.sleep(0.01)
        finally:
            stop.set()
            sent = await flooding
        # the peer finally reads: its backlog of pongs, then the close frame with the code
        code = await asyncio.to_thread(peer.read_close_code)
        peer.close()
        assert most_queued <= ws_module.OUTBOX_MAX_MESSAGES
        assert sent < FLOOD_CAP  # stopped once the server gave up on it
        assert code == CloseCode.POLICY
        await eventually(lambda: len(srv.server._connections) == 1)
        # the neighbour is untouched and speaks normally
        _, frames, _, done = await neighbour.speak("n", SHORT, pace=False)
        assert frames and done["frames"] == len(frames)
        await neighbour.ping_pong()


# ---------------------------------------------------------------- 5. bad text, ping ids, auth, HTTP body


async def test_lone_surrogate_and_nul_are_bad_requests_without_a_traceback(
    live: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tts_service")
    async with raw_connection(live.ws_url) as conn:
        for i, raw in enumerate(('"a \\ud800 b. "', '"a \\u0000 b. "', '"\\udfff"')):
            await conn.send(f'{{"type":"start","context_id":"s{i}","pace":false,"text":{raw}}}')
            await conn.send(P.end(f"s{i}"))
            await conn.send(f'{{"type":"text","context_id":"t{i}","text":{raw}}}')
        await conn.send('{"type":"start","context_id":"\\ud800"}')
        await conn.ping_pong()
        await asyncio.sleep(0.3)
        errors = [ev.msg for ev in conn.log if ev.type == MsgType.ERROR]
    assert [e["code"] for e in errors] == [ErrorCode.BAD_REQUEST] * 7
    assert sum("surrogate" in e["message"] for e in errors) == 5 and sum("NUL" in e["message"] for e in errors) == 2
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert live.synth.scheduler.active == 0
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            live.http_url + P.HTTP_TTS_PATH,
            data=b'{"text": "a \\ud800 b."}',
            headers={"Content-Type": "application/json"},
        ) as resp,
    ):
        assert resp.status == 400 and (await resp.json())["error"]["code"] == ErrorCode.BAD_REQUEST


@pytest.mark.parametrize(
    "raw_id", ["1e400", "-1e400", "NaN", "-Infinity", "Infinity", "9" * 5000, '"' + "x" * 2000 + '"']
)
async def test_unsendable_ping_ids_get_a_strict_json_error(live: RunningServer, raw_id: str) -> None:
    async with aiohttp.ClientSession() as session, session.ws_connect(live.ws_url) as ws:
        await ws.receive()
        await ws.send_str(f'{{"type":"ping","id":{raw_id}}}')
        reply = strict_json((await ws.receive(timeout=5)).data)  # never NaN/Infinity on the wire
        assert reply["type"] == MsgType.ERROR and reply["code"] == ErrorCode.BAD_REQUEST
        assert "not valid JSON" not in reply["message"] or raw_id in ("NaN", "-Infinity", "Infinity")
        await ws.send_str(P.ping(7))
        assert strict_json((await ws.receive(timeout=5)).data) == {"type": "pong", "id": 7}


async def test_ping_ids_that_can_be_echoed_are(live: RunningServer) -> None:
    big = int("9" * 300)
    async with raw_connection(live.ws_url) as conn:
        for ping_id in (big, 1.5e300, -0.0, "é", None, [1, {"a": True}]):
            await conn.ping_pong(ping_id)


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer"])
async def test_the_auth_scheme_is_case_insensitive(keyed: RunningServer, scheme: str) -> None:
    headers = {"Authorization": f"{scheme} {API_KEY}"}
    async with raw_connection(keyed.ws_url, headers=headers) as conn:
        await conn.ping_pong()
    async with aiohttp.ClientSession() as session:
        async with session.get(keyed.http_url + "/v1/voices", headers=headers) as resp:
            assert resp.status == 200
        async with session.get(keyed.http_url + "/v1/voices", headers={"Authorization": f"Basic {API_KEY}"}) as resp:
            assert resp.status == 401


async def test_a_too_large_http_body_gets_the_json_413(live: RunningServer) -> None:
    body = json.dumps({"text": "a" * 3_000_000}).encode()
    async with (
        aiohttp.ClientSession() as session,
        session.post(live.http_url + P.HTTP_TTS_PATH, data=body, headers={"Content-Type": "application/json"}) as resp,
    ):
        assert resp.status == 413
        assert resp.headers["Content-Type"].startswith("application/json")
        reason = (await resp.json())["error"]
    assert reason["code"] == ErrorCode.TEXT_TOO_LONG and str(Limits().message_cap()) in reason["message"]


# ---------------------------------------------------------------- 7. the load figure


async def test_load_in_0_to_1_on_readyz_and_metrics(engine: PiperEngine) -> None:
    options = PiperSchedulerOptions(max_streams=2, capacity=NO_ADMISSION_LIMIT)
    async with (
        running_server(engine, options=options) as srv,
        raw_connection(srv.ws_url) as conn,
        aiohttp.ClientSession() as session,
    ):

        async def figures() -> tuple[int, dict, float]:
            async with session.get(srv.http_url + "/readyz") as resp:
                ready = await resp.json()
                status = resp.status
            async with session.get(srv.http_url + "/metrics") as resp:
                m = re.search(r"^streamvox_load (\S+)$", await resp.text(), re.MULTILINE)
            assert m, "streamvox_load missing from /metrics"
            return status, ready, float(m.group(1))

        status, ready, metric = await figures()
        assert (status, ready["load"], metric) == (200, 0.0, 0.0)
        await conn.send(P.start("a", text=LONG, pace=True))
        await conn.expect(MsgType.WORDS, context_id="a")
        status, ready, metric = await figures()
        assert (status, ready["load"], metric) == (200, 0.5, 0.5)
        assert ready["busy_streams"] == 1 and ready["capacity_streams"] == 2 and ready["draining"] is False
        await conn.send(P.start("b", text=LONG, pace=True))
        await conn.expect(MsgType.WORDS, context_id="b")
        status, ready, metric = await figures()
        assert (status, ready["load"], metric) == (503, 1.0, 1.0)
        for cid in ("a", "b"):
            await conn.send(P.cancel(cid))
            await conn.expect(MsgType.CANCELLED, context_id=cid)


# ---------------------------------------------------------------- the wire format's side of it


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ('{"type":"ping","id":NaN}', "NaN is not valid JSON"),
        ('{"type":"ping","id":1e999}', "out of range"),
        ('{"type":"ping","id":' + "1" * 4301 + "}", "4301 digits"),
        ('{"type":"text","context_id":"a","text":"\\u0000"}', "NUL"),
        ('{"type":"start","context_id":"a","text":"x\\udc00y"}', "lone surrogate (\\udc00) at position 1"),
        ('{"type":"ping","id":"' + "x" * 1100 + '"}', "at most 1024"),
    ],
)
def test_parse_refuses_what_cannot_be_answered_in_strict_json(raw: str, fragment: str) -> None:
    with pytest.raises(P.ProtocolError) as info:
        P.parse_client_message(raw)
    assert info.value.code == ErrorCode.BAD_REQUEST and fragment in info.value.message
    assert info.value.msg_type in (None, "ping", "text", "start")


def test_a_valid_surrogate_pair_and_big_numbers_within_bounds_are_fine() -> None:
    msg = P.parse_client_message('{"type":"text","context_id":"a","text":"\\ud83d\\ude00 ok"}')
    assert msg.text == "😀 ok"
    assert P.parse_client_message('{"type":"ping","id":' + "7" * 300 + "}").ping_id == int("7" * 300)
    with pytest.raises(ValueError):
        P.pong(float("nan"))  # never NaN on the wire, even if a caller gets one past the parser
    assert Limits(max_text_chars=1_000_000).message_cap() == 12 * 1_000_000 + 4096


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--api-key-file", "/nonexistent/key"], "cannot read --api-key-file"),
        (["--drain-timeout", "-1"], "--drain-timeout must be >= 0"),
    ],
)
def test_serve_option_errors_are_one_line(
    args: list[str], fragment: str, capsys: pytest.CaptureFixture, tmp_path
) -> None:
    from tts_service.cli import main

    assert main(["serve", *args]) == 2
    assert fragment in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.write_text("\n")
    assert main(["serve", "--api-key-file", str(empty)]) == 2
    assert "is empty" in capsys.readouterr().err


def test_the_first_cut_is_a_serve_option(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """``--first-cut-ms`` reaches the scheduler (an operator with a slow LLM lowers it); a bad value
    is a one-line usage error, not a traceback."""
    from tts_service.cli import build_parser
    from tts_service.piper import serve
    from tts_service.piper.scheduler import PiperSchedulerOptions

    built: list[PiperSchedulerOptions] = []
    monkeypatch.setattr(serve, "load_piper_engine", lambda *a, **k: "engine")
    monkeypatch.setattr(serve, "synthesizer", lambda engine, *, options, metrics: built.append(options))
    default = PiperSchedulerOptions().first_cut_s
    for argv, expected in ((["serve"], default), (["serve", "--first-cut-ms", "250"], 0.25)):
        serve.build(build_parser().parse_args(argv))
        assert built[-1].first_cut_s == expected
    for bad in ("0", "abc", "9000"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "--first-cut-ms", bad])
        err = capsys.readouterr().err
        assert "--first-cut-ms" in err and "Traceback" not in err
