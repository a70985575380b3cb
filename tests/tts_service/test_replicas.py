"""TTSClient over three real replicas on loopback: placement, refusal, drain (SIGTERM), death
(SIGKILL) and DNS discovery.

The first and last cases run the replicas in this process (a small ``max_streams`` each, so that
one replica cannot take every context); the SIGTERM and SIGKILL cases need real processes, so
they start three ``python -m tts_service`` children. Timing bounds are generous (a shared
2-core machine); the figures are printed (``pytest -s``) and recorded in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest
from aiohttp import web

from support.tts_helpers import NO_ADMISSION_LIMIT
from tts_service import protocol as P
from tts_service.client import AudioFrame, TTSClient, TTSConnectionError, TTSError, TTSOverloaded
from tts_service.localproc import ChildServer, free_port
from tts_service.piper.runtime import PiperSynthesizer
from tts_service.piper.scheduler import PiperSchedulerOptions
from tts_service.server import Server, ServerConfig

TURN = "Thanks for waiting. Your table for four is booked for eight tonight."  # ~4 s of speech
SHORT = "All set, see you then."


@contextlib.asynccontextmanager
async def replicas(engine, hosts: list[str], *, port: int = 0, max_streams: int) -> AsyncIterator[list[Server]]:
    """One in-process server per host (same ``port`` for all when given: a DNS name's addresses)."""
    runners: list[web.AppRunner] = []
    servers: list[Server] = []
    try:
        for host in hosts:
            options = PiperSchedulerOptions(capacity=NO_ADMISSION_LIMIT, max_streams=max_streams)
            server = Server(PiperSynthesizer(engine, options=options), ServerConfig())
            runner = web.AppRunner(server.app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, host, port).start()
            server.ws_url = f"ws://{host}:{runner.addresses[0][1]}{P.WS_PATH}"  # type: ignore[attr-defined]
            runners.append(runner)
            servers.append(server)
        yield servers
    finally:
        for runner in runners:
            await runner.cleanup()


async def speak(client: TTSClient, text: str, *, pace: bool = True):
    """One turn: (context, its frames)."""
    ctx = await client.open(text=text, pace=pace)
    await ctx.end()
    frames = [item async for item in ctx if isinstance(item, AudioFrame)]
    return ctx, frames


def tally(results: list) -> dict[str, int]:
    served = sum(1 for r in results if not isinstance(r, BaseException) and r[0].done and r[1])
    refused = sum(1 for r in results if isinstance(r, TTSOverloaded))
    return {"served": served, "refused": refused, "failed": len(results) - served - refused}


async def test_more_contexts_than_one_replica_admits_are_all_served(engine) -> None:
    async with replicas(engine, ["127.0.0.1"] * 3, max_streams=2) as servers:
        urls = [s.ws_url for s in servers]  # type: ignore[attr-defined]
        clients = [TTSClient(urls) for _ in range(5)]  # five agents, one turn each, all at once
        try:
            results = await asyncio.gather(*(speak(c, TURN) for c in clients), return_exceptions=True)
        finally:
            await asyncio.gather(*(c.close() for c in clients))
    counts = tally(results)
    retried = sum(c.retries_elsewhere for c in clients)
    print(f"5 contexts on 3 replicas of 2 streams: {counts}, refusals absorbed by retrying elsewhere: {retried}")
    assert counts == {"served": 5, "refused": 0, "failed": 0}, results
    used = [r[0].replica_url for r in results]
    assert max(used.count(u) for u in set(used)) <= 2, used  # no replica held more than it admits
    assert len(set(used)) == 3


async def test_a_dns_name_with_several_addresses_is_the_replica_set(engine) -> None:
    hosts = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    port = free_port()
    asked: list[tuple[str, int]] = []

    async def resolver(host: str, p: int) -> list[str]:  # a stub for a headless Service's records
        asked.append((host, p))
        return list(hosts) if host == "tts.replicas.test" else []

    async with replicas(engine, hosts, port=port, max_streams=1):
        url = f"ws://tts.replicas.test:{port}{P.WS_PATH}"
        clients = [TTSClient(url, discover=True, resolver=resolver) for _ in range(3)]
        try:
            results = await asyncio.gather(*(speak(c, SHORT) for c in clients), return_exceptions=True)
        finally:
            await asyncio.gather(*(c.close() for c in clients))
    assert tally(results) == {"served": 3, "refused": 0, "failed": 0}, results
    assert asked and all(a == ("tts.replicas.test", port) for a in asked)
    assert sorted(r.url for r in clients[0].replicas.replicas) == sorted(f"ws://{h}:{port}{P.WS_PATH}" for h in hosts)
    # one stream per replica: the three turns must have used all three addresses
    assert {urlsplit(r[0].replica_url).hostname for r in results} == set(hosts)


# ---------------------------------------------------------------- real processes


@contextlib.contextmanager
def children(n: int, *extra: str):
    kids = [ChildServer.tts(extra=list(extra)).spawn() for _ in range(n)]  # they load in parallel
    try:
        for kid in kids:
            kid.wait(timeout=120)
        yield kids
    finally:
        for kid in kids:
            kid.stop(timeout=5)


def _by_url(kids: list[ChildServer], url: str) -> ChildServer:
    (kid,) = [k for k in kids if k.ws_url == url]
    return kid


async def test_a_replica_drained_by_sigterm_finishes_its_contexts_and_new_ones_go_elsewhere() -> None:
    with children(3, "--max-streams", "3", "--drain-timeout", "20") as kids:
        client = TTSClient([k.ws_url for k in kids])
        try:
            ctxs = [await client.open(text=TURN, pace=True) for _ in range(3)]
            for ctx in ctxs:
                await ctx.end()
            homes = [c.replica_url for c in ctxs]
            victim = _by_url(kids, max(set(homes), key=homes.count))
            live = [c for c in ctxs if c.replica_url == victim.ws_url]

            async def play(ctx):
                return [item async for item in ctx if isinstance(item, AudioFrame)]

            tasks = [asyncio.create_task(play(c)) for c in ctxs]
            while not all(c.frames for c in live):
                await asyncio.sleep(0.02)
            victim.proc.send_signal(signal.SIGTERM)  # mid-turn for every live context
            t0 = time.monotonic()
            await asyncio.sleep(0.1)  # the 'draining' notice is in flight; either way:
            during = [await speak(client, SHORT, pace=False) for _ in range(2)]
            exit_code = await asyncio.to_thread(victim.proc.wait, 30)
            drain_s = time.monotonic() - t0
            frames = await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await client.close()
    print(
        f"SIGTERM with {len(live)} live contexts: exit {exit_code} after {drain_s:.2f} s; "
        f"their audio {[round(c.audio_ms) for c in live]} ms, all done: {all(c.done for c in ctxs)}; "
        f"new contexts on {[urlsplit(c.replica_url).port for c, _ in during]} (victim {victim.port})"
    )
    assert exit_code == 0
    assert all(not isinstance(f, BaseException) and f for f in frames), frames  # no context failed
    assert all(c.done for c in ctxs)
    for ctx, got in zip(ctxs, frames):
        assert abs(sum(f.duration_s for f in got) * 1000 - ctx.audio_ms) < 50, "a drained context was cut short"
    # The three share one connection unless the replica's admission refused one (a busy machine):
    # then it was opened elsewhere, as it should be. The drain is tested on whatever was live.
    assert live, homes
    assert all(c.replica_url != victim.ws_url and c.done and f for c, f in during)
    assert drain_s < 20.0


async def test_a_replica_killed_mid_turn_fails_that_turn_and_the_next_goes_elsewhere() -> None:
    with children(3, "--max-streams", "3") as kids:
        client = TTSClient([k.ws_url for k in kids])
        try:
            ctx = await client.open(text=TURN + " " + TURN, pace=True)
            await ctx.end()
            victim = _by_url(kids, ctx.replica_url)
            got: list[AudioFrame] = []
            with pytest.raises(TTSError) as info:
                async for item in ctx:
                    if isinstance(item, AudioFrame):
                        got.append(item)
                        if len(got) == 3:
                            victim.proc.kill()  # SIGKILL: no drain, no goodbye
                            t_kill = time.monotonic()
            t_error = time.monotonic()
            nxt = await client.open(text=SHORT, pace=True)
            await nxt.end()
            first_at = None
            async for item in nxt:
                if isinstance(item, AudioFrame) and first_at is None:
                    first_at = time.monotonic()
            assert first_at is not None
        finally:
            await client.close()
    print(
        f"SIGKILL: turn failed after {1000 * (t_error - t_kill):.0f} ms ({info.value}); "
        f"next turn's first audio {1000 * (first_at - t_kill):.0f} ms after the kill, on port "
        f"{urlsplit(nxt.replica_url).port} (victim {victim.port})"
    )
    assert isinstance(info.value, TTSConnectionError), info.value  # a clear error, not silence
    assert [f.seq for f in got] == list(range(len(got))), "frames of the dead turn are never repeated"
    assert nxt.context_id != ctx.context_id and nxt.replica_url != victim.ws_url and nxt.done
    assert first_at - t_kill < 5.0  # ~1 s asked; generous on a shared machine


async def test_a_replica_that_accepts_but_never_answers_is_skipped(engine) -> None:
    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # a hung process: the socket opens, nothing ever comes back

    hung = await asyncio.start_server(hold, "127.0.0.1", 0)
    hung_url = f"ws://127.0.0.1:{hung.sockets[0].getsockname()[1]}{P.WS_PATH}"
    try:
        async with replicas(engine, ["127.0.0.1"], max_streams=4) as (live,):
            client = TTSClient([hung_url, live.ws_url], probe_timeout_s=0.3, connect_timeout_s=1.0)  # type: ignore[attr-defined]
            try:
                t0 = time.monotonic()
                ctx, frames = await speak(client, SHORT, pace=False)
                took = time.monotonic() - t0
            finally:
                await client.close()
    finally:
        hung.close()
    assert frames and ctx.replica_url == live.ws_url  # type: ignore[attr-defined]
    hung_replica = next(r for r in client.replicas.replicas if r.url == hung_url)
    assert hung_replica.failures == 1 and "readyz" in hung_replica.reason
    assert took < 5.0, took  # the probe's 0.3 s, not TCP's minutes


async def test_a_start_refused_by_a_full_replica_is_opened_on_another_at_once(engine) -> None:
    async with replicas(engine, ["127.0.0.1"] * 2, max_streams=1) as servers:
        urls = [s.ws_url for s in servers]  # type: ignore[attr-defined]
        client = TTSClient(urls)
        other = None
        try:
            await client.connect()
            full = client.replica_url
            other = TTSClient(full)  # another agent takes the only stream of that replica
            busy = await other.open(text=TURN, pace=True)
            await busy.end()
            ctx, frames = await speak(client, SHORT, pace=False)  # refused there, served elsewhere
        finally:
            await client.close()
            if other is not None:
                await other.close()
    assert frames and ctx.done and ctx.replica_url != full
    assert client.retries_elsewhere == 1 and client.connections == 2
