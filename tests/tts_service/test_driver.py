"""The client driver alone: every connection rule with a hand-turned clock (no sockets, no loop)."""

from __future__ import annotations

import random
import warnings

import pytest

from tts_service import protocol as P
from tts_service.driver import ClientDriver, ConnectionSettings, StreamvoxStats, renamed_settings
from tts_service.replicas import ReplicaSet
from tts_service.session import ClientSession

URLS = ["ws://a:1/v1/stream", "ws://b:1/v1/stream", "ws://c:1/v1/stream"]


def _driver(urls: list[str] | str = URLS, **settings: float) -> ClientDriver:
    s = ConnectionSettings(**settings)  # type: ignore[arg-type]
    rs = ReplicaSet(
        urls, backoff_s=s.reconnect_backoff_s, max_backoff_s=s.reconnect_backoff_max_s, rng=random.Random(7)
    )
    return ClientDriver(rs, s)


def test_a_refusal_moves_the_start_to_the_next_replica_once_per_replica() -> None:
    d = _driver()
    a, b, c = d.replicas.replicas
    now = 100.0
    first = d.refused(a, P.ErrorCode.OVERLOADED, 2000, tries=1, now=now)
    assert first.retry_elsewhere and first.retire
    assert not a.up(now + 0.99) and a.reason == P.ErrorCode.OVERLOADED  # >= retry_after x 0.5 jitter
    # the refusing replica is no longer a candidate; the others are
    assert [r for r in d.replicas.replicas if r.up(now)] == [b, c]
    assert d.refused(b, P.ErrorCode.DRAINING, None, tries=2, now=now).retry_elsewhere
    last = d.refused(c, P.ErrorCode.OVERLOADED, None, tries=3, now=now)
    assert not last.retry_elsewhere and last.retire  # every replica had its chance: the caller hears it
    d.moved()
    assert d.stats.contexts_moved == 1


def test_a_refusal_with_one_replica_is_the_callers_unless_it_drains() -> None:
    d = _driver(URLS[0])
    (only,) = d.replicas.replicas
    full = d.refused(only, P.ErrorCode.OVERLOADED, 500, tries=1, now=0.0)
    assert not full.retry_elsewhere and not full.retire and only.failures == 0
    draining = d.refused(only, P.ErrorCode.DRAINING, 500, tries=1, now=0.0)
    assert not draining.retry_elsewhere and draining.retire  # its connection is left between turns
    other = _driver().refused(_driver().replicas.replicas[0], P.ErrorCode.UNKNOWN_VOICE, None, tries=1, now=0.0)
    assert not other.retry_elsewhere and not other.retire  # not a lack of room: nothing to retry


def test_when_every_replica_is_backed_off_the_last_attempt_tries_the_first_to_come_back() -> None:
    d = _driver()
    a, b, c = d.replicas.replicas
    for r, t in ((a, 5.0), (b, 1.0), (c, 3.0)):
        r.down_until = t
    assert d.candidates([], last_attempt=False) == []
    assert d.candidates([], last_attempt=True) == [b]
    assert d.candidates([c, a]) == [c, a]  # the set's own choice is kept


def test_a_failed_dial_backs_the_replica_off_and_a_good_one_resets_it() -> None:
    d = _driver()
    a = d.replicas.replicas[0]
    d.dial_failed(a, "refused", now=10.0)
    assert a.failures == 1 and not a.up(10.0) and a.up(10.0 + 1.5 * 0.2)
    d.dialled(a)
    assert a.failures == 0 and a.up(10.0) and d.stats.connections == 1 and d.stats.reconnects == 0
    d.dialled(a)
    assert d.stats.reconnects == 1


def test_backoff_doubles_per_failure_up_to_its_cap() -> None:
    d = _driver(URLS[0], reconnect_backoff_s=0.25, reconnect_backoff_max_s=2.0)
    now = 50.0
    delays = []
    for _ in range(6):
        delays.append(d.placement_failed(now))
        assert not d.may_connect(now) and d.may_connect(now + delays[-1])
    assert delays == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    d.dialled(d.replicas.replicas[0])
    assert d.connect_failures == 0 and d.may_connect(now)
    # within one connect: the jittered back-off (0.5-1.5x) of the attempt, growing the same way
    tries = [d.retry_delay(attempt, now) for attempt in range(5)]
    for attempt, wait in enumerate(tries):
        base = min(2.0, 0.25 * 2**attempt)
        assert 0.5 * base <= wait <= 1.5 * base


def test_with_several_replicas_a_retry_waits_until_one_is_out_of_its_backoff() -> None:
    d = _driver(reconnect_backoff_s=0.01)
    for r in d.replicas.replicas:
        r.down_until = 13.0
    assert d.retry_delay(0, now=10.0) == pytest.approx(3.0)


