"""What the demo room accepts: who may call (Host, Origin, Twilio's signature), how big a request
may be, how many calls at once, and how long each half-open thing may wait.

Why a module of its own: the room (``pipelines.pipecat_room``) builds a whole agent pipeline per
call, tens of MB and a TTS socket each, so every door into it is a resource a stranger can hold.
A web page anywhere can POST to ``localhost`` (a ``text/plain`` POST needs no CORS preflight) and
open WebSockets to it, and DNS rebinding gives such a page our ``Host`` too. The checks here are
pure functions of the request's headers and the settings, so that the room stays about
transports and each rule can be tested alone.

Settings (environment, read by :meth:`RoomLimits.from_env`):

* ``STREAMVOX_MAX_CALLS``: calls at once, browser and phone together (default: one per CPU core:
  every call's VAD, Whisper, LLM and TTS share the cores; the local LLM interleaves up to four
  requests, but each further call still slows the others);
* ``STREAMVOX_ALLOWED_HOSTS``: host names besides the loopback names that the ``Host`` header
  may carry (a public tunnel's name, a LAN address; ``*``: any);
* ``STREAMVOX_ALLOWED_ORIGINS``: page origins besides the page's own (``https://app.example``);
* ``TWILIO_AUTH_TOKEN``: when set, ``/ws`` requires a valid ``X-Twilio-Signature``
  (``STREAMVOX_TWILIO_SIGNATURE=off`` turns that off); ``STREAMVOX_PUBLIC_URL`` is the URL
  Twilio dials (``wss://host``) when a proxy rewrites the ``Host`` header.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from pipelines.persona import env_number

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
MAX_CALLS_LIMIT = 1000


def default_max_calls() -> int:
    """One call per CPU core: the calls' STT, LLM and TTS share the cores, and the local LLM's
    interleaved requests each slow the others (docs/BENCHMARKS.md, issue 22's sections)."""
    return max(1, os.cpu_count() or 1)


class Refusal(Exception):
    """A request the room will not serve: an HTTP status (or WebSocket close code) and why."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class RoomLimits:
    """The room's bounds; every field has a safe default (``from_env`` reads the settings)."""

    max_calls: int = field(default_factory=default_max_calls)
    max_body_bytes: int = 64 * 1024  # an SDP offer with video and candidates is a few KB
    max_sessions: int = 256  # /start sessions waiting for their offer
    session_ttl_s: float = 300.0  # a /start session unused this long is dropped
    connect_timeout_s: float = 20.0  # an answered offer whose WebRTC has not connected by then is reaped
    ws_start_timeout_s: float = 10.0  # a /ws that has not sent Twilio's `start` by then is closed
    max_waiting_sockets: int = 64  # /ws sockets waiting for their `start` at once; more are refused
    allowed_hosts: frozenset[str] = LOOPBACK_HOSTS  # "*" in it: any host
    allowed_origins: frozenset[str] = frozenset()
    twilio_auth_token: str | None = None  # set: /ws requires X-Twilio-Signature
    public_url: str | None = None  # the base URL Twilio dials, when a proxy rewrites Host

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ, *, bind_host: str | None = None) -> RoomLimits:
        """The settings above; ValueError with a one-line reason for a bad one. ``bind_host``: the
        address the room listens on, allowed as a Host when it is a name rather than a wildcard."""
        max_calls = env_number(
            "STREAMVOX_MAX_CALLS",
            None,
            low=1,
            high=MAX_CALLS_LIMIT,
            what=f"a whole number of calls within [1, {MAX_CALLS_LIMIT}]",
            env=env,
        )
        if max_calls is not None and max_calls != int(max_calls):
            raise ValueError(f"STREAMVOX_MAX_CALLS must be a whole number, got {env['STREAMVOX_MAX_CALLS']!r}")
        hosts = set(LOOPBACK_HOSTS) | _words(env.get("STREAMVOX_ALLOWED_HOSTS", ""))
        if bind_host and bind_host not in ("0.0.0.0", "::", ""):
            hosts.add(bind_host.lower().strip("[]"))
        origins = set()
        for origin in _words(env.get("STREAMVOX_ALLOWED_ORIGINS", "")):
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
                raise ValueError(f"STREAMVOX_ALLOWED_ORIGINS takes origins like https://app.example, got {origin!r}")
            origins.add(f"{parts.scheme}://{parts.netloc}")
        check = env.get("STREAMVOX_TWILIO_SIGNATURE", "").strip().lower()
        if check not in ("", "on", "off"):
            raise ValueError(f"STREAMVOX_TWILIO_SIGNATURE must be 'on' or 'off', got {check!r}")
        token = env.get("TWILIO_AUTH_TOKEN", "").strip() or None
        if check == "on" and token is None:
            raise ValueError("STREAMVOX_TWILIO_SIGNATURE=on needs TWILIO_AUTH_TOKEN")
        public_url = env.get("STREAMVOX_PUBLIC_URL", "").strip().rstrip("/") or None
        if public_url and urlsplit(public_url).scheme not in ("ws", "wss", "http", "https"):
            raise ValueError(f"STREAMVOX_PUBLIC_URL must be a URL like wss://host, got {public_url!r}")
        return cls(
            max_calls=int(max_calls) if max_calls is not None else default_max_calls(),
            allowed_hosts=frozenset(hosts),
            allowed_origins=frozenset(origins),
            twilio_auth_token=None if check == "off" else token,
            public_url=public_url,
        )

    # ------------------------------------------------------------ who may call

    def check_host(self, host_header: str | None) -> None:
        """The ``Host`` must name this machine (DNS rebinding gives a foreign page any other name)."""
        if "*" in self.allowed_hosts:
            return
        name = host_name(host_header or "")
        if name not in self.allowed_hosts:
            raise Refusal(
                403, f"Host {host_header!r} is not served here; allow it with STREAMVOX_ALLOWED_HOSTS (comma-separated)"
            )

    def check_origin(self, origin: str | None, host_header: str | None) -> None:
        """A request from a page must come from our own page (same host and port) or an allowed
        origin. No ``Origin``: not a browser's cross-site request (a script, Twilio), allowed."""
        if origin is None:
            return
        if origin in self.allowed_origins:
            return
        parts = urlsplit(origin)
        if parts.scheme in ("http", "https") and parts.netloc and parts.netloc.lower() == (host_header or "").lower():
            return
        raise Refusal(
            403,
            f"requests from the page at {origin!r} are refused; allow it with STREAMVOX_ALLOWED_ORIGINS",
        )

    def check_twilio(self, signature: str | None, host_header: str | None, path: str, query: str) -> None:
        """With a Twilio token, the phone socket must carry Twilio's signature of the URL it dialled."""
        if self.twilio_auth_token is None:
            return
        if not signature:
            raise Refusal(403, "this phone endpoint takes calls from Twilio only (no X-Twilio-Signature)")
        base = self.public_url or f"wss://{host_header or ''}"
        url = f"{base}{path}" + (f"?{query}" if query else "")
        candidates = {url}
        if base.startswith("wss://"):  # Twilio dials wss; a plain-ws URL in TwiML is refused by Twilio itself
            candidates.add("https://" + url[len("wss://") :])
        if not any(hmac.compare_digest(twilio_signature(self.twilio_auth_token, u), signature) for u in candidates):
            raise Refusal(403, "the X-Twilio-Signature does not match this URL and TWILIO_AUTH_TOKEN")


