"""The scheduler alone, with hand-built engine outputs and a fake clock: no model, no asyncio."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from tts_service.core.scheduler import Output, Overloaded, Status
from tts_service.piper.scheduler import HOP, Batch, BatchResult, PiperScheduler, PiperSchedulerOptions, Prepared

SR = 22050
FRAMES_PER_WORD = 20  # ~0.23 s of audio per word


def make_prepared(text: str, frames: int | None = None) -> Prepared:
    """What the engine's front part would return: latent frames and word timings."""
    words = text.split()
    frames = frames if frames is not None else FRAMES_PER_WORD * len(words)
    step = frames * HOP / SR / len(words)
    return Prepared(
        text=text,
        z=np.zeros((1, 192, frames), dtype=np.float32),
        words=[(w, i * step, (i + 0.8) * step) for i, w in enumerate(words)],
        voice="v",
    )


def compute(
    batch: Batch,
    *,
    seconds: float = 0.0,
    prepare: Callable[[str], Prepared | BaseException | None] = make_prepared,
) -> BatchResult:
    """The worker's job, faked: each window's audio is its sample positions (a ramp), so order
    and completeness of the released audio can be checked exactly."""
    prepared: list[Prepared | BaseException | None] = []
    fresh: dict[int, Prepared | BaseException | None] = {}
    for job in batch.preps:
        p = prepare(job.segment.text)
        prepared.append(p)
        fresh[id(job.segment)] = p
    audio: list[np.ndarray | BaseException | None] = []
    for job in batch.windows:
        p = job.segment.prepared or fresh.get(id(job.segment))
        if not isinstance(p, Prepared):
            audio.append(None)
            continue
        end = min(p.frames, job.start + job.size)
        audio.append(np.arange(job.start * HOP, end * HOP, dtype=np.float32))
    return BatchResult(prepared, audio, seconds)


def run_until_idle(sched: PiperScheduler, now: float, **kw) -> list[Output]:
    """Compute everything the scheduler allows at ``now``, releasing what is due after each
    batch (as the runtime's release loop does)."""
    out: list[Output] = []
    for _ in range(1000):
        batch = sched.schedule(now)
        if batch is None:
            return out + sched.release(now)
        sched.update(batch, compute(batch, **kw), now)
        out += sched.release(now)
    raise AssertionError("scheduler never ran out of work")


def of(outputs: list[Output], sid: int, kind: str | None = None) -> list[Output]:
    return [o for o in outputs if o.sid == sid and (kind is None or o.kind == kind)]


def new(options: PiperSchedulerOptions | None = None) -> PiperScheduler:
    return PiperScheduler(sample_rate=SR, options=options or PiperSchedulerOptions())


# ---------------------------------------------------------------- delivery order


def test_release_order_words_audio_done() -> None:
    sched = new()
    sched.add(1, voice="v", pace=False, now=0.0)
    sched.push_text(1, "One two three. Four five six seven. ", now=0.0)
    sched.end(1, now=0.0)
    out = run_until_idle(sched, 0.0)
    kinds = [o.kind for o in out]
    assert kinds[0] == "words" and kinds[-1] == "done"
    assert kinds.count("words") == 2 and kinds.count("done") == 1
    # each segment's words come right before the first frame of its audio
    second_words = kinds.index("words", 1)
    assert kinds[second_words + 1] == "audio"
    audio = of(out, 1, "audio")
    assert [o.seq for o in audio] == list(range(len(audio)))
    assert audio[0].ttfb_s is not None and all(o.ttfb_s is None for o in audio[1:])
    # every sample of both segments, in order, exactly once
    first_len, second_len = 3 * FRAMES_PER_WORD * HOP, 4 * FRAMES_PER_WORD * HOP
    samples = np.concatenate([o.samples for o in audio])
    expected = np.concatenate([np.arange(first_len), np.arange(second_len)]).astype(np.float32)
    np.testing.assert_array_equal(samples, expected)
    audio_before_second = sum(len(o.samples) for o in out[:second_words] if o.kind == "audio")
    assert audio_before_second == first_len
    # the second segment's word times are offset by the first segment's duration
    words = out[second_words].words
    assert words is not None and [w for w, _, _ in words] == ["Four", "five", "six", "seven."]
    assert words[0][1] == pytest.approx(first_len / SR)
    done = out[-1]
    assert done.frames == len(audio)
    assert done.audio_ms == pytest.approx(1000 * len(samples) / SR)
    assert sched.status(1) is Status.FINISHED_DONE
    assert all(len(o.samples) <= sched.opt.frame_samples for o in audio)


