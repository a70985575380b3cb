"""The I/O-free client session (tts_service.session): the state every client drives, fed with the
server's own message builders from tts_service.protocol. No sockets: each case is a few messages."""

from __future__ import annotations

import pytest

from tts_service import protocol as P
from tts_service.session import (
    Acked,
    Audio,
    ClientSession,
    Done,
    Draining,
    Failed,
    Pong,
    SessionError,
    Started,
    Unknown,
    Words,
    check_ready,
)

READY = P.ready(22050, ["joe"], 16)


def _session_with_live(context_id: str = "a", stream: int = 7) -> tuple[ClientSession, object]:
    session = ClientSession(check_ready(READY))
    ctx, start = session.start(context_id, text="Hello.", pace=True)
    assert '"type": "start"' in start and '"text": "Hello."' in start
    ev = session.receive(P.started(context_id, stream, 16000, P.PCM_S16LE))
    assert isinstance(ev, Started) and ev.ctx is ctx
    return session, ctx


def test_ready_is_checked() -> None:
    assert check_ready(READY)["max_contexts"] == 16
    with pytest.raises(SessionError, match="unexpected protocol"):
        check_ready('{"type": "ready", "protocol": 99}')
    with pytest.raises(SessionError):
        check_ready(b"\x00")
    with pytest.raises(SessionError):
        check_ready("not json")


def test_frames_are_attributed_by_stream_and_gated_after_cancel() -> None:
    session, ctx = _session_with_live()
    ev = session.receive(P.pack_frame(7, 0, b"\x01\x00" * 10))
    assert isinstance(ev, Audio) and ev.ctx is ctx and not ev.stale and ev.payload == b"\x01\x00" * 10
    assert ctx.frames == 1 and ctx.sample_rate == 16000

    cancel = session.cancel(ctx)
    assert cancel == P.cancel("a")
    assert session.cancel(ctx) is None, "one cancel on the wire per context"
    late = session.receive(P.pack_frame(7, 1, b"\x00\x00"))
    assert isinstance(late, Audio) and late.stale and late.ctx is ctx
    assert session.text(ctx, "more") is None, "late LLM tokens after a cancel are never sent"

    ack = session.receive(P.cancelled("a", 3))
    assert isinstance(ack, Acked) and ack.ctx is ctx and ack.frames_dropped == 3
    assert ctx.finished and ctx.outcome == "cancelled" and session.get("a") is None
    after = session.receive(P.pack_frame(7, 2, b"\x00\x00"))
    assert after.stale and after.ctx is ctx, "a frame after the ack stays attributable (the bench counts it)"
    assert ctx.dropped == 2 and session.frames_dropped == 2
    assert session.was_finished("a")


def test_unknown_streams_are_stale_and_counted() -> None:
    session = ClientSession()
    ev = session.receive(P.pack_frame(99, 0, b"\x00\x00"))
    assert isinstance(ev, Audio) and ev.ctx is None and ev.stale and session.frames_dropped == 1


def test_done_finishes_and_end_is_sent_once() -> None:
    session, ctx = _session_with_live()
    assert session.end(ctx) == P.end("a")
    assert session.end(ctx) is None and session.text(ctx, "x") is None and session.flush(ctx) is None
    words = session.receive(P.words("a", [("Hello", 0.0, 0.4)]))
    assert isinstance(words, Words) and words.words[0].word == "Hello" and words.words[0].end == 0.4
    done = session.receive(P.done("a", 12, 640.0))
    assert isinstance(done, Done) and done.ctx is ctx and ctx.done and ctx.audio_ms == 640.0
    assert session.open_contexts == []
    assert session.cancel(ctx) is None, "nothing to cancel on the server after done"
    assert ctx.gated


def test_errors_end_a_context_unless_the_server_says_otherwise() -> None:
    session, ctx = _session_with_live()
    soft = session.receive(P.error(P.ErrorCode.TEXT_TOO_LONG, "too long", "a", context_ended=False))
    assert isinstance(soft, Failed) and soft.ctx is ctx and not soft.ended and not ctx.finished
    hard = session.receive(P.error(P.ErrorCode.SHUTTING_DOWN, "deadline", "a", context_ended=True))
    assert isinstance(hard, Failed) and hard.ended and ctx.outcome == "error" and ctx.error is hard
    assert not hard.retry_elsewhere
    # an error for a context the session no longer has (a tombstoned id) touches nothing
    stray = session.receive(P.error(P.ErrorCode.BAD_REQUEST, "ended", "a", context_ended=True))
    assert isinstance(stray, Failed) and stray.ctx is None


@pytest.mark.parametrize("code", [P.ErrorCode.OVERLOADED, P.ErrorCode.DRAINING])
def test_a_refused_start_may_be_retried_elsewhere(code: str) -> None:
    session = ClientSession()
    ctx, _ = session.start("b")
    ev = session.receive(P.error(code, "no room", "b", retry_after_ms=250, context_ended=True))
    assert isinstance(ev, Failed) and ev.retry_elsewhere and ev.retry_after_ms == 250
    assert ctx.finished and not ctx.started
    assert session.draining is (code == P.ErrorCode.DRAINING)


def test_draining_notice_marks_the_connection() -> None:
    session, ctx = _session_with_live()
    ev = session.receive(P.draining(1000, 30000))
    assert isinstance(ev, Draining) and ev.retry_after_ms == 1000 and session.draining
    assert not ctx.finished, "live contexts finish on a draining connection"


def test_a_lost_connection_finishes_every_open_context() -> None:
    session, live = _session_with_live()
    opening, _ = session.start("b")
    lost = session.lose()
    assert set(lost) == {live, opening}
    assert all(c.outcome == "lost" for c in lost) and session.open_contexts == []


def test_ids_are_unique_while_open_and_reusable_after() -> None:
    session, ctx = _session_with_live()
    with pytest.raises(SessionError, match="already open"):
        session.start("a")
    session.receive(P.done("a", 1, 10.0))
    again, _ = session.start("a")
    assert again is not ctx and not again.finished


def test_pong_and_unknown_messages() -> None:
    session = ClientSession()
    assert session.receive(P.pong(5)) == Pong(5)
    ev = session.receive('{"type": "surprise"}')
    assert isinstance(ev, Unknown) and ev.msg["type"] == "surprise" and not ev.stray
    stray = session.receive(P.started("gone", 3, 16000, P.PCM_S16LE))  # an abandoned open's reply
    assert isinstance(stray, Unknown) and stray.stray
    assert session.messages == 3
    with pytest.raises(ValueError):
        session.receive("[]")
