"""Each call's frames on one timeline (``STREAMVOX_FRAME_LOG=FILE``), and a summary of it per turn.

Why: the stage figures (:mod:`pipelines.pipecat_figures`) give one number per stage. When a
stage is slow the next question is what happened inside it: how long the LLM took to its first
token, how many tokens the first sentence waited for and how fast they came, when the TTS
started speaking them. The demo appends one JSON line per frame of interest to ``FILE`` (several
calls may share it: ``call`` tells them apart), stamped with the pipeline clock when the frame
was pushed, like the stage figures. Off unless the variable is set: a line per LLM token is
fine for a measurement, not for every call of a deployment.

    STREAMVOX_FRAME_LOG=out/frames.jsonl python -m pipelines.pipecat_agent
    python -m pipelines.pipecat_frame_log out/frames.jsonl       # per turn: ms after the VAD stop
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    UserStoppedSpeakingFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.processors.frame_processor import FrameDirection

__all__ = ["FrameLog", "read_turns", "summarise", "turns"]

ENV = "STREAMVOX_FRAME_LOG"
# frames whose time is the timeline; TTS audio only its first frame after each TTSStartedFrame
_LOGGED = (
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
    TranscriptionFrame,
    UserStoppedSpeakingFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    LLMFullResponseEndFrame,
    TTSStartedFrame,
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    InterruptionFrame,
)
_BY_NAME = ("SpeculativeResponseFrame", "EagerEndOfTurnCancelFrame")  # named, not imported: optional parts


class FrameLog(BaseObserver):
    """Appends one JSON line per frame of interest: ``call``, ``t`` (s), ``frame``, ``source``, ``text``."""

    def __init__(self, path: str | Path, call: str) -> None:
        super().__init__()
        self.call = call
        self._out: IO[str] = open(path, "a", buffering=1, encoding="utf-8")  # closed by close()
        self._audio_due = False  # the next TTS audio frame is the first of its reply

    async def on_push_frame(self, data: FramePushed) -> None:
        frame = data.frame
        if not data.first_push or self._out.closed:
            return
        if frame.broadcast_sibling_id is not None and data.direction != FrameDirection.DOWNSTREAM:
            return  # broadcast frames travel both ways: the downstream copy stands for both
        name = type(frame).__name__
        if isinstance(frame, TTSStartedFrame):
            self._audio_due = True
        elif isinstance(frame, TTSAudioRawFrame):
            if not self._audio_due:
                return
            self._audio_due, name = False, "TTSFirstAudio"
        elif not isinstance(frame, _LOGGED) and name not in _BY_NAME:
            return
        line = {"call": self.call, "t": round(data.timestamp / 1e9, 4), "frame": name, "source": str(data.source)}
        text = getattr(frame, "text", None)
        if isinstance(text, str):
            line["text"] = text
        self._out.write(json.dumps(line) + "\n")

    def close(self) -> None:
        self._out.close()


def _load(lines: Iterable[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines if line.strip()]


def turns(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One summary per caller turn that got a reply: times in ms after its last VAD stop.

    ``stt``: the last transcript; ``end_of_turn``; ``llm_first``: the reply's first token;
    ``tokens`` and ``token_ms``: how many tokens came until its first audio and the median gap
    between them; ``first_audio``: the TTS's first audio; ``bot_started``: the transport's.
    """
    out: list[dict[str, Any]] = []
    by_call: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_call.setdefault(r["call"], []).append(r)
    for call, rs in by_call.items():
        turn: dict[str, Any] | None = None
        for r in rs:
            kind = r["frame"]
            if kind == "VADUserStoppedSpeakingFrame":
                turn = {"call": call, "stop": r["t"], "tokens": []}
            elif turn is None:
                continue
            elif kind == "VADUserStartedSpeakingFrame":
                turn["tokens"], turn["first_audio_t"] = [], None  # the caller went on: what came is void
                turn.pop("llm_first_t", None)
            elif kind == "TranscriptionFrame":
                turn["stt_t"], turn["text"] = r["t"], r.get("text", "")
            elif kind == "UserStoppedSpeakingFrame":
                turn["end_t"] = r["t"]
            elif kind == "LLMTextFrame" and turn.get("first_audio_t") is None:
                turn.setdefault("llm_first_t", r["t"])
                turn["tokens"].append(r["t"])
            elif kind == "TTSFirstAudio" and turn.get("llm_first_t") is not None:
                turn.setdefault("first_audio_t", r["t"])
            elif kind == "BotStartedSpeakingFrame" and turn.get("first_audio_t") is not None:
                out.append(_summary(turn, r["t"]))
                turn = None
    return out


def _summary(turn: dict[str, Any], bot_t: float) -> dict[str, Any]:
    def ms(key: str) -> float | None:
        t = turn.get(key)
        return round(1000 * (t - turn["stop"])) if t is not None else None

    gaps = sorted(b - a for a, b in zip(turn["tokens"], turn["tokens"][1:], strict=False))
    return {
        "call": turn["call"],
        "text": turn.get("text", ""),
        "stt": ms("stt_t"),
        "end_of_turn": ms("end_t"),
        "llm_first": ms("llm_first_t"),
        "tokens": len(turn["tokens"]),
        "token_ms": round(1000 * gaps[len(gaps) // 2]) if gaps else None,
        "first_audio": ms("first_audio_t"),
        "bot_started": round(1000 * (bot_t - turn["stop"])),
    }


def read_turns(path: str | Path) -> list[dict[str, Any]]:
    """:func:`turns` of a frame log file; a last line cut short (the demo stopped mid-write) is skipped."""
    lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    if len(lines) > 1 and lines[-1].startswith("{") and not lines[-1].rstrip().endswith("}"):
        lines.pop()
    return turns(_load(lines))


def summarise(path: str | Path) -> str:
    rows = read_turns(path)
    if not rows:
        return f"{path}: no answered turn in it"
    lines = [
        "ms after the VAD stop: STT, end of turn, LLM first token, tokens before the first audio"
        " (their median gap), TTS first audio, transport; the caller's words"
    ]
    for r in rows:
        lines.append(
            f"{r['call'][:12]:12s} {r['stt']!s:>5} {r['end_of_turn']!s:>5} {r['llm_first']!s:>5} "
            f"{r['tokens']:>3} ({r['token_ms']!s:>4} ms) {r['first_audio']!s:>5} {r['bot_started']!s:>5}"
            f"  {r['text'][:48]!r}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.pipecat_frame_log", description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help=f"a file the demo wrote ({ENV}=FILE)")
    args = parser.parse_args(argv)
    if not args.path.is_file():
        print(f"frame_log: no such file: {args.path}")
        return 2
    try:
        print(summarise(args.path))
    except (ValueError, KeyError) as exc:
        print(f"frame_log: {args.path} is not a frame log ({exc})")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