def test_done_only_after_end() -> None:
    sched = new()
    sched.add(1, voice="v", pace=False, now=0.0)
    sched.push_text(1, "Hello there. ", now=0.0)
    out = run_until_idle(sched, 0.0)
    assert of(out, 1, "audio") and not of(out, 1, "done")
    assert sched.status(1) is Status.ACTIVE
    sched.end(1, now=0.0)
    assert [o.kind for o in run_until_idle(sched, 0.0)] == ["done"]


def test_flush_and_end_cut_buffered_text() -> None:
    sched = new()
    sched.add(1, voice="v", pace=False, now=0.0)
    sched.push_text(1, "no sentence end here", now=0.0)
    assert sched.schedule(0.0) is None  # nothing to say yet
    sched.flush(1, now=0.0)
    batch = sched.schedule(0.0)
    assert batch is not None and [j.segment.text for j in batch.preps] == ["no sentence end here"]
    sched.end(1, now=0.0)
    with pytest.raises(ValueError, match="ended"):
        sched.push_text(1, "more", now=0.0)


# ---------------------------------------------------------------- priorities and batching


def test_first_audio_has_priority_over_playing_streams() -> None:
    sched = new(PiperSchedulerOptions(max_jobs=1))
    sched.add(1, voice="v", pace=False, now=0.0)
    sched.push_text(1, "A long first utterance that keeps going for a while. ", now=0.0)
    for _ in range(2):  # stream 1 is playing
        batch = sched.schedule(0.0)
        assert batch is not None and batch.sids == {1}
        sched.update(batch, compute(batch), 0.0)
    assert of(sched.release(0.0), 1, "audio")
    sched.add(2, voice="v", pace=False, now=0.0)
    sched.push_text(2, "Second stream. ", now=0.0)
    batch = sched.schedule(0.0)
    assert batch is not None and batch.sids == {2}  # the newcomer's first audio goes first
    assert batch.windows[0].size == sched.opt.windows[0]  # and with the smallest window


def test_windows_of_several_streams_share_a_batch_where_batching_pays() -> None:
    sched = new(PiperSchedulerOptions(max_jobs=8))  # the runtime's setting on CUDA
    for sid in (1, 2, 3):
        sched.add(sid, voice="v", pace=False, now=0.0)
        sched.push_text(sid, "Hello to all of you. ", now=0.0)
    batch = sched.schedule(0.0)
    assert batch is not None
    assert [j.sid for j in batch.windows] == [1, 2, 3]
    assert len(batch.preps) == 3
    assert sched.schedule(0.0) is None  # a stream with work in flight is not scheduled twice
    sched.update(batch, compute(batch), 0.0)
    assert sched.schedule(0.0) is not None


def test_windows_grow_after_the_first() -> None:
    sched = new()
    sched.add(1, voice="v", pace=True, now=0.0)
    sched.push_text(1, " ".join(["word"] * 60) + ". ", now=0.0)
    sizes = []
    now = 0.0
    for _ in range(6):
        batch = sched.schedule(now)
        if batch is None:
            now += 0.1
            sched.release(now)
            continue
        sizes.append(batch.windows[0].size)
        sched.update(batch, compute(batch), now)
        sched.release(now)
    assert sizes[0] == sched.opt.windows[0] <= 6
    assert max(sizes) > sizes[0]
    assert sizes == sorted(sizes)


# ---------------------------------------------------------------- pacing


