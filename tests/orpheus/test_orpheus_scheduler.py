"""The Orpheus scheduler alone, with hand-built tick results (no model)."""

from __future__ import annotations

import numpy as np
import pytest

from tts_service.core.scheduler import Overloaded
from tts_service.orpheus.scheduler import (
    FRAME_S,
    OrpheusOptions,
    OrpheusScheduler,
    SlotEvent,
    TickResult,
)

AUDIO = np.zeros(2048, dtype=np.float32)  # one frame


def tokenize(text, voice):
    return list(range(8 + len(text.split())))


def sched(slots=4, **opts) -> OrpheusScheduler:
    return OrpheusScheduler(slots=slots, tokenize=tokenize, options=OrpheusOptions(**opts))


def open_stream(s, sid, text="Hello there.", *, pace=False, now=0.0, end=True):
    s.add(sid, voice="tara", pace=pace, now=now)
    s.push_text(sid, text, now)
    if end:
        s.end(sid, now)


def frames_result(plan, *, frames=1, done=(), seconds=0.01):
    events = {
        slot: SlotEvent(sid=plan.owners[slot], tokens=7, frames=frames, audio=[AUDIO] * frames, done=slot in done)
        for slot in plan.decode
    }
    return TickResult(events, seconds=seconds, batch=len(plan.decode))


def test_new_streams_claim_the_lowest_free_slots_and_decode_after_prefill():
    s = sched()
    open_stream(s, 1)
    open_stream(s, 2)
    plan = s.schedule(0.0)
    assert [c.slot for c in plan.claims] == [0, 1]
    assert [(p.slot, p.start, p.stop, p.last) for p in plan.prefills] == [(0, 0, 9, True), (1, 0, 9, True)]
    assert plan.decode == [0, 1]  # prompt complete this tick: decode in the same tick
    assert plan.owners == {0: 1, 1: 2}


def test_long_prompts_are_prefilled_in_chunks_between_steps():
    s = sched(prefill_chunk=4)
    open_stream(s, 1, "one two three four five six seven")  # 15 prompt tokens: 14 to prefill
    spans = []
    while True:
        plan = s.schedule(0.0)
        spans += [(p.start, p.stop) for p in plan.prefills]
        s.update(plan, TickResult({}), 0.0)
        if plan.decode:
            break
    assert spans == [(0, 4), (4, 8), (8, 12), (12, 14)]


def test_paced_stream_ahead_of_its_listener_skips_steps():
    s = sched(lead_s=0.3)
    open_stream(s, 1, pace=True)
    now = 0.0
    plan = s.schedule(now)
    s.update(plan, frames_result(plan, frames=5), now)  # 427 ms generated
    assert [o.kind for o in s.release(now)][:1] == ["audio"]  # first audio starts the playhead
    assert s.schedule(now) is None  # 427 ms ahead of a listener at 0: no step
    later = 5 * FRAME_S - 0.3 + 0.01  # the listener has caught up to within the lead
    s.release(later)
    plan = s.schedule(later)
    assert plan is not None and plan.decode == [0]


def test_admission_by_slots_and_by_measured_step_time():
    s = sched(slots=2)
    open_stream(s, 1, end=False)
    open_stream(s, 2, end=False)
    with pytest.raises(Overloaded, match="slots"):
        s.admit(0.0)
    s = OrpheusScheduler(slots=64, tokenize=tokenize, step_times={1: 0.004, 8: 0.006, 16: 0.015})
    assert s.capacity_streams() == 8  # 15 ms/step at 16 streams is slower than 82 tokens/s x 1.1
    for sid in range(8):
        open_stream(s, sid, end=False)
    with pytest.raises(Overloaded, match="real time"):
        s.admit(0.0)


def test_cancel_mid_tick_drops_its_results_and_frees_the_slot_for_reuse():
    s = sched(slots=1)
    open_stream(s, 1)
    plan = s.schedule(0.0)
    assert plan.owners == {0: 1}
    assert s.cancel(1) == 0  # while the tick runs
    s.discard(1)
    open_stream(s, 2)
    s.update(plan, frames_result(plan, frames=3), 0.0)  # the tick planned for stream 1 returns
    assert s.release(0.0) == []  # nothing of stream 1 reaches anyone
    plan2 = s.schedule(0.0)
    assert plan2.releases == [0] and [(c.slot, c.sid) for c in plan2.claims] == [(0, 2)]
    # a late event tagged with the old stream id is dropped even though the slot is live again
    s.update(plan2, TickResult({0: SlotEvent(sid=1, frames=1, audio=[AUDIO])}), 0.0)
    assert s.release(0.0) == []


def test_segments_finish_free_the_slot_and_the_stream_ends_with_done():
    s = sched(slots=1)
    open_stream(s, 1, "First sentence here. Second one follows.")
    assert s.queue_depth() == 2
    plan = s.schedule(0.0)
    s.update(plan, frames_result(plan, frames=2, done={0}), 0.0)
    assert s.slots_in_use() == 0
    plan = s.schedule(0.0)  # the second segment claims the slot again
    assert [c.slot for c in plan.claims] == [0]
    s.update(plan, frames_result(plan, frames=1, done={0}), 0.0)
    outs = s.release(0.0)
    kinds = [o.kind for o in outs]
    assert kinds.count("audio") == 6 and kinds[-1] == "done"  # 3 frames in 1024-sample messages
    assert outs[0].ttfb_s is not None
    assert outs[-1].audio_ms == pytest.approx(3 * FRAME_S * 1000)


def test_a_prompt_too_long_for_the_slot_fails_the_stream():
    s = OrpheusScheduler(slots=1, tokenize=tokenize, max_prompt=10)
    open_stream(s, 1, "this text has far too many words for the slot")
    assert s.schedule(0.0) is None
    (out,) = s.release(0.0)
    assert out.kind == "error" and out.code == "text_too_long"