def test_an_unacknowledged_cancel_condemns_the_connection_at_its_deadline() -> None:
    d = _driver(cancel_ack_timeout_s=0.5)
    deadline = d.cancel_sent("c1", now=1.0)
    assert deadline == 1.5 and d.ack_wait_s("c1", 1.2) == pytest.approx(0.3) and d.awaiting_ack("c1")
    assert not d.ack_overdue("c1", 1.2)  # still in time: keep waiting
    assert d.ack_overdue("c1", 1.4995)  # a timer that fires a tick early still counts
    assert d.ack_wait_s("c1", 1.6) == 0.0 and not d.ack_overdue("c1", 2.0) and not d.awaiting_ack("c1")  # settled once
    assert (d.stats.cancels, d.stats.cancel_ack_timeouts, d.stats.cancels_unacked, d.stats.cancel_acks) == (1, 1, 1, 0)
    # a per-cancel timeout, and polling for every overdue cancel at once
    d.cancel_sent("c2", now=3.0, timeout_s=0.1)
    d.cancel_sent("c3", now=3.0)
    assert d.overdue(3.2) == ["c2"] and d.pending_cancels == 1


def test_an_ack_in_time_is_counted_with_its_latency() -> None:
    d = _driver()
    d.cancel_sent("c1", now=2.0)
    assert d.acked("c1", now=2.04, frames_dropped=3) == pytest.approx(0.04)
    assert not d.ack_overdue("c1", now=9.0)
    assert d.acked("c1", now=9.0) is None  # a second ack (or a stray one) changes nothing
    s = d.stats
    assert s.cancel_acks == s.cancels_acked == 1 and s.frames_dropped_server == 3
    assert list(s.cancel_ack_s) == list(s.cancel_ack_latency_s) == [pytest.approx(0.04)]
    d.cancel_sent("c2", now=3.0)
    d.cancel_abandoned("c2")  # the connection went first
    assert s.cancels_unacked == 1 and s.cancel_ack_timeouts == 0 and d.pending_cancels == 0


def test_a_draining_replica_is_left_between_turns_only() -> None:
    d = _driver()
    a = d.replicas.replicas[0]
    session = ClientSession({"max_contexts": 4})
    live, _ = session.start("turn-1")
    assert not d.leave_now(session)  # not draining
    session.receive_message({"type": "draining", "retry_after_ms": 1000})
    d.draining(a, now=0.0)
    assert not a.up(0.0 + 0.5 * 5.0 - 0.01)  # skipped for about the back-off cap
    assert not d.leave_now(session)  # a turn is live: it plays to its end
    session.receive_message({"type": "done", "context_id": "turn-1", "frames": 0, "audio_ms": 0})
    assert live.done and d.leave_now(session)
    d.left()
    assert d.stats.drains == 1


def test_a_lost_connection_backs_off_its_replica_unless_it_was_being_left() -> None:
    d = _driver()
    a, b, _ = d.replicas.replicas
    d.lost(a, "reset", retired=False, contexts=2, now=0.0)
    d.lost(b, "closed after its drain", retired=True, contexts=0, now=0.0)
    assert a.failures == 1 and b.failures == 0 and d.stats.contexts_lost == 2


def test_one_stats_type_with_every_name_users_read() -> None:
    s = StreamvoxStats()
    s.cancel_settled(acked=True, latency_s=0.01, frames_dropped_server=2)
    s.cancel_settled(acked=False, latency_s=1.0)
    s.connections = 3
    assert (s.cancel_acks, s.cancels_acked, s.cancels_unacked, s.reconnects) == (1, 1, 1, 2)
    for _ in range(1500):
        s.cancel_settled(acked=True, latency_s=0.0)
    assert len(s.cancel_ack_latency_s) == 1000  # bounded


def test_old_setting_names_are_accepted_with_a_warning() -> None:
    new = {"cancel_ack_timeout_s": 1.0, "reconnect_backoff_s": 0.2}
    with pytest.warns(DeprecationWarning, match=r"cancel_timeout=.*cancel_ack_timeout_s"):
        out = renamed_settings("TTSClient", {"cancel_timeout": 0.3}, new)
    assert out == {"cancel_ack_timeout_s": 0.3, "reconnect_backoff_s": 0.2} and new["cancel_ack_timeout_s"] == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert renamed_settings("TTSClient", {}, new) == new
    with pytest.raises(TypeError, match="unexpected keyword argument 'cancel_timout'"):
        renamed_settings("TTSClient", {"cancel_timout": 0.3}, new)
    with pytest.raises(TypeError, match="'open_timeout'"):  # an old name this client never had
        renamed_settings("StreamvoxTTS", {"open_timeout": 1.0}, new)
