"""The ``streamvox`` command: serve, say, bench, simulate.

Errors a user can fix (a missing voice file, a port in use, a server that is not running) are
printed as one line that says what to do, with exit status 2 - never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
import wave
from pathlib import Path

from . import engines
from . import protocol as P


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def _key_args(p: argparse.ArgumentParser, name: str, env: str, what: str) -> None:
    """``--NAME`` and ``--NAME-file``: a file (a mounted secret) or the variable keeps the key out
    of the process list, where ``--NAME KEY`` would show it."""
    p.add_argument(
        f"--{name}",
        default=os.environ.get(env),
        help=f"{what}; default: ${env}. Prefer --{name}-file or the variable: argv shows in the process list",
    )
    p.add_argument(
        f"--{name}-file",
        default=os.environ.get(f"{env}_FILE"),
        metavar="PATH",
        help=f"read the {name.replace('-', ' ')} from this file (a mounted secret; default: ${env}_FILE)",
    )


def _serve_args(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the streaming TTS server")
    p.add_argument("--host", default=os.environ.get("STREAMVOX_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("STREAMVOX_PORT", P.DEFAULT_PORT)))
    p.add_argument("--device", choices=["cpu", "cuda"], default=os.environ.get("STREAMVOX_DEVICE", "cpu"))
    p.add_argument("--threads", type=int, default=None, help="the engine's intra-op threads (default: all cores)")
    _key_args(p, "api-key", "STREAMVOX_API_KEY", "require 'Authorization: Bearer KEY' on /v1/* (none if unset)")
    _key_args(
        p,
        "admin-key",
        "STREAMVOX_ADMIN_KEY",
        "the key /v1/admin/* (drain) requires, not the API key (unset: admin off)",
    )
    p.add_argument(
        "--require-api-key",
        action="store_true",
        default=_env_flag("STREAMVOX_REQUIRE_API_KEY"),
        help="refuse to start without an API key (the image and the Kubernetes manifests set it: "
        "an open server is never the default there; env STREAMVOX_REQUIRE_API_KEY=1)",
    )
    p.add_argument(
        "--access-log",
        action="store_true",
        default=_env_flag("STREAMVOX_ACCESS_LOG"),
        help="log one line per request (logger streamvox.access; ?token= and ?api_key= values redacted; "
        "default off, env STREAMVOX_ACCESS_LOG=1)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=float(os.environ.get("STREAMVOX_DRAIN_TIMEOUT", 30)),
        metavar="S",
        help="on SIGTERM, how long live contexts may take to finish before they are cut off (default 30)",
    )
    p.add_argument("--lead-ms", type=int, default=400, help="how far paced streams run ahead of playback")
    p.add_argument("--max-streams", type=int, default=None, help="hard cap on concurrent streams")
    p.add_argument("--max-contexts", type=int, default=16, help="live contexts per connection")
    p.add_argument(
        "--voice-map",
        default=os.environ.get("STREAMVOX_VOICE_MAP"),
        metavar="MAP",
        help="the compatible APIs' voice ids -> our voices: a JSON file, or id=voice,id2=voice "
        "(default: $STREAMVOX_VOICE_MAP; OpenAI's names mean the default voice)",
    )
    p.add_argument(
        "--strict-voices",
        action="store_true",
        default=_env_flag("STREAMVOX_STRICT_VOICES"),
        help="refuse voice ids the map does not know (default: the default voice, one warning per id)",
    )
    p.add_argument("--log-level", default="INFO")
    p.add_argument(
        "--engine",
        default=os.environ.get("STREAMVOX_ENGINE", engines.DEFAULT_ENGINE),
        metavar="NAME",
        help=f"the synthesis engine (default {engines.DEFAULT_ENGINE}, env STREAMVOX_ENGINE): {engines.describe()}",
    )
    engines.add_args(p)  # each engine's own options (their modules import no model library)


def _say_args(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("say", help="stream a text from a running server into a WAV file")
    p.add_argument("text", help="the text to speak ('-' reads stdin)")
    p.add_argument("-o", "--output", default="out/say.wav")
    p.add_argument("--url", default=os.environ.get("STREAMVOX_URL", f"ws://127.0.0.1:{P.DEFAULT_PORT}{P.WS_PATH}"))
    p.add_argument("--voice", default=None)
    p.add_argument("--sample-rate", type=int, default=None)
    p.add_argument("--api-key", default=os.environ.get("STREAMVOX_API_KEY"))
    p.add_argument("--no-pace", action="store_true", help="render as fast as possible instead of real-time pacing")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamvox", description="streamvox: a truly streaming TTS server, its client, bench and simulations"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_args(sub)
    _say_args(sub)
    _plugin_commands(sub)
    return parser


def _plugin_commands(sub: argparse._SubParsersAction) -> None:
    """Subcommands that other packages register (``streamvox simulate`` comes from ``sim``,
    ``streamvox bench`` from the bench tool).

    Entry points rather than an import: the server package never imports the agent side or the
    tools. Where one cannot load (a server-only image has no ``bench`` package, an install without
    an extra lacks its framework) the command still exists and says why in one line, rather than
    vanishing into argparse's "invalid choice".
    """
    from importlib.metadata import entry_points

    for ep in entry_points(group="streamvox.commands"):
        try:
            add = ep.load()
        except ImportError as exc:  # the plug-in's package or extras are missing: the rest still works
            logging.getLogger(__name__).debug("streamvox command %s unavailable: %s", ep.name, exc)
            _unavailable(sub, ep.name, exc)
            continue
        add(sub)


def _unavailable(sub: argparse._SubParsersAction, name: str, exc: ImportError) -> None:
    why = f"streamvox {name} is not available in this installation ({exc.name or exc}: not importable)"
    p = sub.add_parser(name, help="(not available here)", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)

    def explain(_args: argparse.Namespace) -> int:
        raise CliError(f"{why}; it comes with a checkout's install: pip install -e '.[dev]'")

    p.set_defaults(func=explain)


class CliError(Exception):
    """A problem the user can fix; printed without a traceback."""


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            return serve(args)
        if args.command == "say":
            return asyncio.run(say(args))
        return args.func(args)
    except CliError as exc:
        print(f"streamvox: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _key(value: str | None, path: str | None, flag: str) -> str | None:
    """A key given directly or (preferred: out of the process list) in a file, ``flag`` its option."""
    if not path:
        return value or None
    try:
        key = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise CliError(f"cannot read {flag} {path}: {exc.strerror}") from None
    if not key:
        raise CliError(f"{flag} {path} is empty; put the key in it")
    return key


def _api_key(args: argparse.Namespace) -> str | None:
    return _key(args.api_key, args.api_key_file, "--api-key-file")


def _admin_key(args: argparse.Namespace, api_key: str | None) -> str | None:
    key = _key(args.admin_key, args.admin_key_file, "--admin-key-file")
    if key and key == api_key:
        raise CliError("the admin key must differ from the API key: every client holds the API key")
    return key


def serve(args: argparse.Namespace) -> int:
    from .compat.voices import VoiceMapError, parse_voice_map
    from .server import Server, ServerConfig, run

    try:
        engines.entry(args.engine)  # an unknown name fails before anything else is checked
    except engines.EngineSetupError as exc:
        raise CliError(str(exc)) from None
    if args.drain_timeout < 0:
        raise CliError("--drain-timeout must be >= 0 seconds")
    api_key = _api_key(args)
    if args.require_api_key and not api_key:
        raise CliError(
            "--require-api-key: no API key given; set STREAMVOX_API_KEY_FILE or STREAMVOX_API_KEY "
            "(e.g. openssl rand -hex 32), or leave --require-api-key out to serve without one"
        )
    admin_key = _admin_key(args, api_key)
    try:
        voice_map = parse_voice_map(args.voice_map, strict=args.strict_voices)
    except VoiceMapError as exc:
        raise CliError(f"--voice-map: {exc}") from None

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        synth = engines.build(args.engine, args)
    except engines.EngineSetupError as exc:
        raise CliError(str(exc)) from None
    engine = synth.engine
    config = ServerConfig(
        host=args.host,
        port=args.port,
        api_key=api_key,
        admin_key=admin_key,
        access_log=args.access_log,
        limits=P.Limits(max_contexts=args.max_contexts),
        drain_timeout_s=args.drain_timeout,
        voice_map=voice_map,
    )
    try:
        server = Server(synth, config)
    except VoiceMapError as exc:
        raise CliError(f"--voice-map: {exc}") from None
    url = f"ws://{args.host}:{args.port}{P.WS_PATH}"
    print(
        f"streamvox serving {sorted(engine.voices)} at {url} (HTTP: http://{args.host}:{args.port}{P.HTTP_TTS_PATH})",
        flush=True,
    )
    if getattr(engine, "random_weights", None):
        print(f"WARNING: --random-weights {engine.random_weights}: the audio of every stream is noise", flush=True)
    try:
        asyncio.run(run(server, host=args.host, port=args.port))  # SIGTERM drains; a second one stops
    except OSError as exc:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}; pick another --port") from None
    return 0


async def say(args: argparse.Namespace) -> int:
    from .client import TTSClient, TTSConnectionError, TTSError

    text = sys.stdin.read() if args.text == "-" else args.text
    if not text.strip():
        raise CliError("nothing to say: give a text (or - to read it from standard input)")
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        async with TTSClient(args.url, api_key=args.api_key) as client:
            result = await speak_to_wav(
                client, text, out, voice=args.voice, sample_rate=args.sample_rate, pace=not args.no_pace
            )
    except TTSConnectionError as exc:
        raise CliError(f"{exc} (is `streamvox serve` running at {args.url}?)") from None
    except TTSError as exc:  # the server refused the request (a voice or rate it does not have, ...)
        raise CliError(f"the server refused: {exc}") from None
    print(
        f"wrote {out}: {result['audio_s']:.2f} s of audio, TTFB {result['ttfb_ms']:.0f} ms, "
        f"real-time factor {result['rtf']:.2f} (wall {result['wall_s']:.2f} s; paced streams take about real time)"
    )
    return 0


async def speak_to_wav(client, text: str, path: Path, *, voice=None, sample_rate=None, pace=True) -> dict:
    """Stream ``text`` into a WAV file; return TTFB, audio seconds and real-time factor."""
    t0 = time.perf_counter()
    ctx = await client.open(voice=voice, sample_rate=sample_rate, pace=pace)
    await ctx.send_text(text)
    await ctx.end()
    ttfb = None
    pcm = bytearray()
    async for item in ctx:
        if getattr(item, "pcm", None) is not None:
            if ttfb is None:
                ttfb = time.perf_counter() - t0
            pcm += item.pcm
    wall = time.perf_counter() - t0
    rate = ctx.sample_rate
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(bytes(pcm))
    audio_s = len(pcm) / 2 / rate
    return {
        "ttfb_ms": 1000 * (ttfb or wall),
        "audio_s": audio_s,
        "wall_s": wall,
        "rtf": wall / audio_s if audio_s else float("inf"),
    }


if __name__ == "__main__":
    sys.exit(main())
