"""Wire protocol v1 of the streamvox streaming TTS service: the single definition.

Server, client, plug-ins and the bench import everything that touches the wire from here, so
that a message type is spelled once and a frame header is packed in one place. The normative
description for humans is ``docs/protocol.md``; keep the two in step.

Audio travels as binary WebSocket messages with an 8-byte little-endian header
(``uint32 stream``, ``uint32 seq``) followed by the samples. The ``stream`` number (not the
string context id) tags audio so that a client can drop frames of a cancelled or unknown
context without parsing JSON, and so that a context id reused by the client can never receive
audio of its previous incarnation.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any, Final

PROTOCOL_VERSION: Final = 1
DEFAULT_PORT: Final = 8765
WS_PATH: Final = "/v1/stream"
HTTP_TTS_PATH: Final = "/v1/tts"
ADMIN_DRAIN_PATH: Final = "/v1/admin/drain"

HEADER = struct.Struct("<II")
HEADER_SIZE: Final = HEADER.size

# Encodings a client may ask for. "wav" is HTTP-only (a streaming WAV header precedes PCM).
PCM_S16LE: Final = "pcm_s16le"
MULAW: Final = "mulaw"
WAV: Final = "wav"
WS_ENCODINGS: Final = (PCM_S16LE, MULAW)
HTTP_ENCODINGS: Final = (PCM_S16LE, WAV, MULAW)
SAMPLE_RATES: Final = (8000, 16000, 22050, 24000, 44100, 48000)
# A context's speaking rate relative to the voice's own (``start``'s optional ``speed``). The wire
# takes OpenAI's range; an engine may render a narrower one well (docs/compat.md says Piper's).
SPEED_RANGE: Final = (0.25, 4.0)


class MsgType:
    """Message ``type`` values; the only place they are spelled."""

    # client -> server
    START = "start"
    TEXT = "text"
    FLUSH = "flush"
    END = "end"
    CANCEL = "cancel"
    PING = "ping"
    # server -> client
    READY = "ready"
    STARTED = "started"
    WORDS = "words"
    DONE = "done"
    CANCELLED = "cancelled"
    ERROR = "error"
    PONG = "pong"
    DRAINING = "draining"


CLIENT_TYPES: Final = frozenset({MsgType.START, MsgType.TEXT, MsgType.FLUSH, MsgType.END, MsgType.CANCEL, MsgType.PING})


class ErrorCode:
    """``error.code`` values."""

    BAD_REQUEST = "bad_request"
    UNKNOWN_VOICE = "unknown_voice"
    TEXT_TOO_LONG = "text_too_long"
    TOO_MANY_CONTEXTS = "too_many_contexts"
    OVERLOADED = "overloaded"
    INTERNAL = "internal"
    UNAUTHORIZED = "unauthorized"
    DRAINING = "draining"  # the server is shutting down: open the context elsewhere (retry_after_ms)
    SHUTTING_DOWN = "shutting_down"  # the drain deadline cut this live context off


class CloseCode:
    """WebSocket close codes the server uses (RFC 6455 section 7.4.1), each with a reason text."""

    GOING_AWAY = 1001  # the server drained and is shutting down: reconnect (elsewhere)
    POLICY = 1008  # the client let the server's send queue overflow (it does not read)
    TOO_BIG = 1009  # one message over ``Limits.max_message_bytes``


# Python's json accepts NaN/Infinity and turns 1e400 into inf, neither of which strict parsers
# (browsers, serde, Go) accept back; integers beyond this many digits cannot even be converted.
MAX_INT_DIGITS: Final = 4300
MAX_PING_ID_CHARS: Final = 1024  # the JSON of a ping id; the pong echoes it, so it is bounded


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-connection limits; defaults are the protocol's documented defaults."""

    max_text_chars: int = 10_000
    max_context_chars: int = 100_000
    max_contexts: int = 16
    max_context_id_chars: int = 128
    # Messages up to this many bytes are read and answered (text_too_long, bad_request); a bigger
    # one closes the connection with 1009. It must hold max_text_chars characters escaped as
    # \uXXXX pairs (12 bytes each), so the server takes the larger of the two.
    max_message_bytes: int = 2 * 1024 * 1024

    def message_cap(self) -> int:
        """The hard cap in bytes on one WebSocket message (and one HTTP body)."""
        return max(self.max_message_bytes, 12 * self.max_text_chars + 4096)


