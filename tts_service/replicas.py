"""Where a client's next connection goes: a set of streamvox replicas and load-aware placement.

A replica set is a list of WebSocket URLs, or one URL whose host name resolves to several
addresses (a Kubernetes headless Service: one A/AAAA record per ready pod), re-resolved when a
connection is placed and the last answer is older than ``dns_ttl_s``, so pods that come and go are
followed without a restart.

Placement is the "power of two choices": ask two random replicas for ``/readyz`` and take the
less loaded one that accepts. Two cheap GETs get close to the best choice, and many agents that
connect at the same moment do not all pile onto the one replica that looked emptiest a moment
ago. A replica that refuses (full), drains, or does not answer is put on a jittered back-off
(exponential in its consecutive failures, at least the server's ``retry_after_ms``) and skipped
until it expires. With a single replica there is nothing to choose: no probe is sent.

This module never opens a WebSocket and never touches audio: it only orders the candidates.
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from .readiness import READYZ_PATH, Readiness, readiness

# host, port -> addresses. The default asks the system resolver; tests inject a stub.
Resolver = Callable[[str, int], Awaitable[list[str]]]


async def system_resolver(host: str, port: int) -> list[str]:
    """Every address of ``host`` (A and AAAA), in the resolver's order, without repeats."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


@dataclass(eq=False)
class Replica:
    """One server: where to connect, and how it has behaved lately."""

    url: str  # ws:// or wss:// URL, with an address in place of a DNS name when discovered
    host_header: str | None = None  # the original host[:port] for Host (and TLS SNI) when discovered
    server_hostname: str | None = None
    failures: int = 0
    down_until: float = 0.0  # monotonic; skipped until then
    last_load: float | None = None
    reason: str = ""  # why it was last skipped

    @property
    def http_base(self) -> str:
        parts = urlsplit(self.url)
        scheme = "https" if parts.scheme == "wss" else "http"
        return urlunsplit((scheme, parts.netloc, "", "", ""))

    def up(self, now: float) -> bool:
        return self.down_until <= now


