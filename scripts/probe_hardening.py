"""Black-box probe of the server defects of issue 13, one line of figures per defect.

Run it on a commit before and after the hardening to get the before -> after figures in
docs/BENCHMARKS.md:

    .venv/bin/python scripts/probe_hardening.py            # every probe (about 40 s on 2 cores)
    .venv/bin/python scripts/probe_hardening.py late sigterm

Everything goes over loopback sockets; only the non-reading-peer probe looks inside the
in-process server (how many messages wait in its outbox), because memory is what it is about.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time

import aiohttp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from support.hardening_helpers import NonReadingPeer, strict_json
from support.tts_helpers import raw_connection, running_server
from tts_service import protocol as P
from tts_service.localproc import free_port
from tts_service.piper.serve import load_piper_engine
from tts_service.server import ServerConfig

LONG = "And then we can talk about the weather. It will be sunny and warm all day long by the sea. " * 3


def report(name: str, **figures) -> None:
    print(f"{name}: " + ", ".join(f"{k}={v}" for k, v in figures.items()), flush=True)


async def readyz(http_url: str) -> dict:
    async with aiohttp.ClientSession() as s, s.get(http_url + "/readyz") as r:
        return await r.json()


async def probe_late(engine) -> None:
    async with running_server(engine) as srv, raw_connection(srv.ws_url) as conn:
        await conn.send(P.start("c", text=LONG, pace=True))
        first = await conn.expect(P.MsgType.STARTED, context_id="c")
        await conn.expect(P.MsgType.WORDS, context_id="c")
        await conn.send(P.cancel("c"))
        await conn.expect(P.MsgType.CANCELLED, context_id="c")
        mark = len(conn.log)
        for token in ("and then ", "we can ", "talk about the weather. "):
            await conn.send(P.text("c", token))
        await asyncio.sleep(1.5)
        late = conn.log[mark:]
        late_frames = sum(1 for ev in late if ev.msg is None and ev.stream != first["stream"])
        live_after = (await readyz(srv.http_url))["active_streams"]
        # 20 cancelled ids, each followed by one late token, then a fresh start
        for i in range(20):
            await conn.send(P.start(f"z{i}", pace=True))
            await conn.send(P.cancel(f"z{i}"))
            await conn.send(P.text(f"z{i}", "late "))
        await conn.send(P.start("fresh", pace=True))
        await asyncio.sleep(1.0)
        errors = [ev.msg for ev in conn.log[mark:] if ev.type == P.MsgType.ERROR]
        fresh_err = [e for e in errors if e.get("context_id") == "fresh"]
        report(
            "late-text-after-cancel",
            frames_after_ack=late_frames,
            active_streams_1_5s_later=live_after,
            fresh_start_after_20_late=("refused " + fresh_err[0]["code"]) if fresh_err else "started",
        )
    async with running_server(engine) as srv, raw_connection(srv.ws_url) as conn:  # after done
        await conn.speak("d", "Done now.", pace=False)
        mark = len(conn.log)
        await conn.send(P.text("d", "late after done. "))
        await asyncio.sleep(1.0)
        after = conn.log[mark:]
        report(
            "late-text-after-done",
            frames=sum(1 for ev in after if ev.msg is None),
            replies=[ev.msg.get("code") or ev.type for ev in after if ev.msg is not None],
        )


async def probe_big_message(engine) -> None:
    async with running_server(engine) as srv, raw_connection(srv.ws_url) as conn:
        await conn.send(P.start("live", text=LONG, pace=True))
        started = await conn.expect(P.MsgType.STARTED, context_id="live")
        await conn.expect(P.MsgType.WORDS, context_id="live")
        await conn.send(P.text("big", "x" * 1_000_000))
        await asyncio.sleep(1.0)
        frames_before = sum(1 for ev in conn.log if ev.stream == started["stream"])
        await asyncio.sleep(1.0)
        frames_after = sum(1 for ev in conn.log if ev.stream == started["stream"])
        errors = [ev.msg["code"] for ev in conn.log if ev.type == P.MsgType.ERROR]
        report(
            "1MB-message",
            connection_closed=conn.closed,
            close_code=conn.ws.close_code,
            reply=errors,
            live_context_frames_in_next_1s=frames_after - frames_before,
        )


async def probe_non_reader(engine, pings: int = 40_000) -> None:
    async with running_server(engine) as srv:
        peer = await asyncio.to_thread(NonReadingPeer, srv.ws_url)  # blocking socket: off the server's loop
        ping = P.ping("x" * 200)
        t0 = time.monotonic()

        def flood() -> int:
            for i in range(pings):
                if not peer.send_text(ping):
                    return i
            return pings

        flooding = asyncio.ensure_future(asyncio.wait_for(asyncio.to_thread(flood), 60))
        peak_msgs = peak_bytes = 0
        while not flooding.done():  # the server's outbox for this peer, sampled every 10 ms
            conns = list(srv.server._connections)
            peak_msgs = max(peak_msgs, sum(len(c._outbox) for c in conns))
            peak_bytes = max(peak_bytes, sum(len(m) for c in conns for _, m in c._outbox))
            await asyncio.sleep(0.01)
        try:
            sent = flooding.result()
        except TimeoutError:
            sent = -1  # the server stopped reading: our sends block
        await asyncio.sleep(1.0)
        conns = list(srv.server._connections)
        code = await asyncio.to_thread(peer.read_close_code)
        peer.close()
        report(
            "never-reading-peer",
            pings_sent=sent,
            seconds=round(time.monotonic() - t0, 1),
            peak_outbox_messages=peak_msgs,
            peak_outbox_kb=peak_bytes // 1024,
            connection_still_open=bool(conns),
            close_code=code,
        )


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.n = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.n += 1


async def probe_bad_text(engine) -> None:
    counter = _Count()
    logging.getLogger("tts_service").addHandler(counter)
    logging.getLogger("tts_service").setLevel(logging.ERROR)
    async with running_server(engine) as srv, raw_connection(srv.ws_url) as conn:
        codes = {}
        for name, raw in (("surrogate", '"a \\ud800 b. "'), ("nul", '"a \\u0000 b. "')):
            await conn.send(f'{{"type":"start","context_id":"{name}","pace":false,"text":{raw}}}')
            await conn.send(P.end(name))
            await asyncio.sleep(1.0)
            codes[name] = [
                ev.msg["code"]
                for ev in conn.log
                if ev.type == P.MsgType.ERROR and ev.msg.get("context_id") in (name, None)
            ]
        report("surrogate-nul-text", errors=codes, error_log_records=counter.n)
    logging.getLogger("tts_service").removeHandler(counter)


async def probe_ping_ids(engine) -> None:
    async with running_server(engine) as srv:
        results = {}
        async with aiohttp.ClientSession() as s, s.ws_connect(srv.ws_url) as ws:
            await ws.receive()  # ready
            for name, raw_id in (
                ("1e400", "1e400"),
                ("NaN", "NaN"),
                ("-Infinity", "-Infinity"),
                ("5000-digit", "9" * 5000),
            ):
                await ws.send_str(f'{{"type":"ping","id":{raw_id}}}')
                reply = (await ws.receive(timeout=5)).data
                try:
                    obj = strict_json(reply)
                    results[name] = obj["type"] + ("" if obj["type"] == "pong" else ":" + obj["message"][:30])
                except ValueError:
                    results[name] = "INVALID JSON " + reply[:40]
        report("ping-ids", **{k: repr(v) for k, v in results.items()})


async def probe_http(engine) -> None:
    key = "k3y"
    async with running_server(engine, config=ServerConfig(api_key=key)) as srv:
        async with aiohttp.ClientSession() as s:
            async with s.get(srv.http_url + "/v1/voices", headers={"Authorization": f"bearer {key}"}) as r:
                lower = r.status
            body = json.dumps({"text": "a" * 3_000_000}).encode()
            async with s.post(
                srv.http_url + "/v1/tts",
                data=body,
                headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            ) as r:
                big = (r.status, r.headers.get("Content-Type", "").split(";")[0])
        report("http", lowercase_bearer_status=lower, body_3MB=big)


async def probe_sigterm() -> None:
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1", STREAMVOX_DRAIN_TIMEOUT="5")  # older servers ignore it
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "tts_service", "--port", str(port), "--log-level", "WARNING"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    http = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as s:
            for _ in range(600):
                try:
                    async with s.get(http + "/readyz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
            ws = await s.ws_connect(f"ws://127.0.0.1:{port}{P.WS_PATH}")
            await ws.receive()
            await ws.send_str(P.start("live", text="This is the last thing I will say before I stop.", pace=True))
            await ws.send_str(P.end("live"))
            resp = await s.post(http + "/v1/tts", json={"text": LONG, "pace": True})
            await resp.content.readany()
            await asyncio.sleep(0.3)
            t_sig = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                async with s.get(http + "/readyz", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    ready_after = r.status
            except (aiohttp.ClientError, TimeoutError):
                ready_after = "refused"

            async def read_http() -> str:
                try:
                    n = 0
                    async for chunk in resp.content.iter_any():
                        n += len(chunk)
                    return f"complete after {time.monotonic() - t_sig:.1f}s"
                except (aiohttp.ClientError, TimeoutError) as exc:
                    return f"truncated after {time.monotonic() - t_sig:.1f}s ({type(exc).__name__})"

            http_task = asyncio.create_task(read_http())
            seen = []
            async with asyncio.timeout(70):
                async for msg in ws:
                    if msg.type == aiohttp.WSMsgType.TEXT:
                        seen.append(json.loads(msg.data).get("code") or json.loads(msg.data)["type"])
            ws_closed_at = time.monotonic() - t_sig
            http_outcome = await http_task
            try:
                await asyncio.wait_for(proc.wait(), max(1.0, 120 - (time.monotonic() - t_sig)))
                exited = round(time.monotonic() - t_sig, 1)
            except TimeoutError:
                exited = "still running after 120 s"
            report(
                "sigterm",
                readyz_after_signal=ready_after,
                ws_messages_after_signal=[m for m in seen if m != "words"],
                ws_close_code=ws.close_code,
                ws_closed_after_s=round(ws_closed_at, 2),
                http=http_outcome,
                exit_after_s=exited,
            )
    finally:
        if proc.returncode is None:
            proc.kill()


async def main(which: list[str]) -> None:
    probes = {
        "late": probe_late,
        "big": probe_big_message,
        "nonreader": probe_non_reader,
        "badtext": probe_bad_text,
        "ping": probe_ping_ids,
        "http": probe_http,
    }
    engine = load_piper_engine(progress=lambda *_: None) if set(which) - {"sigterm"} else None
    for name in which:
        if name == "sigterm":
            await probe_sigterm()
        else:
            await probes[name](engine)


if __name__ == "__main__":
    logging.basicConfig(level=logging.CRITICAL)
    asyncio.run(main(sys.argv[1:] or ["late", "big", "nonreader", "badtext", "ping", "http", "sigterm"]))
