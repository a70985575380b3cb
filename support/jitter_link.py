"""A jittery link in numpy, on a simulated clock: what an adaptive jitter buffer faces between
the TTS server and a playback device.

Deterministic (seeded RNG, the clock passed as ``now=``): replies of 3-8 s are produced as 20 ms
frames in real time, delivered in order (one WebSocket) after a random 50-150 ms delay, with
occasional stalls of 100-200 ms that release a burst of frames at once; a playback device pulls
10 ms every 10 ms. Shared by ``tests/agent/test_jitter.py`` and ``scripts/jitter_seeds.py`` (more
seeds than the test runs), so both measure the same link.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agent.runtime.jitter import AdaptiveJitterBuffer, JitterState

SR = 16000
FRAME_S = 0.02
PULL_S = 0.01
PULL = int(SR * PULL_S)


@dataclass
class Turn:
    underruns: int
    near_misses: int
    target_ms: float
    mean_depth_ms: float  # while playing: the audio's added playout delay


def simulate(
    jb: AdaptiveJitterBuffer,
    rng: np.random.Generator,
    turns: int,
    *,
    jittery: bool,
    t0: float,
    burst_p: float = 0.01,
) -> tuple[list[Turn], float]:
    frame = np.full(int(SR * FRAME_S), 1000, np.int16)
    out: list[Turn] = []
    t = t0
    for _ in range(turns):
        n = int(rng.uniform(3.0, 8.0) / FRAME_S)
        arrivals, last = [], t
        for k in range(n):
            if jittery:
                delay = rng.uniform(0.05, 0.15)
                if rng.random() < burst_p:  # a stall: this frame and those behind it come late
                    delay += rng.uniform(0.1, 0.2)
            else:
                delay = 0.05 + rng.uniform(0.0, 0.003)
            last = max(last, t + k * FRAME_S + delay)  # in order, like TCP
            arrivals.append(last)
        u0, nm0, depths, i = jb.underruns, jb.near_misses, [], 0
        while True:
            while i < n and arrivals[i] <= t + 1e-9:
                jb.push(frame, now=arrivals[i])
                i += 1
                if i == n:
                    jb.end_of_stream()
            block, _ = jb.pull(PULL, now=t)
            assert block.size == PULL
            if jb.state is JitterState.PLAYING:
                depths.append(jb.depth_ms)
            t += PULL_S
            if i == n and jb.state is JitterState.IDLE:
                break
        out.append(Turn(jb.underruns - u0, jb.near_misses - nm0, jb.target_ms, float(np.mean(depths))))
        t += 1.0  # the caller talks
    return out, t