def test_paced_stream_stops_at_its_lead_and_resumes_with_the_clock() -> None:
    opt = PiperSchedulerOptions(lead_s=0.4, compute_lead_s=0.4)
    sched = new(opt)
    sched.add(1, voice="v", pace=True, now=0.0)
    sched.push_text(1, " ".join(["word"] * 80) + ". ", now=0.0)  # ~18 s of audio
    computed = 0.0
    released = 0.0
    now = 0.0
    while (batch := sched.schedule(now)) is not None:
        result = compute(batch)
        computed += sum(len(a) for a in result.audio if a is not None) / SR
        sched.update(batch, result, now)
        released += sum(len(o.samples) for o in of(sched.release(now), 1, "audio")) / SR
    max_window_s = max(opt.windows) * HOP / SR
    assert opt.lead_s <= computed < opt.lead_s + max_window_s  # stopped once the lead was reached
    assert released <= opt.lead_s + opt.frame_samples / SR  # sent no further ahead than the lead
    assert sched.next_release_in(now) is not None and sched.next_release_in(now) > 0
    # time passes: the listener's playhead moves, frames fall due and work resumes
    for step in range(1, 21):
        now = step * 0.25
        released += sum(len(o.samples) for o in of(sched.release(now), 1, "audio")) / SR
        while (batch := sched.schedule(now)) is not None:
            result = compute(batch)
            computed += sum(len(a) for a in result.audio if a is not None) / SR
            sched.update(batch, result, now)
        released += sum(len(o.samples) for o in of(sched.release(now), 1, "audio")) / SR
        # never more than the lead (plus one frame and one window) ahead of real time
        assert released <= now + opt.lead_s + opt.frame_samples / SR + 1e-9
        assert computed <= now + opt.lead_s + max_window_s + 1e-9
    assert released >= now  # and it kept up with real time


def test_unpaced_stream_runs_ahead() -> None:
    sched = new()
    sched.add(1, voice="v", pace=False, now=0.0)
    sched.push_text(1, " ".join(["word"] * 20) + ". ", now=0.0)
    sched.end(1, now=0.0)
    out = run_until_idle(sched, 0.0)  # all of it at time zero
    assert sum(len(o.samples) for o in of(out, 1, "audio")) == 20 * FRAMES_PER_WORD * HOP
    assert of(out, 1, "done")


# ---------------------------------------------------------------- cancel


def test_cancel_between_schedule_and_update_discards_outputs() -> None:
    sched = new(PiperSchedulerOptions(max_jobs=8))  # a batch of both streams
    for sid in (1, 2):
        sched.add(sid, voice="v", pace=False, now=0.0)
        sched.push_text(sid, "Some words to say here. And more words after that. ", now=0.0)
    batch = sched.schedule(0.0)
    assert batch is not None and batch.sids == {1, 2}
    result = compute(batch)
    sched.update(batch, result, 0.0)  # audio of both streams is now held, not yet released
    held_1 = sum(math.ceil(len(a) / sched.opt.frame_samples) for a, j in zip(result.audio, batch.windows) if j.sid == 1)
    assert held_1 >= 1
    batch = sched.schedule(0.0)  # the next tick is computing ...
    assert batch is not None and batch.sids == {1, 2}
    assert sched.cancel(1) == held_1  # ... when stream 1 is cancelled
    assert sched.status(1) is Status.FINISHED_CANCELLED
    sched.update(batch, compute(batch), 0.0)
    out = sched.release(0.0)
    assert of(out, 1) == []  # nothing at all of the cancelled stream
    assert of(out, 2, "audio") and of(out, 2, "words")
    assert sched.cancel(1) == 0  # idempotent
    while (batch := sched.schedule(0.0)) is not None:
        assert 1 not in batch.sids
        sched.update(batch, compute(batch), 0.0)
        assert of(sched.release(0.0), 1) == []
    assert sched.active == 1


def test_cancel_and_discard_while_in_flight() -> None:
    sched = new()
    sched.add(1, voice="v", pace=True, now=0.0)
    sched.push_text(1, "Hello there. ", now=0.0)
    batch = sched.schedule(0.0)
    assert batch is not None
    assert sched.cancel(1) == 0
    sched.discard(1)
    sched.update(batch, compute(batch), 0.0)  # outputs of a forgotten stream are dropped by id
    assert sched.release(0.0) == []
    assert sched.status(1) is None and sched.active == 0
    sched.add(1, voice="v", pace=True, now=0.0)  # the id may be reused: it starts afresh
    sched.push_text(1, "Again. ", now=0.0)
    sched.end(1, now=0.0)
    out = run_until_idle(sched, 0.0)
    assert of(out, 1, "audio")[0].seq == 0 and of(out, 1, "done")