class ProtocolError(Exception):
    """A client message that cannot be honoured; becomes one ``error`` message, never a close."""

    def __init__(self, code: str, message: str, context_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.context_id = context_id
        self.msg_type: str | None = None  # the refused message's type, once it is known


# ---------------------------------------------------------------- client -> server


@dataclass(slots=True)
class ClientMessage:
    """A validated client message. Fields that a type does not use stay at their defaults."""

    type: str
    context_id: str | None = None
    text: str | None = None
    voice: str | None = None
    sample_rate: int | None = None
    encoding: str | None = None
    pace: bool | None = None
    speed: float | None = None
    ping_id: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


def _opt(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], ctx: str | None) -> Any:
    value = obj.get(key)
    if value is None:
        return None
    # bool is an int in Python; refuse True as a sample rate.
    if isinstance(value, bool) and kind is int:
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"'{key}' must be an integer", ctx)
    if not isinstance(value, kind):
        name = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"'{key}' must be of type {name}", ctx)
    return value


def _refuse_constant(name: str) -> Any:
    raise ProtocolError(ErrorCode.BAD_REQUEST, f"{name} is not valid JSON; send finite numbers only")


def _finite_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"number {token[:40]} is out of range (not a finite double)")
    return value


def _bounded_int(token: str) -> int:
    if len(token.lstrip("-")) > MAX_INT_DIGITS:
        raise ProtocolError(
            ErrorCode.BAD_REQUEST, f"an integer of {len(token)} digits is too long (at most {MAX_INT_DIGITS})"
        )
    return int(token)


def loads_strict(raw: str | bytes) -> Any:
    """``json.loads`` that refuses what could not be sent back as strict JSON: NaN, Infinity,
    numbers that overflow a double, integers too long to convert (raises :class:`ProtocolError`)."""
    try:
        return json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_bounded_int)
    except (ValueError, RecursionError):
        raise ProtocolError(ErrorCode.BAD_REQUEST, "message is not valid JSON") from None


def check_text(text: str, ctx: str | None = None) -> None:
    """Refuse text the phonemizer cannot take: NUL characters and lone UTF-16 surrogates."""
    if "\x00" in text:
        raise ProtocolError(ErrorCode.BAD_REQUEST, "text contains a NUL character (\\u0000); remove it", ctx)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ProtocolError(
            ErrorCode.BAD_REQUEST,
            f"text contains a lone surrogate (\\u{ord(text[exc.start]):04x}) at position {exc.start};"
            " send valid Unicode",
            ctx,
        ) from None


def _ping_id(value: Any) -> Any:
    try:
        encoded = json.dumps(value, allow_nan=False, ensure_ascii=False)
        encoded.encode("utf-8")
    except (ValueError, UnicodeEncodeError):
        raise ProtocolError(ErrorCode.BAD_REQUEST, "ping 'id' must be valid Unicode JSON") from None
    if len(encoded) > MAX_PING_ID_CHARS:
        raise ProtocolError(
            ErrorCode.BAD_REQUEST, f"ping 'id' is {len(encoded)} characters of JSON; at most {MAX_PING_ID_CHARS}"
        )
    return value


def parse_client_message(raw: str, limits: Limits = Limits()) -> ClientMessage:
    """Parse and validate one client text message; raise :class:`ProtocolError` on bad input."""
    obj = loads_strict(raw)
    mtype = obj.get("type") if isinstance(obj, dict) else None
    try:
        return _validate(obj, limits)
    except ProtocolError as exc:
        exc.msg_type = mtype if isinstance(mtype, str) else None
        raise


