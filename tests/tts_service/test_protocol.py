"""The wire format alone: frame headers and validation of every client message."""

from __future__ import annotations

import json

import pytest

from tts_service import protocol as P
from tts_service.protocol import ErrorCode, Limits, MsgType, ProtocolError


@pytest.mark.parametrize(("stream", "seq"), [(0, 0), (1, 0), (7, 123), (2**32 - 1, 2**32 - 1)])
@pytest.mark.parametrize("payload", [b"", b"\x00\x01", bytes(range(256)) * 8])
def test_frame_round_trip(stream: int, seq: int, payload: bytes) -> None:
    data = P.pack_frame(stream, seq, payload)
    assert len(data) == P.HEADER_SIZE + len(payload) == 8 + len(payload)
    assert data[:4] == stream.to_bytes(4, "little") and data[4:8] == seq.to_bytes(4, "little")
    assert P.unpack_frame(data) == (stream, seq, payload)


def test_short_frame_is_refused() -> None:
    with pytest.raises(ValueError, match="header"):
        P.unpack_frame(b"\x01\x02\x03")


def test_client_messages_round_trip() -> None:
    msg = P.parse_client_message(
        P.start("c1", voice="v", sample_rate=16000, encoding="mulaw", pace=False, text="Hi there.")
    )
    assert (msg.type, msg.context_id, msg.voice, msg.sample_rate, msg.encoding, msg.pace, msg.text) == (
        MsgType.START,
        "c1",
        "v",
        16000,
        "mulaw",
        False,
        "Hi there.",
    )
    assert P.parse_client_message(P.text("c1", "more")).text == "more"
    for build, mtype in ((P.flush, MsgType.FLUSH), (P.end, MsgType.END), (P.cancel, MsgType.CANCEL)):
        parsed = P.parse_client_message(build("c1"))
        assert (parsed.type, parsed.context_id) == (mtype, "c1")
    assert P.parse_client_message(P.ping({"n": 1})).ping_id == {"n": 1}
    # a start with only a context id takes the defaults
    bare = P.parse_client_message(P.start("c2"))
    assert (bare.voice, bare.sample_rate, bare.encoding, bare.pace, bare.text) == (None,) * 5


def test_server_messages_are_well_formed() -> None:
    ready = json.loads(P.ready(22050, ["a"], 16))
    assert ready == {"type": "ready", "protocol": 1, "sample_rate": 22050, "voices": ["a"], "max_contexts": 16}
    words = json.loads(P.words("c", [("Hello", 0.012345, 0.5)]))
    assert words["words"] == [{"word": "Hello", "start": 0.0123, "end": 0.5}]
    err = json.loads(P.error(ErrorCode.OVERLOADED, "busy", "c", retry_after_ms=500))
    assert err == {"type": "error", "code": "overloaded", "message": "busy", "context_id": "c", "retry_after_ms": 500}
    assert "context_id" not in json.loads(P.error(ErrorCode.BAD_REQUEST, "x"))
    assert P.parse_server_message(P.cancelled("c", 3)) == {"type": "cancelled", "context_id": "c", "frames_dropped": 3}
    with pytest.raises(ValueError):
        P.parse_server_message("[1, 2]")


BAD = [
    ("{not json", ErrorCode.BAD_REQUEST, None),
    ("", ErrorCode.BAD_REQUEST, None),
    ("[1, 2, 3]", ErrorCode.BAD_REQUEST, None),
    ('"start"', ErrorCode.BAD_REQUEST, None),
    ("null", ErrorCode.BAD_REQUEST, None),
    ("{}", ErrorCode.BAD_REQUEST, None),
    ('{"type": 5, "context_id": "c"}', ErrorCode.BAD_REQUEST, None),
    ('{"type": "dance", "context_id": "c"}', ErrorCode.BAD_REQUEST, None),
    ('{"type": "ready"}', ErrorCode.BAD_REQUEST, None),  # a server type from a client
    ('{"type": "text", "text": "hi"}', ErrorCode.BAD_REQUEST, None),
    ('{"type": "cancel"}', ErrorCode.BAD_REQUEST, None),
    ('{"type": "start", "context_id": ""}', ErrorCode.BAD_REQUEST, None),
    ('{"type": "start", "context_id": 7}', ErrorCode.BAD_REQUEST, None),
    (json.dumps({"type": "end", "context_id": "x" * 129}), ErrorCode.BAD_REQUEST, None),
    ('{"type": "text", "context_id": "c"}', ErrorCode.BAD_REQUEST, "c"),
    ('{"type": "text", "context_id": "c", "text": 5}', ErrorCode.BAD_REQUEST, "c"),
    (json.dumps({"type": "text", "context_id": "c", "text": "a" * 10_001}), ErrorCode.TEXT_TOO_LONG, "c"),
    (json.dumps({"type": "start", "context_id": "c", "text": "a" * 10_001}), ErrorCode.TEXT_TOO_LONG, "c"),
    ('{"type": "start", "context_id": "c", "sample_rate": "16000"}', ErrorCode.BAD_REQUEST, "c"),
    ('{"type": "start", "context_id": "c", "sample_rate": true}', ErrorCode.BAD_REQUEST, "c"),
    ('{"type": "start", "context_id": "c", "sample_rate": 16000.0}', ErrorCode.BAD_REQUEST, "c"),
    ('{"type": "start", "context_id": "c", "sample_rate": 12345}', ErrorCode.BAD_REQUEST, "c"),
    ('{"type": "start", "context_id": "c", "encoding": "mp3"}', ErrorCode.BAD_REQUEST, "c"),
    ('{"type": "start", "context_id": "c", "encoding": "wav"}', ErrorCode.BAD_REQUEST, "c"),  # HTTP only
    ('{"type": "start", "context_id": "c", "encoding": 1}', ErrorCode.BAD_REQUEST, "c"),
    ('{"type": "start", "context_id": "c", "pace": "yes"}', ErrorCode.BAD_REQUEST, "c"),
    ('{"type": "start", "context_id": "c", "pace": 1}', ErrorCode.BAD_REQUEST, "c"),
    ('{"type": "start", "context_id": "c", "voice": ["a"]}', ErrorCode.BAD_REQUEST, "c"),
]


@pytest.mark.parametrize(("raw", "code", "context_id"), BAD)
def test_bad_client_messages(raw: str, code: str, context_id: str | None) -> None:
    with pytest.raises(ProtocolError) as info:
        P.parse_client_message(raw)
    assert info.value.code == code
    assert info.value.context_id == context_id
    assert info.value.message  # says what is wrong


def test_limits_are_configurable() -> None:
    limits = Limits(max_text_chars=5, max_context_id_chars=3)
    assert P.parse_client_message(P.text("abc", "12345"), limits).text == "12345"
    with pytest.raises(ProtocolError) as info:
        P.parse_client_message(P.text("abc", "123456"), limits)
    assert info.value.code == ErrorCode.TEXT_TOO_LONG
    with pytest.raises(ProtocolError):
        P.parse_client_message(P.text("abcd", "1"), limits)


def test_every_supported_format_is_accepted() -> None:
    for rate in P.SAMPLE_RATES:
        for encoding in P.WS_ENCODINGS:
            msg = P.parse_client_message(P.start("c", sample_rate=rate, encoding=encoding))
            assert (msg.sample_rate, msg.encoding) == (rate, encoding)
    for encoding in P.HTTP_ENCODINGS:
        P.validate_format(16000, encoding, P.HTTP_ENCODINGS)