def test_cancel_of_a_paced_stream_counts_held_frames() -> None:
    sched = new(PiperSchedulerOptions(lead_s=0.2))
    sched.add(1, voice="v", pace=True, now=0.0)
    sched.push_text(1, " ".join(["word"] * 40) + ". ", now=0.0)
    run_until_idle(sched, 0.0)
    for now in (0.05, 0.1):  # a few rounds: audio is computed ahead, then held for pacing
        run_until_idle(sched, now)
    held = sched._streams[1].held
    assert held, "pacing should hold computed audio back"
    expected = sum(math.ceil(len(h.samples) / sched.opt.frame_samples) for h in held)
    assert sched.cancel(1) == expected
    assert sched.release(10.0) == []


# ---------------------------------------------------------------- failures from the engine


def test_unspeakable_segment_is_skipped() -> None:
    sched = new()
    sched.add(1, voice="v", pace=False, now=0.0)
    sched.push_text(1, "... ", now=0.0)
    sched.end(1, now=0.0)
    out = run_until_idle(sched, 0.0, prepare=lambda _text: None)
    assert [o.kind for o in out] == ["done"] and out[0].frames == 0


def test_engine_failure_ends_the_stream_with_an_error() -> None:
    sched = new()
    for sid in (1, 2):
        sched.add(sid, voice="v", pace=False, now=0.0)
    sched.push_text(1, "This fails. ", now=0.0)
    sched.push_text(2, "This works. ", now=0.0)
    sched.end(2, now=0.0)

    def prepare(text: str) -> Prepared | BaseException:
        return RuntimeError("boom") if "fails" in text else make_prepared(text)

    out = run_until_idle(sched, 0.0, prepare=prepare)
    errors = of(out, 1)
    assert [o.kind for o in errors] == ["error"] and errors[0].code == "internal" and "boom" in errors[0].message
    assert sched.status(1) is Status.FINISHED_ERROR
    assert of(out, 2, "done")


# ---------------------------------------------------------------- admission


def test_admission_by_measured_cost_of_talking_streams() -> None:
    sched = new(PiperSchedulerOptions(capacity=0.85, talk_idle_s=1.0))
    sched.startup_cost_s = 0.0  # this test is about the steady cost (start-ups: below)
    sched.cost_per_audio_s = 0.3  # each real-time stream takes 30 % of the worker
    assert sched.capacity_streams() == 2
    sched.admit(0.0)  # an idle server always admits, whatever the cost
    for sid in (1, 2):
        sched.admit(0.0)
        sched.add(sid, voice="v", pace=True, now=0.0)
        sched.push_text(sid, "Hello there. ", now=0.0)
    # two talking streams plus the newcomer: 90 % > 85 %
    with pytest.raises(Overloaded) as info:
        sched.admit(0.0)
    assert info.value.retry_after_ms > 0 and "2 talking streams" in info.value.reason
    assert sched.refusal(0.0) is not None
    sched.cancel(1)  # a finished stream frees its share at once
    sched.admit(0.0)
    # A stream with nothing left to say (all audio sent, waiting for more text) stops counting.
    run_until_idle(sched, 0.0)
    sched.release(30.0)
    sched.admit(30.0)
    assert sched.talking(30.0) == 0


def test_a_slow_machine_still_serves_one_stream() -> None:
    sched = new(PiperSchedulerOptions(capacity=0.85))
    sched.cost_per_audio_s = 2.0  # the machine cannot even keep one stream real time
    sched.admit(0.0)
    sched.add(1, voice="v", pace=True, now=0.0)
    sched.push_text(1, "Hello there. ", now=0.0)
    with pytest.raises(Overloaded):
        sched.admit(0.0)


def test_a_burst_of_starts_counts_before_any_text_arrives() -> None:
    """Nine starts in the same instant: the streams just opened count (their text is on its way),
    so admission stops at capacity instead of taking all nine and letting all fall behind."""
    sched = new(PiperSchedulerOptions(capacity=0.85))
    sched.cost_per_audio_s = 0.2  # room for four
    sched.startup_cost_s = 0.0
    admitted = 0
    for sid in range(1, 10):
        try:
            sched.admit(0.0)
        except Overloaded:
            continue
        sched.add(sid, voice="v", pace=True, now=0.0)
        admitted += 1
    assert admitted == 4 == sched.capacity_streams()


