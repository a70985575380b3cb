"""Short fixed messages in the agent's voice, rendered once and kept: what a caller hears when the
agent itself cannot speak.

Why cached clips: "all lines are busy" and "sorry, that answer was lost" are needed exactly when
the live path fails or is full. The TTS server may be the part that is gone, so the clip must
exist before it is needed: :meth:`VoicePrompts.warm` renders every message at start-up, and a
clip is only ever rendered again if that failed.
"""

from __future__ import annotations

import asyncio

from tts_service import protocol as P
from tts_service.client import TTSClient

BUSY = "Sorry, all our lines are busy right now. Please call again in a few minutes."
TTS_LOST = "Sorry, my voice dropped out and you missed my answer. Please say that again."
LLM_LOST = "Sorry, I lost my train of thought just now. Please say that again."

PHONE = (8000, P.MULAW)  # what a Twilio stream plays as it is
PHONE_PCM = (8000, P.PCM_S16LE)  # the phone pipeline's own audio (its serializer makes the mu-law)
WEB_PCM = (24000, P.PCM_S16LE)  # the WebRTC pipeline's output rate

ALL = [(BUSY, PHONE), (TTS_LOST, PHONE_PCM), (LLM_LOST, PHONE_PCM), (TTS_LOST, WEB_PCM), (LLM_LOST, WEB_PCM)]


class VoicePrompts:
    """Clips of fixed texts from the TTS server at ``url``, by (text, rate, encoding)."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = 10.0) -> None:
        self.url, self._api_key, self._timeout_s = url, api_key, timeout_s
        self._clips: dict[tuple[str, int, str], bytes] = {}

    def cached(self, text: str, fmt: tuple[int, str]) -> bytes | None:
        return self._clips.get((text, *fmt))

    async def clip(self, text: str, fmt: tuple[int, str]) -> bytes:
        """The clip, rendered now if it is not cached yet (raises if the server cannot be reached)."""
        key = (text, *fmt)
        if key not in self._clips:  # two callers at once may both render it: harmless, and no lock to bind a loop
            self._clips[key] = await asyncio.wait_for(self._render(text, *fmt), self._timeout_s)
        return self._clips[key]

    async def warm(self, items=ALL) -> None:
        """Render every clip the agent may need (at start-up, while the TTS server is up)."""
        for text, fmt in items:
            await self.clip(text, fmt)

    async def _render(self, text: str, rate: int, encoding: str) -> bytes:
        async with TTSClient(self.url, api_key=self._api_key) as client:
            ctx = await client.open(text=text, sample_rate=rate, encoding=encoding, pace=False)
            await ctx.end()
            return await ctx.collect()