def _validate(obj: Any, limits: Limits) -> ClientMessage:
    if not isinstance(obj, dict):
        raise ProtocolError(ErrorCode.BAD_REQUEST, "message must be a JSON object")
    mtype = obj.get("type")
    if not isinstance(mtype, str):
        raise ProtocolError(ErrorCode.BAD_REQUEST, "message needs a string 'type'")
    if mtype not in CLIENT_TYPES:
        raise ProtocolError(
            ErrorCode.BAD_REQUEST,
            f"unknown message type {mtype!r}; expected one of {sorted(CLIENT_TYPES)}",
        )
    if mtype == MsgType.PING:
        return ClientMessage(type=mtype, ping_id=_ping_id(obj.get("id")))

    ctx = obj.get("context_id")
    if not isinstance(ctx, str) or not ctx:
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"'{mtype}' needs a non-empty string 'context_id'")
    if len(ctx) > limits.max_context_id_chars:
        raise ProtocolError(
            ErrorCode.BAD_REQUEST, f"'context_id' is longer than {limits.max_context_id_chars} characters"
        )
    try:  # the id is echoed in replies: it must be valid Unicode (no lone surrogates)
        ctx.encode("utf-8")
    except UnicodeEncodeError:
        raise ProtocolError(
            ErrorCode.BAD_REQUEST, "'context_id' contains a lone surrogate; send valid Unicode"
        ) from None
    msg = ClientMessage(type=mtype, context_id=ctx)
    if mtype in (MsgType.START, MsgType.TEXT):
        text = _opt(obj, "text", str, ctx)
        if mtype == MsgType.TEXT and text is None:
            raise ProtocolError(ErrorCode.BAD_REQUEST, "'text' message needs a string 'text'", ctx)
        if text is not None and len(text) > limits.max_text_chars:
            raise ProtocolError(
                ErrorCode.TEXT_TOO_LONG,
                f"text of {len(text)} characters exceeds the limit of {limits.max_text_chars} per message;"
                " send it in several 'text' messages",
                ctx,
            )
        if text is not None:
            check_text(text, ctx)
        msg.text = text
    if mtype == MsgType.START:
        msg.voice = _opt(obj, "voice", str, ctx)
        msg.sample_rate = _opt(obj, "sample_rate", int, ctx)
        msg.encoding = _opt(obj, "encoding", str, ctx)
        msg.pace = _opt(obj, "pace", bool, ctx)
        validate_format(msg.sample_rate, msg.encoding, WS_ENCODINGS, ctx)
        msg.speed = validate_speed(obj.get("speed"), ctx)
    return msg


