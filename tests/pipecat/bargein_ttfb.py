"""Next-turn TTFB after a barge-in: cancel-and-keep-the-connection vs reconnect-on-interruption.

Run (about a minute)::

    .venv/bin/python -m tests.pipecat.bargein_ttfb --rounds 5 --rtt-ms 0 50

Both services run against one real streamvox server in this process, rounds interleaved, so they
see the same machine load. ``--rtt-ms`` puts a TCP proxy in front of the server that delays every
byte by half the RTT each way and the upstream TCP connect by one RTT (a remote server without
TLS; TLS would add one or two more RTTs to every reconnect).

Each round: an LLM turn of several sentences starts; 0.8 s after its first audio an
``InterruptionFrame`` arrives and the next (short) turn is queued right behind it, as a pipeline
does when the user's words are already transcribed. Measured at the frame level:

* **interruption pass-through**: InterruptionFrame queued -> it leaves the TTS service (what
  delays the output transport's flush, i.e. the talk-over time);
* **next turn's text on the wire**: next turn queued -> its first text sent on the socket (the
  connection's share of the next turn's latency, free of synthesis-time noise);
* **next-turn TTFB**: next turn queued -> its first ``TTSAudioRawFrame`` leaves the TTS service.

The baseline subclass does what Pipecat's ``InterruptibleTTSService`` does: no cancel, drop the
socket and open a new one while handling the interruption.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable

from pipecat.frames.frames import EndFrame, Frame, InterruptionFrame, TTSAudioRawFrame, TTSStoppedFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.frame_processor import FrameDirection
from pipecat.workers.runner import WorkerRunner

from agent.pipecat import StreamvoxTTSService
from support.pipecat_harness import Probe, counting_server, llm_reply

FIRST = (
    "Let me walk you through the three options we have for your trip next week. "
    "The first one leaves early in the morning and arrives just before lunch. "
    "The second one is a direct connection in the afternoon."
)
NEXT = "Of course."


class KeepConnection(StreamvoxTTSService):
    """The plug-in as shipped, recording when each context's first text went out on the socket."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.sent_at: dict[str, float] = {}

    async def run_tts(self, text: str, context_id: str):
        async for frame in super().run_tts(text, context_id):
            self.sent_at.setdefault(context_id, time.monotonic())
            yield frame


class ReconnectOnInterruption(KeepConnection):
    """Baseline: Pipecat's InterruptibleTTSService strategy (reconnect on every interruption)."""

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        s = self._session.get(context_id)
        if s is not None:
            self._session.gate(s)  # no cancel message: closing the socket ends it on the server
        await super(StreamvoxTTSService, self).on_audio_context_interrupted(context_id)

    async def _handle_interruption(self, frame: InterruptionFrame, direction: FrameDirection) -> None:
        await super()._handle_interruption(frame, direction)
        await self._disconnect()
        await self._connect()


# ---------------------------------------------------------------- latency proxy


