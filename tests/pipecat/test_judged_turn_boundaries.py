"""``JudgedTurnStop`` at a turn boundary, frame by frame: Pipecat 1.14's stop strategy as the user
aggregator drives it (its own task manager, smart-turn v3 loaded for real), no pipeline around it.

The case: the caller's "I would rather take the train, please." comes as two VAD segments; the
judge ends the turn on the first transcript, and the second segment's transcript ("Please.")
arrives after that turn ended. Its VAD stop came before the boundary, so the new turn has no stop
of its own to count from; before the fix it waited for the aggregator's stop timeout (4 s of dead
air at the page, seen in the browser scenario's frame log).

And a segment that brings no words (a cough, a word Whisper drops): the STT says when its decode is
over (``SegmentTranscribedFrame``), and the strategy ends the turn then, or judges the words before
it, instead of leaving it to the aggregator's stop timeout.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from pipecat.clocks.system_clock import SystemClock
from pipecat.frames.frames import TranscriptionFrame, VADUserStartedSpeakingFrame, VADUserStoppedSpeakingFrame
from pipecat.processors.frame_processor import FrameProcessorSetup
from pipecat.utils.asyncio.task_manager import TaskManager

from pipelines.pipecat_stt import SegmentTranscribedFrame
from pipelines.pipecat_turns import JudgedTurnStop, SpeculativeTurnStop


@pytest.fixture
async def stop(request):
    from pipecat.audio.turn.smart_turn.local_smart_turn_v3 import LocalSmartTurnAnalyzerV3

    kind = getattr(request, "param", JudgedTurnStop)  # the demo's smart-turn path: SpeculativeTurnStop
    strategy = kind(
        turn_analyzer=LocalSmartTurnAnalyzerV3(), speculate=False, **({"words": None} if kind is JudgedTurnStop else {})
    )
    setup = FrameProcessorSetup(
        clock=SystemClock(), task_manager=TaskManager(), pipeline_worker=None, audio_in_sample_rate=16000
    )
    await strategy.setup(setup)
    strategy.ended = []

    @strategy.event_handler("on_user_turn_stopped")
    async def _ended(*_args, **_kwargs) -> None:
        strategy.ended.append(time.monotonic())

    await strategy.handle_user_turn_started()
    yield strategy
    await strategy.cleanup()


async def _speech(stop: JudgedTurnStop, seconds: float) -> None:
    await stop.process_frame(VADUserStartedSpeakingFrame())
    await asyncio.sleep(seconds)
    await stop.process_frame(VADUserStoppedSpeakingFrame())


async def _ended(stop: JudgedTurnStop, count: int, within_s: float) -> bool:
    t0 = time.monotonic()
    while len(stop.ended) < count and time.monotonic() - t0 < within_s:
        await asyncio.sleep(0.01)
    return len(stop.ended) >= count


async def _next_turn(stop: JudgedTurnStop) -> None:
    await stop.handle_user_turn_stopped()  # what the aggregator does at the boundary
    await stop.handle_user_turn_started()


async def test_a_transcript_after_the_turn_ended_counts_from_its_own_vad_stop(stop) -> None:
    await _speech(stop, 0.3)  # "I would rather take the train"
    await _speech(stop, 0.1)  # ", please."
    await stop.process_frame(TranscriptionFrame("I would rather take the train.", "caller", "now"))
    assert await _ended(stop, 1, 3.0), stop.decisions  # the judge's sentence wait, from the last stop
    await _next_turn(stop)
    await asyncio.sleep(0.3)  # Whisper's decode of the second segment
    asked = time.monotonic()
    await stop.process_frame(TranscriptionFrame("Please.", "caller", "now"))
    assert await _ended(stop, 2, 3.0), stop.decisions  # not the 4 s stop timeout: never, here
    # its stop was a sentence wait ago already: the turn ends at once
    assert stop.ended[1] - asked < 0.3 and [d["text"] for d in stop.decisions] == [
        "I would rather take the train.",
        "Please.",
    ]


async def test_a_transcript_while_the_caller_speaks_again_waits_for_the_next_stop(stop) -> None:
    await _speech(stop, 0.2)
    await stop.process_frame(TranscriptionFrame("Could you send me", "caller", "now"))
    assert await _ended(stop, 1, 3.0)
    await _next_turn(stop)
    await stop.process_frame(VADUserStartedSpeakingFrame())  # the caller goes on: that stop is old
    await stop.process_frame(TranscriptionFrame("the invoice", "caller", "now"))
    assert not await _ended(stop, 2, 0.8), stop.decisions
    await stop.process_frame(VADUserStoppedSpeakingFrame())
    await stop.process_frame(TranscriptionFrame("for last month?", "caller", "now"))
    assert await _ended(stop, 2, 3.0), stop.decisions


@pytest.mark.parametrize("stop", [JudgedTurnStop, SpeculativeTurnStop], indirect=True)
async def test_a_turn_without_words_ends_when_its_last_decode_is_over(stop) -> None:
    await _speech(stop, 0.3)  # a cough
    await _speech(stop, 0.3)  # and another
    await stop.process_frame(SegmentTranscribedFrame(queued=1))  # the first decoded to nothing; one to go
    assert not await _ended(stop, 1, 0.5)
    decoded = time.monotonic()
    await stop.process_frame(SegmentTranscribedFrame(queued=0))
    assert await _ended(stop, 1, 1.0) and stop.ended[0] - decoded < 0.3


@pytest.mark.parametrize("stop", [JudgedTurnStop, SpeculativeTurnStop], indirect=True)
async def test_a_segment_with_words_is_the_transcripts_to_end(stop) -> None:
    await _speech(stop, 0.3)
    await stop.process_frame(VADUserStartedSpeakingFrame())  # still speaking when the decode ends
    await stop.process_frame(SegmentTranscribedFrame(queued=0))
    assert not await _ended(stop, 1, 0.3)
    await stop.process_frame(VADUserStoppedSpeakingFrame())
    await stop.process_frame(TranscriptionFrame("Hm, let me think", "caller", "now"))
    await stop.process_frame(SegmentTranscribedFrame(queued=0))  # its words came: not a wordless turn
    assert not await _ended(stop, 1, 0.3), stop.ended  # the judge waits on unfinished words


async def test_words_then_a_cough_are_judged_from_the_coughs_stop(stop) -> None:
    await _speech(stop, 0.3)
    await stop.process_frame(TranscriptionFrame("Could you send me the invoice for last month?", "caller", "now"))
    await stop.process_frame(SegmentTranscribedFrame(queued=0))
    await _speech(stop, 0.2)  # a cough before the judge's wait ran out: the caller went on
    coughed = time.monotonic()
    await asyncio.sleep(0.3)  # its decode
    await stop.process_frame(SegmentTranscribedFrame(queued=0))  # no words
    # decided on the words so far, from the cough's stop, not left open for the stop timeout
    assert await _ended(stop, 1, 3.0), stop.decisions
    assert stop.ended[0] - coughed < 2.0 and len(stop.ended) == 1, stop.decisions
    assert stop.decisions[-1]["text"] == "Could you send me the invoice for last month?"


async def test_the_judge_runs_smart_turn_only_when_it_reads_its_verdict(stop) -> None:
    """Smart-turn's inference at each VAD stop costs the cores the STT and the speculative reply need
    then, and the stop strategy awaits it before the next frame: by default the judge does not read
    it, so it is not run; with ``rescue_acoustic`` set it runs and its verdict reaches the decision."""
    from pipecat.frames.frames import InputAudioRawFrame

    from pipelines.turn_judge import TurnJudge

    calls = []
    original = stop._turn_analyzer.analyze_end_of_turn

    async def counted():
        calls.append(1)
        return await original()

    stop._turn_analyzer.analyze_end_of_turn = counted
    audio = InputAudioRawFrame(audio=bytes(640), sample_rate=16000, num_channels=1)
    assert not stop.acoustic
    await stop.process_frame(VADUserStartedSpeakingFrame())
    await stop.process_frame(audio)
    await stop.process_frame(VADUserStoppedSpeakingFrame())
    await stop.process_frame(TranscriptionFrame("What is the capital of France?", "caller", "now"))
    assert await _ended(stop, 1, 3.0), stop.decisions
    assert calls == [] and stop.decisions[-1]["acoustic"] is None
    await _next_turn(stop)
    stop.judge = TurnJudge(rescue_acoustic=0.9)
    stop.acoustic = JudgedTurnStop(judge=stop.judge, turn_analyzer=stop._turn_analyzer, words=None).acoustic
    assert stop.acoustic
    await stop.process_frame(VADUserStartedSpeakingFrame())
    for _ in range(25):  # half a second of audio for it to judge
        await stop.process_frame(audio)
    await stop.process_frame(VADUserStoppedSpeakingFrame())
    await stop.process_frame(TranscriptionFrame("And of Italy?", "caller", "now"))
    assert await _ended(stop, 2, 3.0), stop.decisions
    assert calls == [1] and stop.decisions[-1]["acoustic"] is not None