def validate_speed(value: Any, ctx: str | None = None) -> float | None:
    """A ``speed`` as sent (``None``: the voice's own rate), checked against :data:`SPEED_RANGE`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(ErrorCode.BAD_REQUEST, "'speed' must be a number (1.0: the voice's own rate)", ctx)
    lo, hi = SPEED_RANGE
    if not lo <= value <= hi:
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"'speed' {value} is outside {lo}..{hi}", ctx)
    return float(value)


def validate_format(
    sample_rate: int | None, encoding: str | None, allowed: tuple[str, ...], ctx: str | None = None
) -> None:
    """Check an output format request; shared by the WebSocket and HTTP transports."""
    if sample_rate is not None and sample_rate not in SAMPLE_RATES:
        raise ProtocolError(
            ErrorCode.BAD_REQUEST, f"sample_rate {sample_rate} not supported; use one of {list(SAMPLE_RATES)}", ctx
        )
    if encoding is not None and encoding not in allowed:
        raise ProtocolError(
            ErrorCode.BAD_REQUEST, f"encoding {encoding!r} not supported; use one of {list(allowed)}", ctx
        )


def start(
    context_id: str,
    *,
    voice: str | None = None,
    sample_rate: int | None = None,
    encoding: str | None = None,
    pace: bool | None = None,
    text: str | None = None,
    speed: float | None = None,
) -> str:
    obj: dict[str, Any] = {"type": MsgType.START, "context_id": context_id}
    for key, value in (
        ("voice", voice),
        ("sample_rate", sample_rate),
        ("encoding", encoding),
        ("pace", pace),
        ("speed", speed),
        ("text", text),
    ):
        if value is not None:
            obj[key] = value
    return json.dumps(obj)


def text(context_id: str, text: str) -> str:
    return json.dumps({"type": MsgType.TEXT, "context_id": context_id, "text": text})


def flush(context_id: str) -> str:
    return json.dumps({"type": MsgType.FLUSH, "context_id": context_id})


def end(context_id: str) -> str:
    return json.dumps({"type": MsgType.END, "context_id": context_id})


def cancel(context_id: str) -> str:
    return json.dumps({"type": MsgType.CANCEL, "context_id": context_id})


def ping(ping_id: Any = None) -> str:
    return json.dumps({"type": MsgType.PING, "id": ping_id})


# ---------------------------------------------------------------- server -> client


def ready(sample_rate: int, voices: list[str], max_contexts: int) -> str:
    return json.dumps(
        {
            "type": MsgType.READY,
            "protocol": PROTOCOL_VERSION,
            "sample_rate": sample_rate,
            "voices": voices,
            "max_contexts": max_contexts,
        }
    )


def started(context_id: str, stream: int, sample_rate: int, encoding: str) -> str:
    return json.dumps(
        {
            "type": MsgType.STARTED,
            "context_id": context_id,
            "stream": stream,
            "sample_rate": sample_rate,
            "encoding": encoding,
        }
    )


def words(context_id: str, items: list[tuple[str, float, float]]) -> str:
    return json.dumps(
        {
            "type": MsgType.WORDS,
            "context_id": context_id,
            "words": [{"word": w, "start": round(s, 4), "end": round(e, 4)} for w, s, e in items],
        }
    )


def done(context_id: str, frames: int, audio_ms: float) -> str:
    return json.dumps(
        {"type": MsgType.DONE, "context_id": context_id, "frames": frames, "audio_ms": round(audio_ms, 2)}
    )


def cancelled(context_id: str, frames_dropped: int) -> str:
    return json.dumps({"type": MsgType.CANCELLED, "context_id": context_id, "frames_dropped": frames_dropped})


def error(code: str, message: str, context_id: str | None = None, **extra: Any) -> str:
    obj: dict[str, Any] = {"type": MsgType.ERROR, "code": code, "message": message}
    if context_id is not None:
        obj["context_id"] = context_id
    obj.update(extra)
    return json.dumps(obj)


def pong(ping_id: Any) -> str:
    # allow_nan=False: a non-finite id must fail here, loudly, rather than put NaN on the wire
    return json.dumps({"type": MsgType.PONG, "id": ping_id}, allow_nan=False)


def draining(retry_after_ms: int, deadline_ms: int) -> str:
    """The in-band shutdown notice: no new context here; live ones finish within ``deadline_ms``."""
    return json.dumps({"type": MsgType.DRAINING, "retry_after_ms": retry_after_ms, "deadline_ms": deadline_ms})


def pack_frame(stream: int, seq: int, payload: bytes) -> bytes:
    """One binary audio message: header + samples."""
    return HEADER.pack(stream, seq) + payload


def unpack_frame(data: bytes) -> tuple[int, int, bytes]:
    """Split a binary audio message into ``(stream, seq, payload)``."""
    if len(data) < HEADER_SIZE:
        raise ValueError(f"audio message of {len(data)} bytes is shorter than the {HEADER_SIZE}-byte header")
    stream, seq = HEADER.unpack_from(data)
    return stream, seq, data[HEADER_SIZE:]


def parse_server_message(raw: str) -> dict[str, Any]:
    """Decode a server JSON message (the client side does not re-validate every field)."""
    obj = json.loads(raw)
    if not isinstance(obj, dict) or "type" not in obj:
        raise ValueError(f"server sent a message without a type: {raw[:200]!r}")
    return obj