@contextlib.asynccontextmanager
async def delay_proxy(target_port: int, rtt_s: float) -> AsyncIterator[int]:
    """A loopback TCP proxy adding ``rtt_s`` to connect and ``rtt_s / 2`` to each direction."""
    one_way = rtt_s / 2
    tasks: set[asyncio.Task] = set()

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                if not data:
                    writer.close()
                    return
                writer.write(data)
                await writer.drain()

        sender = asyncio.create_task(deliver())
        try:
            while data := await reader.read(65536):
                queue.put_nowait((time.monotonic() + one_way, data))
        except ConnectionError:
            pass
        queue.put_nowait((time.monotonic() + one_way, b""))
        with contextlib.suppress(ConnectionError):
            await sender

    async def handle(c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(rtt_s)  # the TCP handshake to a remote host
        s_reader, s_writer = await asyncio.open_connection("127.0.0.1", target_port)
        both = [asyncio.create_task(pump(c_reader, s_writer)), asyncio.create_task(pump(s_reader, c_writer))]
        tasks.update(both)
        await asyncio.gather(*both, return_exceptions=True)
        tasks.difference_update(both)

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield srv.sockets[0].getsockname()[1]
    finally:
        srv.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# ---------------------------------------------------------------- one service, many rounds


async def _wait(probe: Probe, start: int, pred: Callable[[Frame], bool], timeout: float = 15.0) -> tuple[int, float]:
    """Index and time of the first frame at or after ``start`` that satisfies ``pred``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for i in range(start, len(probe.seen)):
            if pred(probe.seen[i].frame):
                return i, probe.seen[i].t
        await asyncio.sleep(0.005)
    raise TimeoutError("expected frame did not arrive")


async def run_rounds(tts: KeepConnection, rounds: int, gate: asyncio.Lock) -> list[tuple[float, float, float]]:
    """(interruption pass-through, next turn's text on the wire, next-turn TTFB) per round, in seconds."""
    out_probe = Probe()
    worker = PipelineWorker(Pipeline([tts, out_probe]), cancel_on_idle_timeout=False)
    started = asyncio.Event()
    results: list[tuple[float, float, float]] = []

    @worker.event_handler("on_pipeline_started")
    async def _started(_worker, _frame):
        started.set()

    async def drive() -> None:
        await asyncio.wait_for(started.wait(), 10)
        for _ in range(rounds):
            async with gate:  # one service measured at a time; the other idles
                mark = len(out_probe.seen)
                for f in llm_reply(FIRST):
                    await worker.queue_frame(f)
                await _wait(out_probe, mark, lambda f: isinstance(f, TTSAudioRawFrame))
                await asyncio.sleep(0.8)
                mark = len(out_probe.seen)
                t_int = time.monotonic()
                await worker.queue_frame(InterruptionFrame())
                t_next = time.monotonic()
                for f in llm_reply(NEXT):
                    await worker.queue_frame(f)
                k, t_passed = await _wait(out_probe, mark, lambda f: isinstance(f, InterruptionFrame))
                # audio queued before the barge-in may still be passing ahead of the InterruptionFrame
                j, t_audio = await _wait(out_probe, k, lambda f: isinstance(f, TTSAudioRawFrame))
                await _wait(out_probe, j, lambda f: isinstance(f, TTSStoppedFrame))
                new_ctx = out_probe.seen[j].frame.context_id
                results.append((t_passed - t_int, tts.sent_at[new_ctx] - t_next, t_audio - t_next))
        await worker.queue_frame(EndFrame())

    runner = WorkerRunner()
    await runner.add_workers(worker)
    await asyncio.gather(runner.run(), drive())
    return results


def _fmt(values: list[float]) -> str:
    ms = sorted(1000 * v for v in values)
    return f"median {statistics.median(ms):6.1f} ms   min {ms[0]:6.1f}   max {ms[-1]:6.1f}"


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rtt-ms", type=float, nargs="+", default=[0.0, 50.0])
    args = parser.parse_args(argv)

    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    logging.basicConfig(level=logging.WARNING)
    from tts_service.piper.serve import load_piper_engine

    engine = load_piper_engine([], progress=lambda *_: None)
    async with counting_server(engine) as srv:
        port = int(srv.ws_url.rsplit(":", 1)[1].split("/")[0])
        for rtt_ms in args.rtt_ms:
            async with contextlib.AsyncExitStack() as stack:
                url = srv.ws_url
                if rtt_ms > 0:
                    proxy_port = await stack.enter_async_context(delay_proxy(port, rtt_ms / 1000))
                    url = url.replace(f":{port}/", f":{proxy_port}/")
                keep = KeepConnection(url=url, sample_rate=16000)
                again = ReconnectOnInterruption(url=url, sample_rate=16000)
                gate = asyncio.Lock()  # interleaves the rounds of the two services
                kept, recon = await asyncio.gather(
                    run_rounds(keep, args.rounds, gate), run_rounds(again, args.rounds, gate)
                )
            print(f"\nRTT {rtt_ms:.0f} ms, {args.rounds} barge-ins each, 16 kHz, same server, rounds interleaved")
            for name, res, svc in (
                ("cancel, keep connection ", kept, keep),
                ("reconnect on interruption", recon, again),
            ):
                print(f"  {name}: connections {svc.stats.connections}, cancels acked {svc.stats.cancel_acks}")
                print(f"    interruption pass-through  {_fmt([r[0] for r in res])}")
                print(f"    next turn's text on wire   {_fmt([r[1] for r in res])}")
                print(f"    next-turn TTFB             {_fmt([r[2] for r in res])}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
