"""Speculative replies: the LLM starts on the caller's words at the VAD stop, before the end of turn is known.

Why: when smart-turn calls a finished turn incomplete, the turn waits for its silence timeout and
only then does the LLM start; the caller hears the whole wait plus the LLM's first token plus the
TTS's first audio. Started at the transcript instead, the LLM's part runs inside the wait.

:class:`SpeculativeTurnStop` is the demo's stop strategy (Silero VAD stop, then smart-turn, then the
transcript: Pipecat's ``TurnAnalyzerUserTurnStopStrategy``) plus Pipecat 1.14's own speculation
protocol, which its LLM services already honour:

* the first transcript after a VAD stop starts an inference on the turn's text so far
  (``trigger_user_turn_inference_triggered(speculation=...)``): the user aggregator runs it on a
  provisional copy of the context, and the LLM service holds every frame of its response;
* the end of turn, when the words are the same, confirms it (``confirms_speculation``): the
  held response is released at once and no second inference runs;
* the caller speaking again, or an end of turn with other words, withdraws it
  (``EagerEndOfTurnCancelFrame``): the LLM service stops that inference and drops what it held;
  nothing of it is heard, and the turn's words are answered together when it does end.

Pipecat holds the response's text in the LLM service, so the TTS would start only at the release;
the demo holds its audio instead (``agent.pipecat_speculation``, ``STREAMVOX_SPECULATE=on``): the
TTS runs during the wait too, and a withdrawn reply's synthesis is cancelled on the server.
:attr:`SpeculativeTurnStop.counts` says how much work was wasted.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Any

from loguru import logger
from pipecat.audio.turn.smart_turn.base_smart_turn import BaseSmartTurn
from pipecat.audio.turn.smart_turn.local_smart_turn_v3 import LocalSmartTurnAnalyzerV3
from pipecat.frames.frames import (
    Frame,
    InputAudioRawFrame,
    TranscriptionFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.turns.types import ProcessFrameResult, UserTurnSpeculation
from pipecat.turns.user_stop import TurnAnalyzerUserTurnStopStrategy

from pipelines.pipecat_stt import SegmentTranscribedFrame
from pipelines.turn_judge import words


class SharedSmartTurn(LocalSmartTurnAnalyzerV3):
    """Pipecat's smart-turn v3 analyzer whose ONNX session is loaded once per process, at its first
    prediction (in the analyzer's executor), not per call on the event loop.

    ``LocalSmartTurnAnalyzerV3`` loads the model in its constructor: on the event loop at every
    call's start, which every other call's audio waited through (``pipelines.loop_watch``),
    while the judge, the default end of turn, does not run smart-turn unless told to. The session's
    ``run`` is thread-safe; each analyzer keeps its own audio.
    """

    def __init__(self, **kwargs) -> None:
        BaseSmartTurn.__init__(self, **kwargs)  # not V3's own: that loads the model
        self._log_data = False

    @property
    def _session(self):  # V3's predictions read it
        return smart_turn_session()


_SMART_TURN: list = []
_SMART_TURN_LOCK = threading.Lock()


def smart_turn_session():
    """The bundled smart-turn v3 model's ONNX session (V3's own options), loaded on first use."""
    with _SMART_TURN_LOCK:
        if not _SMART_TURN:
            _SMART_TURN.append(LocalSmartTurnAnalyzerV3()._session)
        return _SMART_TURN[0]


def same_words(a: str, b: str) -> bool:
    """Whether two transcripts say the same words (case and punctuation aside)."""
    return words(a) == words(b)


@dataclass
class SpeculationCounts:
    """Speculative inferences per call: started, confirmed (their response played), withdrawn (wasted)."""

    started: int = 0
    confirmed: int = 0
    withdrawn: int = 0


class SpeculativeTurnStop(TurnAnalyzerUserTurnStopStrategy):
    """The turn analyzer's end of turn, with the reply's inference started at the first transcript."""

    def __init__(self, *, speculate: bool = True, **kwargs) -> None:
        super().__init__(**kwargs)
        self.speculate = speculate  # False: the counting and the turn logic without the early inference
        self.counts = SpeculationCounts()
        self._turn_text = ""  # every transcript of the open turn (the base keeps only the last)
        self._turn_open = False
        self._speculation: UserTurnSpeculation | None = None
        self._segment_words = False  # a transcript with words came since the last segment's decode ended

    async def handle_user_turn_started(self) -> None:
        await super().handle_user_turn_started()
        self._turn_open = True

    async def handle_user_turn_stopped(self) -> None:
        self._turn_open = False
        await super().handle_user_turn_stopped()

    async def _reset(self) -> None:
        # a turn boundary with a speculation still in flight (a stop timeout, an interruption): withdraw it
        await self._withdraw()
        self._turn_text = ""
        await super()._reset()

    async def process_frame(self, frame: Frame) -> ProcessFrameResult:
        if isinstance(frame, VADUserStartedSpeakingFrame):
            await self._withdraw()  # the caller goes on: what was started answers half a turn
        elif isinstance(frame, TranscriptionFrame) and frame.text.strip():
            self._turn_text = f"{self._turn_text} {frame.text.strip()}".strip()
            self._segment_words = True
        elif isinstance(frame, SegmentTranscribedFrame):
            heard, self._segment_words = self._segment_words, False
            if not heard and not frame.queued and self._turn_open and not self._vad_user_speaking:
                await self._segment_without_words()
        result = await super().process_frame(frame)  # may end the turn (then handle_user_turn_stopped ran)
        if (
            self.speculate
            and isinstance(frame, TranscriptionFrame)
            and self._turn_open
            and self._speculation is None
            and not self._vad_user_speaking
            and self._turn_text
        ):
            self._speculation = UserTurnSpeculation(text=self._turn_text)
            self.counts.started += 1
            await self.trigger_user_turn_inference_triggered(speculation=self._speculation)
        return result

    async def _segment_without_words(self) -> None:
        """The caller is silent and the last segment's decode brought no words (a cough, a word Whisper
        dropped, an echo transcript dropped on the way). A turn with no words at all is over: nothing
        more is coming, and waiting for the aggregator's stop timeout is only dead air. A turn with
        words is the turn analyzer's to end, as it ends any."""
        if not self._turn_text:
            await self.trigger_user_turn_stopped()

    async def trigger_user_turn_stopped(self, *, enable_user_speaking_frames: bool | None = None) -> None:
        speculation, self._speculation = self._speculation, None
        if speculation is not None and same_words(speculation.text, self._turn_text):
            self.counts.confirmed += 1
            await self.trigger_user_turn_finalized(
                enable_user_speaking_frames=enable_user_speaking_frames, confirms_speculation=True
            )
            return
        if speculation is not None:
            self.counts.withdrawn += 1
            await self.trigger_user_turn_speculation_cancelled()
        await super().trigger_user_turn_stopped(enable_user_speaking_frames=enable_user_speaking_frames)

    async def _withdraw(self) -> None:
        if self._speculation is not None:
            self._speculation = None
            self.counts.withdrawn += 1
            await self.trigger_user_turn_speculation_cancelled()