def test_a_burst_is_admitted_while_the_start_ups_fit_in_the_first_window() -> None:
    """Every starting stream's front part and first window run before anyone's second window:
    the earliest starter plays its first window (54 frames, 0.63 s) meanwhile, so the start-ups
    queued must fit in it, whatever the steady cost would allow."""
    sched = new(PiperSchedulerOptions(capacity=0.85, windows=(54, 64)))
    sched.cost_per_audio_s = 0.01  # steady state would take 85 streams
    sched.startup_cost_s = 0.1  # but each start-up takes 100 ms of the worker
    for sid in range(1, 6):
        sched.admit(0.0)
        sched.add(sid, voice="v", pace=True, now=0.0)
        sched.push_text(sid, "Hello there, how are you. ", now=0.0)
    with pytest.raises(Overloaded) as info:  # 6 x 100 ms > 85 % of 0.63 s
        sched.admit(0.0)
    assert "5 streams are starting" in info.value.reason and 100 <= info.value.retry_after_ms <= 1000
    batch = sched.schedule(0.0)  # stream 1's start-up, faster than expected
    assert batch is not None and batch.sids == {1}
    sched.update(batch, compute(batch, seconds=0.05), 0.0)
    assert sched.startup_cost_s == pytest.approx(0.09)  # learnt from the start-up batch
    assert sched.starting(0.0) == 4
    sched.admit(0.0)  # stream 1 is playing: one more fits (5 x 90 ms <= 0.53 s) ...
    sched.add(6, voice="v", pace=True, now=0.0)
    with pytest.raises(Overloaded):  # ... and no second one (6 x 90 ms > 0.53 s)
        sched.admit(0.0)


def test_contexts_idle_without_text_stop_counting_against_admission() -> None:
    sched = new(PiperSchedulerOptions(capacity=0.85, talk_idle_s=1.0))
    sched.cost_per_audio_s = 0.3
    for sid in range(1, 6):  # an agent keeps a context open between turns
        sched.admit(1.5 * sid)
        sched.add(sid, voice="v", pace=True, now=1.5 * sid)


def test_admission_max_streams() -> None:
    sched = new(PiperSchedulerOptions(max_streams=1))
    sched.admit(0.0)
    sched.add(1, voice="v", pace=True, now=0.0)
    with pytest.raises(Overloaded) as info:
        sched.admit(0.0)
    assert info.value.retry_after_ms > 0
    assert sched.capacity_streams() == 1
    sched.cancel(1)
    sched.discard(1)
    sched.admit(0.0)


def test_measured_cost_is_learnt_from_batches() -> None:
    sched = new()
    sched.add(1, voice="v", pace=False, now=0.0)
    sched.push_text(1, " ".join(["word"] * 40) + ". ", now=0.0)
    before = sched.cost_per_audio_s
    for _ in range(20):
        batch = sched.schedule(0.0)
        if batch is None:
            break
        result = compute(batch)
        audio_s = sum(len(a) for a in result.audio if a is not None) / SR
        result.seconds = audio_s * 0.5  # a slow machine: RTF 0.5
        sched.update(batch, result, 0.0)
        sched.release(0.0)
    assert before < sched.cost_per_audio_s <= 0.5


# ---------------------------------------------------------------- slow text (an LLM that dawdles)


def test_text_without_punctuation_is_cut_at_a_word_after_first_cut_s() -> None:
    sched = new(PiperSchedulerOptions(first_cut_s=0.4, early_cut_words=3))
    sched.add(1, voice="v", pace=False, now=0.0)
    sched.push_text(1, "I think that the best way to go abo", 0.0)
    assert sched.schedule(0.2) is None  # still waiting for a boundary
    batch = sched.schedule(0.45)
    assert batch is not None and [j.segment.text for j in batch.preps] == ["I think that the best way to go"]
    sched.update(batch, compute(batch), 0.45)
    # The unfinished word stays buffered and joins the rest of its sentence.
    sched.push_text(1, "ut it is slowly.", 0.5)
    sched.end(1, 0.5)
    outs = [o for o in run_until_idle(sched, 0.5) + sched.release(0.5)]
    words = [w for o in of(outs, 1, "words") for w, _, _ in o.words or []]
    assert words == "I think that the best way to go about it is slowly.".split()
    assert of(outs, 1, "done")


def test_too_few_words_wait_for_more_text_then_for_the_fragment_wait() -> None:
    sched = new(PiperSchedulerOptions(first_cut_s=0.4, early_cut_words=3, fragment_wait_s=0.8))
    sched.add(1, voice="v", pace=True, now=0.0)
    sched.push_text(1, "Well then", 0.0)
    assert sched.schedule(0.5) is None  # not cut at a word: too few words
    assert sched.next_work_in(0.5) == pytest.approx(0.3)
    batch = sched.schedule(0.8)
    assert batch is not None and [j.segment.text for j in batch.preps] == ["Well then"]


