"""The first-segment policy costs no intelligibility: streamed tokens vs sentence-by-sentence renders.

A reply streamed at 25 tokens/s is cut by the server where the policy says (an opening clause
alone, a capped head at a phrase boundary, then sentence ends). Whisper tiny.en must understand
it as well as the same reply rendered one sentence per context. The bound is generous (the
voice samples noise, so each render differs a little); ``scripts/tts_first_audio.py`` measures
the difference over 20 replies.
"""

from __future__ import annotations

import asyncio
import statistics

from support.renders import RATE, render_sentences, render_streamed, reply_wer
from support.tts_helpers import RunningServer, transcribe
from tts_service.client import TTSClient

REPLIES = [
    "Sure, I can help with that. Your order shipped yesterday from our warehouse in Denver.",
    "Okay, so the earliest train leaves at seven in the morning and gets in just before noon.",
    "Of course, I have moved your booking to next Monday. You will get an email shortly.",
]


async def test_streamed_replies_are_as_intelligible_as_sentence_renders(live: RunningServer, whisper) -> None:
    async with TTSClient(live.ws_url) as client:
        streamed = await asyncio.gather(*(render_streamed(client, text) for text in REPLIES))
        reference = [await render_sentences(client, text) for text in REPLIES]

    heard = [transcribe(whisper, audio, RATE) for audio in streamed]
    heard_ref = [transcribe(whisper, audio, RATE) for audio in reference]
    wer_streamed = [reply_wer(text, h) for text, h in zip(REPLIES, heard, strict=True)]
    wer_ref = [reply_wer(text, h) for text, h in zip(REPLIES, heard_ref, strict=True)]
    print(f"WER streamed {wer_streamed}, sentence by sentence {wer_ref}")
    for text, h, w in zip(REPLIES, heard, wer_streamed, strict=True):
        # the opening, spoken as a segment of its own, is heard and nothing after it is lost
        assert h.lower().startswith(text.split(",")[0].lower()), (text, h)
        assert w <= 0.3, (text, h)
    assert statistics.fmean(wer_streamed) <= statistics.fmean(wer_ref) + 0.1, (heard, heard_ref)