class JudgedTurnStop(SpeculativeTurnStop):
    """:class:`SpeculativeTurnStop` with the end of turn decided by :class:`pipelines.turn_judge.TurnJudge`.

    Why: smart-turn alone ends the turn in most of the corpus's mid-thought pauses and makes
    finished questions wait for its timeout (docs/BENCHMARKS.md, "Turn-taking and voice-to-voice").
    Here its verdict is one optional input (run at each VAD stop only when the judge reads it:
    ``acoustic``), and when the segment's transcript arrives the caller's words so far are read by
    the text model (``pipelines.text_turn``); the judge turns the transcript's cue, the
    probabilities and the silence into one wait, counted from the VAD stop. The caller speaking
    again cancels it (and withdraws the speculation). A turn never ends before its transcript; when
    its last segment brings none, the words so far are judged from that segment's stop.
    """

    def __init__(self, *, judge: Any = None, words: Any = None, **kwargs) -> None:
        from pipelines.turn_judge import TurnJudge

        super().__init__(**kwargs)
        self.judge = judge or TurnJudge()
        self.words = words  # a TextTurnModel (or anything with ``p_end_async``); None: the cue alone
        self.decisions: list[dict[str, Any]] = []  # per pause: words, probabilities, wait (figures)
        self._stopped_at: float | None = None  # time.time() of the VAD stop the pending decision counts from
        # the last VAD stop while the caller has not spoken since: a turn boundary does not clear it
        # (a transcript that comes after the previous turn ended still counts from its own stop)
        self._last_stop: float | None = None
        self._acoustic: float | None = None
        self._logprob: float | None = None  # how sure Whisper was of the last segment's words
        self._decision: asyncio.Task | None = None
        # Smart-turn's verdict is an inference at every VAD stop, on the cores the STT and the
        # speculative reply need at that moment, and the stop strategy awaits it before it handles
        # the next frame (the transcript that starts the speculation). The judge reads it only with
        # ``trust_acoustic`` or ``rescue_acoustic`` set (both off by default): otherwise it is not run.
        self.acoustic = self.judge.trust_acoustic is not None or self.judge.rescue_acoustic is not None

    async def _handle_input_audio(self, frame: InputAudioRawFrame) -> None:
        # the analyzer keeps its buffer; its own silence timeout is not a decision here
        if self.acoustic:
            self._turn_analyzer.append_audio(frame.audio, self._vad_user_speaking)

    async def _handle_vad_user_started_speaking(self, frame: VADUserStartedSpeakingFrame) -> None:
        self._last_stop = None
        await super()._handle_vad_user_started_speaking(frame)

    async def _handle_vad_user_stopped_speaking(self, frame: VADUserStoppedSpeakingFrame) -> None:
        self._vad_user_speaking, self._vad_stopped = False, True
        self._stopped_at = self._last_stop = frame.timestamp
        self._acoustic = None
        if self.acoustic:
            _state, prediction = await self._turn_analyzer.analyze_end_of_turn()
            await self._handle_prediction_result(prediction)
            self._acoustic = getattr(prediction, "probability", None)

    async def _handle_transcription(self, frame: TranscriptionFrame) -> None:
        self._text = frame.text
        result = frame.result if isinstance(frame.result, dict) else {}
        self._logprob = result.get("text_logprob")
        # A transcript whose VAD stop came before the last turn ended (the caller's last words in a
        # segment of their own, "... the train. | Please.", transcribed after the judge had closed
        # the turn on the first part) starts a turn the stop strategy saw no VAD stop in: it counts
        # from that stop all the same, or it would wait for the aggregator's stop timeout, seconds
        # of dead air
        await self._judge_from_the_last_stop()

    async def _segment_without_words(self) -> None:
        # the words before a cough are judged from the cough's stop (smart-turn's verdict then includes it)
        if self._turn_text:
            await self._judge_from_the_last_stop()
        else:
            await super()._segment_without_words()

    async def _judge_from_the_last_stop(self) -> None:
        stopped_at = self._stopped_at if self._stopped_at is not None else self._last_stop
        if self._vad_user_speaking or stopped_at is None or not self._turn_text:
            return  # mid-speech, or a transcript with no VAD stop to count from
        self._stopped_at = stopped_at
        await self._cancel_decision()
        self._decision = self.task_manager.create_task(
            self._decide(self._turn_text, stopped_at, self._acoustic, self._logprob), f"{self}::decide"
        )

    async def _decide(self, text: str, stopped_at: float, acoustic: float | None, logprob: float | None) -> None:
        t0 = time.perf_counter()
        p_words = None
        if self.words is not None:
            try:
                p_words = await self.words.p_end_async(text)
            except Exception as exc:  # a failing text model must not leave the turn open
                logger.warning(f"{self}: the caller's words could not be read ({exc!r}); the cue decides")
        wait = self.judge.wait_s(text, acoustic, p_words, logprob)
        judge_ms = 1000 * (time.perf_counter() - t0)
        self.decisions.append(
            dict(text=text, acoustic=acoustic, words=p_words, logprob=logprob, wait_s=wait, judge_ms=judge_ms)
        )
        await asyncio.sleep(max(0.0, stopped_at + wait - time.time()))
        self._decision = None
        self._stopped_at = None
        await self.trigger_user_turn_stopped()

    async def _maybe_trigger_user_turn_stopped(self) -> None:
        return  # the judge's task decides (Pipecat's verdict-and-transcript rule is not used)

    async def _cancel_decision(self) -> None:
        task, self._decision = self._decision, None
        if task is not None and task is not asyncio.current_task():
            await self.task_manager.cancel_task(task)

    async def _discard_pending_end_of_turn(self) -> None:
        await self._cancel_decision()  # the caller speaks again, or a turn boundary
        self._stopped_at = None
        await super()._discard_pending_end_of_turn()

    async def cleanup(self) -> None:
        await self._cancel_decision()
        await super().cleanup()