@pytest.mark.parametrize(
    ("text", "wait_s", "spoken"),
    [
        ("Hi there.", 0.3, ["Hi there."]),
        ("Okay", 0.8, ["Okay"]),
        ('He said "no."', 0.3, ['He said "no."']),
    ],
)
def test_text_is_never_stranded(text: str, wait_s: float, spoken: list[str]) -> None:
    """No flush, no end, no more text: a sentence is spoken after sentence_wait_s, a fragment
    after fragment_wait_s (the runtime is woken for it by next_work_in)."""
    sched = new(PiperSchedulerOptions(sentence_wait_s=0.3, fragment_wait_s=0.8))
    sched.add(1, voice="v", pace=True, now=10.0)
    sched.push_text(1, text, 10.0)
    assert sched.schedule(10.0 + wait_s - 0.01) is None
    assert sched.next_work_in(10.0 + wait_s - 0.01) == pytest.approx(0.01)
    batch = sched.schedule(10.0 + wait_s)
    assert batch is not None and [j.segment.text.strip() for j in batch.preps] == spoken


def test_last_word_of_a_sentence_is_not_stranded() -> None:
    """'Thanks for calling today.': the early cut takes 'Thanks for calling' at first_cut_s;
    'today.' follows sentence_wait_s after the last text."""
    sched = new(PiperSchedulerOptions(first_cut_s=0.4, sentence_wait_s=0.3))
    sched.add(1, voice="v", pace=True, now=0.0)
    sched.push_text(1, "Thanks for calling today.", 0.0)
    assert sched.next_work_in(0.0) == pytest.approx(0.3)
    batch = sched.schedule(0.3)
    assert batch is not None
    sched.update(batch, compute(batch), 0.3)
    words = [w for o in of(sched.release(0.3), 1, "words") for w, _, _ in o.words or []]
    assert words == ["Thanks", "for", "calling", "today."]


def test_an_uncuttable_text_does_not_keep_the_runtime_awake() -> None:
    """A word cut that finds nothing to cut must not leave a deadline of 0 (a busy loop)."""
    sched = new(PiperSchedulerOptions(first_cut_s=0.4, early_cut_words=3, fragment_wait_s=0.8))
    sched.add(1, voice="v", pace=True, now=0.0)
    sched.push_text(1, "the of the", 0.0)  # only function words: nowhere to cut
    assert sched.schedule(0.5) is None
    assert sched.next_work_in(0.5) == pytest.approx(0.3)  # the fragment wait, not 0


def test_a_stream_about_to_run_dry_cuts_early_too() -> None:
    sched = new(PiperSchedulerOptions(first_cut_s=0.4, early_cut_words=3, starve_lead_s=0.15))
    sched.add(1, voice="v", pace=False, now=0.0)
    sched.push_text(1, "One short sentence. And then a slow continuation that", 0.0)
    outs = run_until_idle(sched, 0.0)
    played = sum(len(o.samples) for o in of(outs, 1, "audio")) / SR
    assert played > 0
    # Plenty of audio left to play: no early cut yet.
    assert sched.schedule(0.3) is None
    # The listener has nearly caught up with what was sent and no text came for a while.
    batch = sched.schedule(played - 0.05)
    assert batch is not None and batch.preps[0].segment.text == "And then a slow continuation"


# ---------------------------------------------------------------- the clock, window by window


def _fill(sched: PiperScheduler, now: float) -> list[Output]:
    """Compute every batch due at ``now`` one at a time, releasing after each (as the runtime
    does: deliver as computed)."""
    out: list[Output] = []
    while (batch := sched.schedule(now)) is not None:
        sched.update(batch, compute(batch), now)
        out += sched.release(now)
    return out


