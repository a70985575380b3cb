"""ReplicaSet without servers: DNS discovery that follows pods coming and going, back-off, and the
placement order for replicas that do not answer (nothing listens on their ports)."""

from __future__ import annotations

import random
import time

import aiohttp
import pytest

from tts_service.localproc import free_port
from tts_service.replicas import ReplicaSet


async def test_discovery_follows_the_records_and_keeps_backoff_state() -> None:
    answers = [["10.0.0.1", "10.0.0.2"], ["10.0.0.2", "10.0.0.3", "fd00::4"]]

    async def resolver(host: str, port: int) -> list[str]:
        assert (host, port) == ("tts.svc", 8765)
        return answers[0]

    rs = ReplicaSet("wss://tts.svc:8765/v1/stream?x=1", discover=True, resolver=resolver, dns_ttl_s=0.0)
    first = await rs.refresh()
    assert [r.url for r in first] == ["wss://10.0.0.1:8765/v1/stream?x=1", "wss://10.0.0.2:8765/v1/stream?x=1"]
    assert all(r.host_header == "tts.svc:8765" and r.server_hostname == "tts.svc" for r in first)
    assert first[0].http_base == "https://10.0.0.1:8765"
    rs.mark_failed(first[1], "did not answer")
    answers.pop(0)  # a pod went, two came (one with an IPv6 address)
    second = await rs.refresh()
    assert [r.url for r in second][-1] == "wss://[fd00::4]:8765/v1/stream?x=1"
    assert second[0] is first[1] and second[0].failures == 1, "a known replica keeps its back-off"
    assert rs.label == "wss://tts.svc:8765/v1/stream"  # messages never carry the query string


async def test_a_dns_failure_keeps_the_last_answer() -> None:
    calls = {"n": 0}

    async def resolver(host: str, port: int) -> list[str]:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("temporary failure in name resolution")
        return ["10.0.0.9"] if calls["n"] == 1 else []  # then: no ready pod at all

    rs = ReplicaSet("ws://tts.svc:8765/v1/stream", discover=True, resolver=resolver, dns_ttl_s=0.0)
    assert len(await rs.refresh()) == 1
    assert [r.url for r in await rs.refresh()] == ["ws://10.0.0.9:8765/v1/stream"]
    assert [r.url for r in await rs.refresh()] == ["ws://10.0.0.9:8765/v1/stream"]  # empty answer
    calls["n"] = 1
    fresh = ReplicaSet("ws://tts.svc:8765/v1/stream", discover=True, resolver=resolver, dns_ttl_s=0.0)
    with pytest.raises(OSError, match=r"cannot resolve tts\.svc"):
        await fresh.refresh()
    with pytest.raises(OSError, match="no address"):
        await fresh.refresh()


def test_backoff_grows_with_jitter_and_honours_retry_after() -> None:
    urls = ["ws://a:1/v1/stream", "ws://b:1/v1/stream"]
    rs = ReplicaSet(urls, backoff_s=0.2, max_backoff_s=2.0, rng=random.Random(1))
    a, b = rs.replicas
    delays = []
    for _ in range(6):
        rs.mark_failed(a, "x")
        delays.append(a.down_until - time.monotonic())
    assert all(0.0 < d <= 3.0 for d in delays) and delays[-1] >= 1.0  # capped at 2 s x 1.5 jitter
    rs.mark_failed(b, "full", retry_after_s=1.5)
    assert b.down_until - time.monotonic() >= 0.74  # at least retry_after x 0.5 jitter
    rs.mark_ok(a)
    assert a.up(time.monotonic()) and a.failures == 0
    assert rs.wait_s() == 0.0


def test_bad_urls_are_refused_with_a_reason() -> None:
    with pytest.raises(ValueError, match="not a WebSocket URL"):
        ReplicaSet("http://x:1/v1/stream")
    with pytest.raises(ValueError, match="at least one"):
        ReplicaSet([])
    with pytest.raises(ValueError, match="one URL"):
        ReplicaSet(["ws://a:1/", "ws://b:1/"], discover=True)


async def test_replicas_that_do_not_answer_are_backed_off() -> None:
    urls = [f"ws://127.0.0.1:{free_port()}/v1/stream" for _ in range(3)]
    rs = ReplicaSet(urls, probe_timeout_s=0.5, rng=random.Random(0))
    async with aiohttp.ClientSession() as http:
        order = await rs.choose(http)  # the probed pair is down; the third is left to try
        assert len(order) == 1
        assert sum(1 for r in rs.replicas if r.failures == 1) == 2
        assert await rs.choose(http) == [], "the third did not answer either: nothing is left to try"
        assert all(r.failures == 1 for r in rs.replicas) and rs.wait_s() > 0
    single = ReplicaSet(urls[0])
    async with aiohttp.ClientSession() as http:
        assert [r.url for r in await single.choose(http)] == [urls[0]], "one replica is never probed"