def twilio_signature(token: str, url: str, params: Mapping[str, str] | None = None) -> str:
    """Twilio's request signature: base64 HMAC-SHA1, keyed by the auth token, of the URL followed
    by each POST parameter's name and value in name order (none for a WebSocket handshake)."""
    data = url + "".join(f"{k}{v}" for k, v in sorted((params or {}).items()))
    return base64.b64encode(hmac.new(token.encode(), data.encode(), hashlib.sha1).digest()).decode()


def host_name(host_header: str) -> str:
    """``localhost:7860`` -> ``localhost``; ``[::1]:7860`` -> ``::1``."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _words(raw: str) -> set[str]:
    return {w.strip().lower().strip("[]") for w in raw.split(",") if w.strip()}


# ---------------------------------------------------------------- request bodies


def is_json(content_type: str | None) -> bool:
    """``application/json`` (any parameters): a browser cannot send it cross-site without a preflight."""
    return (content_type or "").split(";", 1)[0].strip().lower() == "application/json"


async def read_json(request, max_bytes: int):
    """The JSON body of a Starlette request, at most ``max_bytes``; a :class:`Refusal` otherwise."""
    import json

    if not is_json(request.headers.get("content-type")):
        raise Refusal(415, "the body must be JSON (Content-Type: application/json)")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise Refusal(413, f"the body is over {max_bytes} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise Refusal(413, f"the body is over {max_bytes} bytes")
    try:
        return json.loads(body) if body else {}
    except ValueError as exc:
        raise Refusal(400, f"the body is not JSON ({exc})") from None


def check_offer(data) -> dict:
    """An SDP offer as the room takes it: ``sdp`` text that looks like SDP with an audio section,
    ``type`` "offer", optional string ``pc_id`` and boolean ``restart_pc``. Checked before anything
    is built for it (aiortc accepts ``"x"`` as an offer with no media)."""
    if not isinstance(data, dict):
        raise Refusal(400, "expected an SDP offer: a JSON object with sdp and type")
    sdp, kind = data.get("sdp"), data.get("type")
    if kind != "offer":
        raise Refusal(400, f"expected type 'offer', got {kind!r}")
    if not isinstance(sdp, str) or not sdp.lstrip().startswith("v=0"):
        raise Refusal(400, "sdp must be the text of an SDP offer (starting 'v=0')")
    if "\nm=audio " not in sdp.replace("\r\n", "\n"):
        raise Refusal(400, "the SDP offer has no audio section (m=audio)")
    pc_id, restart = data.get("pc_id"), data.get("restart_pc")
    if pc_id is not None and not isinstance(pc_id, str):
        raise Refusal(400, f"pc_id must be a string or null, got {pc_id!r}")
    if restart is not None and not isinstance(restart, bool):
        raise Refusal(400, f"restart_pc must be true, false or null, got {restart!r}")
    return {"sdp": sdp, "type": kind, "pc_id": pc_id, "restart_pc": restart}


def check_candidates(data) -> tuple[str, list[dict]]:
    """ICE candidates for ``PATCH``: ``pc_id`` and a list of {candidate, sdp_mid, sdp_mline_index}."""
    if not isinstance(data, dict) or not isinstance(data.get("pc_id"), str):
        raise Refusal(400, "expected candidates: a JSON object with pc_id (a string) and candidates")
    items = data.get("candidates", [])
    if not isinstance(items, list):
        raise Refusal(400, "candidates must be a list")
    out = []
    for c in items:
        if not isinstance(c, dict):
            raise Refusal(400, f"each candidate must be an object, got {c!r}")
        cand, mid, index = c.get("candidate"), c.get("sdp_mid"), c.get("sdp_mline_index")
        if not isinstance(cand, str) or (cand and len(cand.split()) < 8):
            raise Refusal(400, f"not an ICE candidate line: {cand!r}")
        if not isinstance(mid, str) or not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise Refusal(400, "each candidate needs sdp_mid (a string) and sdp_mline_index (an integer >= 0)")
        out.append({"candidate": cand, "sdp_mid": mid, "sdp_mline_index": index})
    return data["pc_id"], out
