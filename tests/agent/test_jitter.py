"""AdaptiveJitterBuffer: unit behaviour, and adaptation on a simulated jittery link.

The link (``support.jitter_link``) is deterministic: seeded, on a simulated clock passed as
``now=``. The figures are printed (run with ``-s``).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.runtime.jitter import AdaptiveJitterBuffer, JitterState
from support.jitter_link import PULL, SR, simulate


def ms(n: float) -> int:
    return int(SR * n / 1000)


@pytest.mark.parametrize("seed", range(5))
def test_adapts_to_jittery_link_then_shrinks_on_clean_link(seed):
    rng = np.random.default_rng(seed)
    jb = AdaptiveJitterBuffer(sample_rate=SR, initial_ms=40, min_ms=20, max_ms=400, clock=lambda: 0.0)

    jittery, t = simulate(jb, rng, 50, jittery=True, t0=0.0)
    early = sum(x.underruns for x in jittery[:10])
    late = sum(x.underruns for x in jittery[10:])
    adapted_target = jittery[-1].target_ms
    adapted_depth = np.mean([x.mean_depth_ms for x in jittery[-10:]])

    clean, _ = simulate(jb, rng, 60, jittery=False, t0=t)
    clean_underruns = sum(x.underruns for x in clean)
    final_depth = np.mean([x.mean_depth_ms for x in clean[-5:]])
    reached = next(i for i, x in enumerate(clean) if x.target_ms <= 100)
    print(
        f"\n[jitter seed {seed}] jittery link: underruns {early} in turns 1-10, {late} in turns 11-50 "
        f"(per turn {[x.underruns for x in jittery[:10]]}), near misses {sum(x.near_misses for x in jittery)}, "
        f"target 40 -> {adapted_target:.0f} ms, playout depth {adapted_depth:.0f} ms; "
        f"clean link: underruns {clean_underruns}, target -> {clean[-1].target_ms:.0f} ms "
        f"(<= 100 ms after {reached} replies), depth {final_depth:.0f} ms; "
        f"underrun audio {jb.underrun_ms:.0f} ms in total, mean added latency {jb.mean_added_latency_ms:.0f} ms"
    )
    assert early >= 1, "a thin start on a jittery link must underrun at first"
    # reactive step adaptation cannot promise zero against an unbounded tail of coincident stalls;
    # over seeds 0-9 eight had none in 40 adapted replies (~220 s), two had one
    assert late <= 1, "after adapting, underruns must (almost) stop"
    assert adapted_target >= 200
    assert clean_underruns == 0
    assert clean[-1].target_ms <= 60
    assert final_depth < adapted_depth / 3


def test_primes_to_target_before_playing():
    jb = AdaptiveJitterBuffer(sample_rate=SR, initial_ms=40, clock=lambda: 0.0)
    block, underrun = jb.pull(PULL)  # idle: silence, no underrun
    assert block.size == PULL and not block.any() and not underrun
    jb.push(np.full(ms(20), 7, np.int16))
    block, underrun = jb.pull(PULL)
    assert not block.any() and not underrun and jb.state is JitterState.PRIMING
    jb.push(np.full(ms(20), 7, np.int16))
    block, underrun = jb.pull(PULL)
    assert (block == 7).all() and not underrun and jb.state is JitterState.PLAYING
    assert jb.depth_ms == 30


def test_priming_waits_for_a_whole_block():
    jb = AdaptiveJitterBuffer(sample_rate=SR, initial_ms=40, clock=lambda: 0.0)
    jb.push(np.ones(ms(50), np.int16))
    block, underrun = jb.pull(ms(60))
    assert not block.any() and not underrun
    jb.push(np.ones(ms(10), np.int16))
    block, underrun = jb.pull(ms(60))
    assert block.all() and not underrun and jb.underruns == 0


def test_underrun_grows_target_and_reprimes():
    jb = AdaptiveJitterBuffer(sample_rate=SR, initial_ms=40, grow_step_ms=40, max_ms=100, clock=lambda: 0.0)
    jb.push(np.ones(ms(45), np.int16))
    for _ in range(4):
        assert not jb.pull(PULL)[1]
    block, underrun = jb.pull(PULL)  # 5 ms left: half a block of audio, then silence
    assert underrun and block[: ms(5)].all() and not block[ms(5) :].any()
    assert jb.underruns == 1 and jb.underrun_ms == 5 and jb.target_ms == 80
    assert jb.state is JitterState.REBUFFERING
    jb.push(np.ones(ms(60), np.int16))  # below the new target: still re-priming, still a gap
    block, underrun = jb.pull(PULL)
    assert underrun and not block.any() and jb.underrun_ms == 15
    jb.push(np.ones(ms(20), np.int16))
    block, underrun = jb.pull(PULL)
    assert not underrun and block.all()
    # bounded by max_ms
    for _ in range(5):
        jb.flush()
        jb.push(np.ones(ms(200), np.int16))
        while jb.depth_ms:
            jb.pull(PULL)
        jb.pull(PULL)
    assert jb.target_ms == 100 and jb.underruns == 6


def test_end_of_stream_plays_tail_without_underrun():
    jb = AdaptiveJitterBuffer(sample_rate=SR, initial_ms=100, clock=lambda: 0.0)
    jb.push(np.full(ms(25), 3, np.int16))
    assert not jb.pull(PULL)[0].any()  # below target: priming
    jb.end_of_stream()
    played = np.concatenate([jb.pull(PULL)[0] for _ in range(3)])
    assert (played[: ms(25)] == 3).all() and not played[ms(25) :].any()
    assert jb.underruns == 0 and jb.underrun_ms == 0
    assert jb.state is JitterState.IDLE and jb.target_ms == 100
    assert jb.pull(PULL)[1] is False


def test_flush_empties_at_once_and_reports_ms():
    jb = AdaptiveJitterBuffer(sample_rate=SR, initial_ms=40, clock=lambda: 0.0)
    for _ in range(10):
        jb.push(np.ones(ms(20), np.int16))
    jb.pull(PULL)
    assert jb.flush() == pytest.approx(190.0)
    assert jb.depth_ms == 0 and jb.state is JitterState.IDLE
    block, underrun = jb.pull(PULL)
    assert not block.any() and not underrun and jb.underruns == 0
    assert jb.stats().flushed_ms == pytest.approx(190.0)
    assert jb.flush() == 0.0


def test_added_latency_is_push_to_pull_time():
    clock = [0.0]
    jb = AdaptiveJitterBuffer(sample_rate=SR, initial_ms=40, clock=lambda: clock[0])
    jb.push(np.ones(ms(40), np.int16))  # pushed at t=0
    clock[0] = 0.05
    jb.pull(ms(20))
    assert jb.added_latency_ms == pytest.approx(50.0)
    jb.push(np.ones(ms(20), np.int16), now=0.06)
    jb.pull(ms(20), now=0.07)  # still the first push's samples
    assert jb.added_latency_ms == pytest.approx(70.0)
    jb.pull(ms(20), now=0.1)  # the second push
    assert jb.added_latency_ms == pytest.approx(40.0)
    stats = jb.stats()
    assert stats.max_added_latency_ms == pytest.approx(70.0)
    assert stats.mean_added_latency_ms == pytest.approx((50 + 70 + 40) / 3)


def test_input_formats():
    jb = AdaptiveJitterBuffer(sample_rate=SR, initial_ms=0, min_ms=0, clock=lambda: 0.0)
    jb.push(np.array([1, -2], np.int16).tobytes())
    jb.push(np.array([0.5, -1.0], np.float32))
    jb.push(np.array([3], np.int16))
    block, _ = jb.pull(5)
    assert block.tolist() == [1, -2, 16383, -32767, 3]
    with pytest.raises(ValueError, match="even"):
        jb.push(b"\x00")
    with pytest.raises(TypeError):
        jb.push(np.zeros(4, np.int32))


def test_validation():
    with pytest.raises(ValueError, match="min_ms <= initial_ms"):
        AdaptiveJitterBuffer(sample_rate=SR, initial_ms=10, min_ms=20)
    with pytest.raises(ValueError, match="sample_rate"):
        AdaptiveJitterBuffer(sample_rate=0)
    with pytest.raises(ValueError):
        AdaptiveJitterBuffer(sample_rate=SR, grow_step_ms=0)


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("push"), st.integers(1, 900)),
            st.tuples(st.just("pull"), st.integers(0, 700)),
            st.tuples(st.just("end"), st.just(0)),
        ),
        max_size=80,
    )
)
def test_audio_order_preserved_and_sizes_exact(ops):
    """Whatever the pattern, pulls return exactly n samples and the audio comes out in order,
    without loss or duplication (only zero gaps inserted)."""
    jb = AdaptiveJitterBuffer(sample_rate=SR, clock=lambda: 0.0)
    next_value, pushed, got = 1, 0, []
    for op, n in ops:
        if op == "push":
            jb.push(np.arange(next_value, next_value + n, dtype=np.int64).astype(np.int16) | 1)
            next_value += n
            pushed += n
        elif op == "pull":
            block, _ = jb.pull(n)
            assert block.size == n and block.dtype == np.int16
            got.append(block)
        else:
            jb.end_of_stream()
    out = np.concatenate(got) if got else np.zeros(0, np.int16)
    audio = out[out != 0]
    expected = (np.arange(1, 1 + audio.size, dtype=np.int64).astype(np.int16)) | 1
    assert np.array_equal(audio, expected)
    assert audio.size + jb.depth_ms * SR / 1000 == pytest.approx(pushed)
