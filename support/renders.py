"""Render a reply two ways through a real server, for intelligibility comparisons.

* ``render_streamed``: as an LLM sends it, one word-sized token at a time, so the server's
  segmenter makes every cut it makes in production (openings, capped heads, sentence ends);
* ``render_sentences``: one context per sentence, so the only cuts are sentence ends - what a
  sentence-by-sentence TTS does, the reference.

``reply_wer`` scores a transcript with numbers written either way ("seven" / "7"), so Whisper's
habit of writing digits is not counted as a synthesis error.

Used by ``test_first_segment.py`` and ``scripts/tts_first_audio.py``.
"""

from __future__ import annotations

import asyncio
import re
import time

import numpy as np

from support.tts_helpers import wer
from tts_service.client import AudioFrame, TTSClient

RATE = 16000
GAP_S = 0.2  # silence between the sentences of the reference render

_UNITS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()  # noqa: E501
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]


def tokens(text: str) -> list[str]:
    """Word-sized tokens with their leading space, as Pipecat's LLM services push them."""
    return re.findall(r"\s*\S+", text)


def _pcm(frames: list[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(frames), dtype="<i2").astype(np.float32) / 32768.0


async def render_streamed(client: TTSClient, text: str, token_s: float = 0.04) -> np.ndarray:
    """The reply sent token by token every ``token_s`` (paced, as an agent's context is)."""
    parts = tokens(text)
    ctx = await client.open(text=parts[0], sample_rate=RATE)
    t0 = time.monotonic()

    async def feed() -> None:
        for k, token in enumerate(parts[1:], 1):
            await asyncio.sleep(max(0.0, t0 + k * token_s - time.monotonic()))
            await ctx.send_text(token)
        await ctx.end()

    feeder = asyncio.create_task(feed())
    frames = [item.pcm async for item in ctx if isinstance(item, AudioFrame)]
    await feeder
    return _pcm(frames)


async def render_sentences(client: TTSClient, text: str) -> np.ndarray:
    """The reference: one unpaced context per sentence, ``GAP_S`` of silence between them."""
    parts: list[np.ndarray] = []
    for sentence in sentences(text):
        ctx = await client.open(text=sentence, sample_rate=RATE, pace=False)
        await ctx.end()
        parts += [_pcm([item.pcm async for item in ctx if isinstance(item, AudioFrame)])]
        parts += [np.zeros(int(GAP_S * RATE), np.float32)]
    return np.concatenate(parts)


def _spell(match: re.Match[str]) -> str:
    n = int(match.group())
    if n < 20:
        return _UNITS[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _UNITS[n % 10])
    return match.group()


def reply_wer(reference: str, transcript: str) -> float:
    """WER with numbers below 100 spelled out on both sides and "Dr." read as "doctor"."""

    def norm(text: str) -> str:
        return re.sub(r"\bdr\b\.?", "doctor", re.sub(r"\b\d{1,2}\b", _spell, text), flags=re.IGNORECASE)

    return wer(norm(reference), norm(transcript))
