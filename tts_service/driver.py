"""The connection policy of a protocol-v1 client, written once and free of I/O.

:mod:`tts_service.session` holds what one connection knows (contexts, streams, gates, acks). What
to do *about* connections - where the next one goes, how long to wait after a failed one, whether a
refused start is opened again elsewhere, when a cancel that was never acknowledged condemns its
connection, when a draining replica is left - used to be written twice, in ``TTSClient`` and in the
Pipecat service, with different setting names and two stats classes. It drifted: one backed off a
replica that died under it, the other did not. So every client (``TTSClient``, the Pipecat
service, and through ``TTSClient`` the LiveKit plug-in) feeds this one :class:`ClientDriver`:

* it is told what happened (a handshake worked or failed on a replica, a start was refused with
  ``overloaded``/``draining``, a cancel was sent or acknowledged, a connection was lost, the server
  announced its drain), always with the time, read by the transport from its own clock;
* it answers with decisions (the replicas to dial, in order; the back-off before the next try; a
  :class:`Refusal` saying whether to re-open the start elsewhere and whether to stop using the
  connection; how long a cancel may still wait for its ack, and whether it is overdue; whether
  to leave a draining connection now, which is only ever between turns);
* it keeps the one :class:`StreamvoxStats` that users read.

The transport owns everything that waits: the socket, the tasks, the timers, the clock. Nothing
here sleeps, sends or reads ``time.monotonic()``, so every rule is tested with a hand-turned clock
(``tests/tts_service/test_driver.py``). Replica placement itself (the power of two choices over
``/readyz``) needs HTTP and stays in :class:`tts_service.replicas.ReplicaSet`; the driver orders
and backs off the replicas that set knows.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from . import protocol as P
from .replicas import Replica, ReplicaSet
from .session import RETRY_ELSEWHERE, ClientSession

__all__ = ["ClientDriver", "ConnectionSettings", "Refusal", "StreamvoxStats", "renamed_settings"]

# The name every client spells a setting with, for the names older releases used. Accepted with a
# DeprecationWarning for one release (README, changelog).
RENAMED: Final[Mapping[str, str]] = {
    "cancel_timeout": "cancel_ack_timeout_s",
    "connect_timeout": "connect_timeout_s",
    "open_timeout": "open_timeout_s",
    "backoff_s": "reconnect_backoff_s",
    "max_backoff_s": "reconnect_backoff_max_s",
    "reconnect_backoff_min_s": "reconnect_backoff_s",
}
_ACK_LATENCIES_KEPT = 1000  # bounded: a long-lived agent cancels forever
# A transport's timer set for the deadline may fire a clock tick before it (asyncio runs handles
# due within its clock resolution): such a wake-up still counts as the deadline.
_CLOCK_SLACK_S = 1e-3


def renamed_settings(owner: str, old: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``given`` (the new names' values) with any old-name keywords in ``old`` moved onto their
    new names, each with a DeprecationWarning. An unknown keyword is a TypeError, as Python's own."""
    out = dict(given)
    for name, value in old.items():
        new = RENAMED.get(name)
        if new is None or new not in out:
            raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}")
        warnings.warn(
            f"{owner}({name}=...) is deprecated; use {new}=... (the same setting in every streamvox client)",
            DeprecationWarning,
            stacklevel=3,
        )
        out[new] = value
    return out


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    """The connection settings every client takes, under the same names."""

    connect_timeout_s: float = 5.0  # handshake plus the server's ``ready``
    open_timeout_s: float = 5.0  # ``start`` -> ``started`` when the caller waits for it
    cancel_ack_timeout_s: float = 1.0  # a cancel unacknowledged this long condemns its connection
    connect_attempts: int = 5  # tries of one connect (TTSClient); each try is one replica
    reconnect_backoff_s: float = 0.2  # first back-off after a failed connect; doubles per failure
    reconnect_backoff_max_s: float = 5.0  # its cap, and how long a draining replica is skipped
    probe_timeout_s: float = 0.5  # one replica's /readyz during placement