def _with_host(url: str, address: str) -> str:
    parts = urlsplit(url)
    host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _default_port(url: str) -> int:
    parts = urlsplit(url)
    return parts.port or (443 if parts.scheme == "wss" else 80)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class ReplicaSet:
    """The replicas one client may use, with their back-off state."""

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        discover: bool = False,
        resolver: Resolver | None = None,
        dns_ttl_s: float = 5.0,
        backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
        probe_timeout_s: float = 0.5,
        rng: random.Random | None = None,
    ) -> None:
        self._urls = [urls] if isinstance(urls, str) else list(urls)
        if not self._urls:
            raise ValueError("a replica set needs at least one URL")
        for url in self._urls:
            if urlsplit(url).scheme not in ("ws", "wss") or not urlsplit(url).hostname:
                raise ValueError(f"not a WebSocket URL: {url!r} (expected ws://host:port/v1/stream)")
        if discover and len(self._urls) != 1:
            raise ValueError("DNS discovery takes one URL whose host name has an address per replica")
        self.discover = discover
        self._resolver = resolver or system_resolver
        self.dns_ttl_s = dns_ttl_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.probe_timeout_s = probe_timeout_s
        self._rng = rng or random.Random()
        self._replicas: dict[str, Replica] = {}
        self._resolved_at = -float("inf")
        if not discover:
            self._replicas = {u: Replica(u) for u in self._urls}

    @property
    def label(self) -> str:
        """For messages: the URL(s) as given (no addresses, no query strings)."""
        shown = [urlunsplit(urlsplit(u)._replace(query="")) for u in self._urls]
        return shown[0] if len(shown) == 1 else f"{len(shown)} replicas ({', '.join(shown)})"

    @property
    def replicas(self) -> list[Replica]:
        return list(self._replicas.values())

    async def refresh(self, *, force: bool = False) -> list[Replica]:
        """Re-resolve the DNS name when discovering (at most every ``dns_ttl_s``)."""
        if not self.discover:
            return self.replicas
        now = time.monotonic()
        if not force and self._replicas and now - self._resolved_at < self.dns_ttl_s:
            return self.replicas
        url = self._urls[0]
        parts = urlsplit(url)
        host = parts.hostname or ""
        if _is_address(host):
            addresses = [host]
        else:
            try:
                addresses = await self._resolver(host, _default_port(url))
            except OSError as exc:
                if self._replicas:  # keep the last answer while DNS hiccups
                    return self.replicas
                raise OSError(f"cannot resolve {host}: {exc}") from None
        fresh: dict[str, Replica] = {}
        for address in addresses:
            replica_url = _with_host(url, address)
            known = self._replicas.get(replica_url)
            fresh[replica_url] = known or Replica(
                replica_url,
                host_header=parts.netloc.rpartition("@")[2],
                server_hostname=host if parts.scheme == "wss" else None,
            )
        if not fresh:
            if self._replicas:  # no ready pod right now (all full or draining): keep trying the last ones
                return self.replicas
            raise OSError(f"{host} resolved to no address")
        self._replicas, self._resolved_at = fresh, now
        return self.replicas

    # ------------------------------------------------------------ back-off
    def mark_failed(
        self, replica: Replica, reason: str, *, retry_after_s: float | None = None, now: float | None = None
    ) -> None:
        """Skip ``replica`` for a jittered, growing while (at least ``retry_after_s``).

        ``now``: the caller's monotonic clock (the I/O-free driver passes its own); default the
        system's."""
        replica.failures += 1
        delay = min(self.max_backoff_s, self.backoff_s * 2 ** (replica.failures - 1))
        if retry_after_s is not None:
            delay = max(delay, retry_after_s)
        replica.down_until = (time.monotonic() if now is None else now) + self.jitter(delay)
        replica.reason = reason

    def jitter(self, delay: float) -> float:
        """``delay`` spread over 0.5..1.5x, so clients that failed together do not retry together."""
        return delay * (0.5 + self._rng.random())

    def mark_ok(self, replica: Replica) -> None:
        replica.failures = 0
        replica.down_until = 0.0
        replica.reason = ""

    def wait_s(self, *, now: float | None = None) -> float:
        """How long until some replica is out of its back-off (0 if one is up now)."""
        now = time.monotonic() if now is None else now
        return max(0.0, min((r.down_until for r in self._replicas.values()), default=0.0) - now)

    # ------------------------------------------------------------ placement
    async def probe(self, http: aiohttp.ClientSession, replica: Replica) -> Readiness | None:
        """``/readyz`` of one replica; ``None`` when it does not answer."""
        headers = {"Host": replica.host_header} if replica.host_header else None
        try:
            async with http.get(
                replica.http_base + READYZ_PATH,
                headers=headers,
                server_hostname=replica.server_hostname,
                timeout=aiohttp.ClientTimeout(total=self.probe_timeout_s),
            ) as resp:
                if resp.status == 404:  # a server without /readyz: nothing to go by, try it
                    return Readiness(accepting=True, load=0.5)
                try:
                    body = await resp.json(content_type=None)
                except ValueError:
                    body = None
                state = readiness(resp.status, body)
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None
        replica.last_load = state.load
        return state

    async def choose(self, http: aiohttp.ClientSession) -> list[Replica]:
        """Replicas to try for one new connection, best first (empty: all are backed off).

        One replica: itself, unprobed. Several: two random ones that are up, probed at once;
        those that accept come first, less loaded first; the ones that refuse or do not answer
        are backed off. If neither of the two accepts, the rest of the up replicas follow, so
        a caller can still try them in turn.
        """
        replicas = await self.refresh()
        if len(replicas) == 1:
            return replicas  # nothing to choose; the caller's own backoff spaces the retries
        now = time.monotonic()
        up = [r for r in replicas if r.up(now)]
        pair = self._rng.sample(up, min(2, len(up)))
        states = await asyncio.gather(*(self.probe(http, r) for r in pair))
        accepting: list[tuple[float, Replica]] = []
        for replica, state in zip(pair, states):
            if state is None:
                self.mark_failed(replica, "did not answer /readyz")
            elif not state.accepting:
                self.mark_failed(replica, "draining" if state.draining else "full (readyz 503)")
            else:
                accepting.append((state.load, replica))
        accepting.sort(key=lambda item: item[0])
        order = [r for _, r in accepting]
        if not order:
            order = [r for r in up if r not in pair]
            self._rng.shuffle(order)
        return order