def test_window_by_window_delivery_and_startup_priority() -> None:
    """Each batch is one window of one stream, and its audio is released as soon as it is
    folded in; a newcomer's first window goes before a playing stream's next one."""
    sched = new(PiperSchedulerOptions(windows=(54, 64)))  # as the runtime sets them for the Piper voice
    sched.add(1, voice="v", pace=True, now=0.0)
    sched.push_text(1, " ".join(["word"] * 60) + ". ", now=0.0)
    assert of(_fill(sched, 0.0), 1, "audio")  # stream 1 is playing, computed ahead to its lead
    now = 1.0  # stream 1 needs its next window (0.37 s of audio left) ...
    for step in range(1, 11):  # its frames went out as they fell due
        sched.release(step / 10)
    sched.add(2, voice="v", pace=True, now=now)
    sched.push_text(2, "A newcomer says hello. ", now=now)
    first = sched.schedule(now)
    assert first is not None and first.sids == {2} and len(first.windows) == 1  # ... but 2 goes first
    sched.update(first, compute(first), now)
    out = sched.release(now)
    assert of(out, 2, "audio") and not of(out, 1, "audio")  # out at once, before 1's window is computed
    second = sched.schedule(now)
    assert second is not None and second.sids == {1} and len(second.windows) == 1
    sched.update(second, compute(second), now)
    assert sched.schedule(now) is not None  # stream 2 again: one window per batch, in turn


def test_the_scheduler_says_when_paced_work_falls_due() -> None:
    sched = new(PiperSchedulerOptions(lead_s=0.4, compute_lead_s=1.0))
    sched.add(1, voice="v", pace=True, now=0.0)
    sched.push_text(1, " ".join(["word"] * 80) + ". ", now=0.0)
    _fill(sched, 0.0)
    wait = sched.next_work_in(0.0)
    assert wait is not None and 0.0 < wait < 1.0  # lead above compute_lead_s: sleep this long
    assert sched.schedule(wait - 0.01) is None
    _ = sched.release(wait - 0.01)
    assert sched.schedule(wait + 0.01) is not None
    assert sched.next_release_in(wait) is not None


def test_nothing_due_means_no_wake_up() -> None:
    sched = new()
    sched.add(1, voice="v", pace=True, now=0.0)  # an open context waiting for text
    assert sched.schedule(0.0) is None and sched.next_work_in(0.0) is None
    assert sched.next_release_in(0.0) is None


def test_a_stream_that_fell_behind_gets_the_largest_windows() -> None:
    """After a stall the listener is waiting: windows grow to the largest, never back to the
    smallest (which made stalled streams the least efficient ones in a burst)."""
    sched = new(PiperSchedulerOptions(windows=(6, 12, 24, 48, 64)))
    sched.add(1, voice="v", pace=True, now=0.0)
    sched.push_text(1, " ".join(["word"] * 80) + ". ", now=0.0)
    batch = sched.schedule(0.0)
    assert batch is not None and batch.windows[0].size == 6
    sched.update(batch, compute(batch), 0.0)
    sched.release(0.0)
    later = 5.0  # the worker was busy elsewhere: the listener has played everything
    batch = sched.schedule(later)
    assert batch is not None and batch.windows[0].size == 64


def test_a_batch_is_orphaned_once_all_its_streams_finished() -> None:
    sched = new(PiperSchedulerOptions(max_jobs=8))
    for sid in (1, 2):
        sched.add(sid, voice="v", pace=True, now=0.0)
        sched.push_text(sid, "Hello there my friend. ", now=0.0)
    batch = sched.schedule(0.0)
    assert batch is not None and batch.sids == {1, 2}
    sched.cancel(1)
    assert not sched.orphaned(batch)
    sched.cancel(2)
    sched.discard(2)
    assert sched.orphaned(batch)


def test_start_up_front_parts_are_urgent_read_ahead_ones_are_not() -> None:
    """The engine may spend more CPU on a front part the listener waits for (all threads)."""
    sched = new(PiperSchedulerOptions(windows=(54, 64), compute_lead_s=1.0))
    sched.add(1, voice="v", pace=True, now=0.0)
    sched.push_text(1, "First sentence here. " + " ".join(["more"] * 40) + ". ", now=0.0)
    batch = sched.schedule(0.0)
    assert batch is not None and batch.preps[0].urgent  # the stream's first audio
    sched.update(batch, compute(batch), 0.0)
    urgencies = []
    while (batch := sched.schedule(0.0)) is not None:
        urgencies += [job.urgent for job in batch.preps]
        sched.update(batch, compute(batch), 0.0)
        sched.release(0.0)
    assert urgencies == [False]  # the second segment, prepared while the first plays
