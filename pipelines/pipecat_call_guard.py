"""A call that loses its TTS server or its LLM mid-turn tells the caller, and recovers when the part is back.

Why: Pipecat writes a service off for good after a few failed reconnects (``is_usable`` False:
every later token is one WARNING and no audio), so a TTS server that the supervisor restarts in
a second still leaves the call silent for the rest of its life, and the caller hears dead air
with no idea why. :class:`CallGuard` observes the pipeline:

* an error from the TTS service or the LLM while an answer is due (the LLM started one and the
  bot has not been quiet a second since, or the TTS still owes audio of a reply) plays a short,
  true apology from a clip rendered at start-up
  (``pipelines.voice_prompts``; the TTS server may be the part that is gone), once per turn;
* a service written off is given back its work (``set_usable(True)``): the streamvox TTS service
  re-dials on the next turn with its own short back-off, the LLM client opens a new request per
  turn anyway. So the first turn after the part is back is answered.

The clip goes straight to the output transport, not through the pipeline: an LLM still
streaming the lost answer would hold it back otherwise.
"""

from __future__ import annotations

import asyncio
import time

from loguru import logger
from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    ErrorFrame,
    LLMFullResponseStartFrame,
    OutputAudioRawFrame,
)
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.services.llm_service import LLMService

from pipelines.voice_prompts import LLM_LOST, TTS_LOST, VoicePrompts

HEARD_S = 1.0  # quiet this long after an answer began: it was heard (an error after that lost nothing)
QUIET_AFTER_S = 3.0  # after an apology has played, errors of the same failure are not apologised for again
WHAT = {"tts": "the TTS server", "llm": "the LLM"}


class CallGuard(BaseObserver):
    """Watches one call's pipeline (``worker.add_observer``); see the module docstring."""

    def __init__(self, *, tts, output, prompts: VoicePrompts, fmt: tuple[int, str]) -> None:
        super().__init__()
        self._tts, self._output, self._prompts, self._fmt = tts, output, prompts, fmt
        self._answer_due = False  # the LLM started an answer, not apologised for since
        self._stopped_at: float | None = None  # when the bot last went quiet (None: speaking, or not since the answer)
        self._quiet_until = 0.0
        self._tasks: set[asyncio.Task] = set()
        self.apologies: list[str] = []  # the part ("tts", "llm") each apology was for

    def _part(self, processor) -> str | None:
        if processor is self._tts:
            return "tts"
        if isinstance(processor, LLMService):
            return "llm"
        return None

    async def on_push_frame(self, data: FramePushed) -> None:
        if not data.first_push:
            return
        frame = data.frame
        if isinstance(frame, LLMFullResponseStartFrame):
            self._answer_due, self._stopped_at = True, None
        elif isinstance(frame, BotStartedSpeakingFrame):
            self._stopped_at = None
        elif isinstance(frame, BotStoppedSpeakingFrame):
            self._stopped_at = time.monotonic()
        elif isinstance(frame, ErrorFrame):
            processor = frame.processor or data.source
            part = self._part(processor)
            if part is None:
                return
            self._spawn(self._give_work_back(processor))
            if self._lost_answer(part) and time.monotonic() >= self._quiet_until:
                self._answer_due = False
                self._quiet_until = time.monotonic() + 60.0  # until the clip's length is known
                self._spawn(self._apologise(part))

    def _lost_answer(self, part: str) -> bool:
        """Whether this error costs the caller an answer: the LLM started one, and the bot has not
        been quiet for ``HEARD_S`` since (a TTS server that dies mid-reply stops the audio, and
        Pipecat calls that "stopped speaking", before its error arrives), or the TTS still owes
        audio of a reply (an open audio context). A death within ``HEARD_S`` of a reply that did
        end is taken for a lost one: the cost is one needless "sorry"."""
        if part == "llm":
            return self._answer_due
        heard = self._stopped_at is not None and time.monotonic() - self._stopped_at >= HEARD_S
        return (self._answer_due and not heard) or bool(self._tts.get_audio_contexts())

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _give_work_back(self, processor) -> None:
        await asyncio.sleep(0)  # after the worker has taken the error in
        if not processor.is_usable:
            logger.info(f"call: {processor} was written off; it gets the next turn again (the part may be back)")
            await processor.set_usable(True)

    async def _apologise(self, part: str) -> None:
        text = TTS_LOST if part == "tts" else LLM_LOST
        clip = self._prompts.cached(text, self._fmt)
        if clip is None:
            try:
                clip = await self._prompts.clip(text, self._fmt)
            except Exception as exc:  # the TTS server is the part that is gone, and no clip was kept
                logger.warning(f"call: {WHAT[part]} failed this turn and there is no apology to play ({exc})")
                self._quiet_until = time.monotonic() + QUIET_AFTER_S
                return
        rate = self._fmt[0]
        self._quiet_until = time.monotonic() + len(clip) / 2 / rate + QUIET_AFTER_S
        logger.warning(f"call: {WHAT[part]} failed this turn; the caller hears an apology")
        self.apologies.append(part)
        await self._output.queue_frame(OutputAudioRawFrame(audio=clip, sample_rate=rate, num_channels=1))