@dataclass
class StreamvoxStats:
    """Counters of one client (``TTSClient``, ``StreamvoxTTSService`` or ``StreamvoxTTS``), all since
    construction. Each client fills the fields that mean something for it; the rest stay 0."""

    connections: int = 0  # successful handshakes; 1 means the socket was never replaced
    contexts: int = 0  # protocol contexts opened
    streams: int = 0  # LiveKit streams (segments) served
    cancels: int = 0  # cancels sent (LiveKit: cancels settled)
    cancel_acks: int = 0  # cancels the server acknowledged
    cancel_ack_timeouts: int = 0  # cancels never acknowledged in time; each one replaced the connection
    cancels_unacked: int = 0  # cancels without an ack for any reason (timeout or a connection already gone)
    frames_dropped: int = 0  # frames that arrived for a cancelled or unknown context, discarded here
    frames_dropped_server: int = 0  # frames the server computed but never sent (from the acks)
    cancel_ack_latency_s: deque[float] = field(default_factory=lambda: deque(maxlen=_ACK_LATENCIES_KEPT))
    max_lag_s: float = 0.0  # worst delivery lag behind a real-time player (playout gaps), any context
    drains: int = 0  # connections left between turns because their replica drained
    contexts_lost: int = 0  # contexts cut by a lost connection (ended with an error, never replayed)
    contexts_moved: int = 0  # starts refused (full/draining) and opened again on another replica

    @property
    def reconnects(self) -> int:
        return max(0, self.connections - 1)

    @property
    def cancels_acked(self) -> int:
        """The LiveKit plug-in's name for :attr:`cancel_acks`."""
        return self.cancel_acks

    @property
    def cancel_ack_s(self) -> deque[float]:
        """The LiveKit plug-in's name for :attr:`cancel_ack_latency_s`."""
        return self.cancel_ack_latency_s

    def cancel_settled(self, *, acked: bool, latency_s: float, frames_dropped_server: int = 0) -> None:
        """One cancel's outcome, counted once however the transport learnt it."""
        if acked:
            self.cancel_acks += 1
            self.cancel_ack_latency_s.append(latency_s)
            self.frames_dropped_server += frames_dropped_server
        else:
            self.cancels_unacked += 1


@dataclass(frozen=True, slots=True)
class Refusal:
    """What to do about a start refused for lack of room (``overloaded`` or ``draining``)."""

    retry_elsewhere: bool  # open it again, now, on another replica (nothing was spoken)
    retire: bool  # this connection takes no new contexts; close it once its live ones finish


@dataclass(slots=True)
class _PendingCancel:
    sent_at: float
    deadline: float


