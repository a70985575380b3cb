"""The adaptive jitter buffer on the simulated jittery link that tests/agent/test_jitter.py runs
(``support.jitter_link``), over more seeds than the test: underruns before/after adapting, adapted
and clean-link targets.

    .venv/bin/python scripts/jitter_seeds.py 12
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # support/
from agent.runtime.jitter import AdaptiveJitterBuffer
from support.jitter_link import SR, simulate  # the test's link model, not a copy of it

seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 12
print("seed  underruns 1-10  underruns 11-50  adapted target ms  clean-link target ms  clean underruns")
for seed in range(seeds):
    rng = np.random.default_rng(seed)
    jb = AdaptiveJitterBuffer(sample_rate=SR, initial_ms=40, min_ms=20, max_ms=400, clock=lambda: 0.0)
    jittery, t = simulate(jb, rng, 50, jittery=True, t0=0.0)
    clean, _ = simulate(jb, rng, 60, jittery=False, t0=t)
    print(
        f"{seed:4d}  {sum(x.underruns for x in jittery[:10]):14d}  {sum(x.underruns for x in jittery[10:]):15d}"
        f"  {jittery[-1].target_ms:17.0f}  {clean[-1].target_ms:20.0f}  {sum(x.underruns for x in clean):15d}"
    )
