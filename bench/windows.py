"""The engine alone: decoder cost per window size, windowed vs whole decode, and threads.

``python -m bench.windows`` prints, for the bundled voice on this machine:

* worker milliseconds per decoded span and per audio frame (the window plan's cost);
* the max difference between a windowed and a whole decode (the exactness claim);
* the front part and the decoder with one and two intra-op threads (wall and CPU time);
* one worker with two threads vs two workers with one, on the same work (prepare + windows).

Medians of interleaved repeats, so a neighbour's burst spreads over all settings alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import numpy as np

from tts_service.piper.engine import HOP, PiperEngine, Window
from tts_service.piper.voices import DEC_IN, default_voice_path

TEXT = "Okay, let me check that for you; it will only take a moment. The weather is nice today, really."
REPLY = "Would you like to book a table for two people this evening, or tomorrow at noon?"


def _engine(threads: int) -> PiperEngine:
    engine = PiperEngine(threads=threads)
    engine.load_voice(default_voice_path(), progress=lambda *_: None)
    return engine


def _timed(fn, repeats: int) -> tuple[float, float]:
    """Median wall and mean CPU milliseconds of ``fn``."""
    walls, c0 = [], time.process_time()
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t)
    return 1000 * statistics.median(walls), 1000 * (time.process_time() - c0) / repeats


def spans(engine: PiperEngine, repeats: int) -> None:
    v = engine.voices[engine.default_voice]
    p = engine.prepare(TEXT * 2)
    assert p is not None
    context = v.reach.left + v.reach.right
    print(f"decoder context {v.reach}; span = window + {context} frames")
    for n in (65, 86, 118, 150, 214):
        wall, _ = _timed(lambda n=n: v.back.run(None, {DEC_IN: p.z[:, :, 30 : 30 + n]}), repeats)
        w = n - context
        print(f"  span {n:3d} (window {w:3d}): {wall:6.1f} ms, {wall / w:.3f} ms per audio frame")
    wall, _ = _timed(lambda: v.back.run(None, {DEC_IN: p.z}), max(3, repeats // 4))
    print(f"  whole segment ({p.frames} frames): {wall / p.frames:.3f} ms per audio frame")
    ref = engine.decode_whole(p)
    start, chunks = 0, []
    for size in (54, 64, 96, *[192] * 99):  # the scheduler's plan on this voice
        if start >= p.frames:
            break
        end = min(p.frames, start + size)
        chunks.append(engine.decode([Window(p, start, end)])[0])
        start = end
    print(f"  windows 54, 64, 96, 192... vs whole: max |difference| {np.max(np.abs(np.concatenate(chunks) - ref)):.2e}")


def threads(engine: PiperEngine, repeats: int) -> None:
    """The same front part and decoder span on sessions with one and with two intra-op threads."""
    v = engine.voices[engine.default_voice]
    p = engine.prepare(REPLY)
    assert p is not None
    feed = engine.front_feed(REPLY)
    for n in (1, 2):
        front, back = engine._session(v.files.front_path, threads=n), engine._session(v.files.back_path, threads=n)
        fw, fc = _timed(lambda front=front: front.run(None, feed), repeats)
        dw, dc = _timed(lambda back=back: back.run(None, {DEC_IN: p.z[:, :, :65]}), repeats)
        print(f"  {n} thread(s): front part {fw:.1f} ms wall / {fc:.1f} ms CPU; 65-frame span {dw:.1f} / {dc:.1f} ms")


def workers(seconds: float) -> None:
    for n_threads, n_workers in ((2, 1), (1, 2), (2, 2)):
        engine = _engine(n_threads)
        frames = [0] * n_workers
        stop = time.perf_counter() + seconds

        def work(k: int, engine=engine, stop=stop, frames=frames) -> None:
            while time.perf_counter() < stop:
                p = engine.prepare(REPLY)
                start, size = 0, 54
                while start < p.frames:
                    engine.decode([Window(p, start, min(p.frames, start + size))])
                    start, size = start + size, 96
                frames[k] += p.frames

        pool = [threading.Thread(target=work, args=(k,)) for k in range(n_workers)]
        t0, c0 = time.perf_counter(), time.process_time()
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        audio = sum(frames) * HOP / engine.sample_rate
        print(
            f"  {n_workers} worker(s) x {n_threads} thread(s): {audio / wall:.1f} s of audio per s, "
            f"{cpu / audio:.4f} CPU s per audio s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.windows", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=4.0, help="per worker setting")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}")
    engine = _engine(2)
    spans(engine, args.repeats)
    print("front part and decoder, intra-op threads:")
    threads(engine, args.repeats)
    print("workers (prepare + windows 54, 96, 96...):")
    workers(args.seconds)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