class ClientDriver:
    """Placement, refusal, cancel-ack, reconnect and drain policy of one client. Pure: the
    transport passes ``now`` (its monotonic clock) to every call that depends on time."""

    def __init__(
        self,
        replicas: ReplicaSet,
        settings: ConnectionSettings | None = None,
        stats: StreamvoxStats | None = None,
    ) -> None:
        self.replicas = replicas
        self.settings = settings or ConnectionSettings()
        self.stats = stats if stats is not None else StreamvoxStats()
        self.connect_failures = 0  # consecutive failed placements (every candidate failed)
        self.next_connect_at = 0.0  # a transport that connects on demand waits until then
        self._cancels: dict[str, _PendingCancel] = {}

    @classmethod
    def for_urls(
        cls,
        url: str | Sequence[str],
        settings: ConnectionSettings,
        *,
        discover: bool = False,
        resolver: Any = None,
        stats: StreamvoxStats | None = None,
    ) -> ClientDriver:
        """A driver over the replica set ``url`` names, backed off with ``settings``' back-off."""
        replicas = ReplicaSet(
            url,
            discover=discover,
            resolver=resolver,
            backoff_s=settings.reconnect_backoff_s,
            max_backoff_s=settings.reconnect_backoff_max_s,
            probe_timeout_s=settings.probe_timeout_s,
        )
        return cls(replicas, settings, stats)

    @property
    def several(self) -> bool:
        """More than one replica: a refusal or a failure can be answered by going elsewhere."""
        return len(self.replicas.replicas) > 1

    # ------------------------------------------------------------ placement
    def candidates(self, chosen: Sequence[Replica], *, last_attempt: bool = True) -> list[Replica]:
        """The replicas to dial, in order, given the set's choice (``ReplicaSet.choose``).

        When every replica is backed off the choice is empty; on a connect's last attempt the
        replica that comes back first is tried anyway, so a full server answers with its own
        ``overloaded`` rather than the client guessing.
        """
        if chosen or not last_attempt:
            return list(chosen)
        return sorted(self.replicas.replicas, key=lambda r: r.down_until)[:1]

    def dial_failed(self, replica: Replica, reason: str, now: float) -> None:
        """A handshake (or its ``ready``) failed on ``replica``: skip it for a while."""
        self.replicas.mark_failed(replica, reason, now=now)

    def dialled(self, replica: Replica) -> None:
        """A handshake worked: the replica is healthy again and the back-off starts over."""
        self.replicas.mark_ok(replica)
        self.stats.connections += 1
        self.connect_failures = 0
        self.next_connect_at = 0.0

    def backoff_s(self, failures: int) -> float:
        """The back-off after ``failures`` consecutive failures (>= 1): doubling, capped."""
        s = self.settings
        return min(s.reconnect_backoff_max_s, s.reconnect_backoff_s * 2 ** max(0, failures - 1))

    def retry_delay(self, attempt: int, now: float) -> float:
        """How long to wait before try ``attempt + 1`` of one connect (``attempt`` counts from 0):
        the jittered back-off, and with several replicas at least until one is out of its own."""
        wait = self.replicas.wait_s(now=now) if self.several else 0.0
        return max(wait, self.replicas.jitter(self.backoff_s(attempt + 1)))

    def placement_failed(self, now: float) -> float:
        """No candidate connected. Returns the back-off; a transport that connects on demand (the
        Pipecat service dials from ``run_tts``) does not dial again before :attr:`next_connect_at`."""
        self.connect_failures += 1
        delay = self.backoff_s(self.connect_failures)
        self.next_connect_at = now + delay
        return delay

    def may_connect(self, now: float) -> bool:
        return now >= self.next_connect_at

    # ------------------------------------------------------------ refusals
    def refused(self, replica: Replica, code: str, retry_after_ms: int | None, *, tries: int, now: float) -> Refusal:
        """A start on ``replica`` was refused with ``code``; it has now been refused ``tries``
        times (once per replica). ``overloaded`` or ``draining`` means nothing was spoken: with
        several replicas the refusing one is backed off (for at least its ``retry_after_ms``) and
        the start goes elsewhere, each replica getting one chance; a draining one is left however
        many there are. Any other code is the caller's error: nothing changes.
        """
        if code not in RETRY_ELSEWHERE:
            return Refusal(retry_elsewhere=False, retire=False)
        retire = self.several or code == P.ErrorCode.DRAINING
        if retire:
            retry_s = (retry_after_ms if retry_after_ms is not None else 1000) / 1000
            self.replicas.mark_failed(replica, code, retry_after_s=retry_s, now=now)
        return Refusal(retry_elsewhere=self.several and tries < len(self.replicas.replicas), retire=retire)

    def moved(self) -> None:
        """A refused start was opened again on another replica."""
        self.stats.contexts_moved += 1

    # ------------------------------------------------------------ cancel and its ack
    def cancel_sent(self, context_id: str, now: float, timeout_s: float | None = None) -> float:
        """A ``cancel`` left for ``context_id``; returns the deadline for its ack."""
        limit = self.settings.cancel_ack_timeout_s if timeout_s is None else timeout_s
        self.stats.cancels += 1
        self._cancels[context_id] = pending = _PendingCancel(now, now + limit)
        return pending.deadline

    def ack_wait_s(self, context_id: str, now: float) -> float:
        """How long the transport may still wait for this cancel's ack (0: overdue or unknown)."""
        pending = self._cancels.get(context_id)
        return max(0.0, pending.deadline - now) if pending is not None else 0.0

    def acked(self, context_id: str, now: float, frames_dropped: int = 0) -> float | None:
        """The server acknowledged the cancel; returns its latency (None: not a cancel we track)."""
        pending = self._cancels.pop(context_id, None)
        if pending is None:
            return None
        latency = now - pending.sent_at
        self.stats.cancel_settled(acked=True, latency_s=latency, frames_dropped_server=frames_dropped)
        return latency

    def ack_overdue(self, context_id: str, now: float) -> bool:
        """Whether the cancel's ack deadline has passed. If so the connection cannot be trusted
        any more (a server that ignores a cancel may keep sending): the transport replaces it."""
        pending = self._cancels.get(context_id)
        if pending is None or now + _CLOCK_SLACK_S < pending.deadline:
            return False
        del self._cancels[context_id]
        self.stats.cancel_ack_timeouts += 1
        self.stats.cancel_settled(acked=False, latency_s=now - pending.sent_at)
        return True

    def overdue(self, now: float) -> list[str]:
        """Every tracked cancel whose ack deadline has passed (each settled as a timeout)."""
        return [cid for cid in list(self._cancels) if self.ack_overdue(cid, now)]

    def cancel_abandoned(self, context_id: str) -> None:
        """The connection went away before the ack: nothing is left to wait for."""
        if self._cancels.pop(context_id, None) is not None:
            self.stats.cancels_unacked += 1

    def awaiting_ack(self, context_id: str) -> bool:
        """Whether a cancel of ``context_id`` is still waiting for its ack."""
        return context_id in self._cancels

    @property
    def pending_cancels(self) -> int:
        return len(self._cancels)

    # ------------------------------------------------------------ drain and loss
    def draining(self, replica: Replica, now: float) -> None:
        """The server announced its drain: no new connection goes there for a while (new
        contexts on this connection go elsewhere; its live ones play to their end)."""
        self.replicas.mark_failed(replica, "draining", retry_after_s=self.settings.reconnect_backoff_max_s, now=now)

    @staticmethod
    def leave_now(session: ClientSession) -> bool:
        """Leave the connection now? Only when its server drains and no turn is live on it, so a
        connection is only ever replaced between turns."""
        return session.draining and not session.open_contexts

    def left(self) -> None:
        """A draining connection was replaced between turns."""
        self.stats.drains += 1

    def lost(self, replica: Replica, reason: str, *, retired: bool, contexts: int, now: float) -> None:
        """A connection died under its client (not closed by it). Its ``contexts`` live ones end
        with an error (their audio is never replayed); unless the connection was already being
        left, its replica is skipped for a while, so the next connection goes elsewhere."""
        self.stats.contexts_lost += contexts
        if not retired:
            self.replicas.mark_failed(replica, reason, now=now)
