"""The engine-independent core: what every engine's server shares.

* ``engine``    - the :class:`~tts_service.core.engine.Engine` protocol (the verbs the runtime
  and the server call) and :class:`~tts_service.core.engine.VoiceInfo`;
* ``scheduler`` - :class:`~tts_service.core.scheduler.StreamScheduler`: stream lifecycle
  (:class:`~tts_service.core.scheduler.Status`), held audio, paced release,
  :class:`~tts_service.core.scheduler.Output` and
  :class:`~tts_service.core.scheduler.Overloaded`;
* ``runtime``   - :class:`~tts_service.core.runtime.SynthesizerBase`: the stream verbs, sinks,
  the compute and release loops and delivery.

An engine lives in its own package beside this one (``tts_service/piper``,
``tts_service/orpheus``) with three parts: an engine class that fits ``Engine``, a
``StreamScheduler`` subclass that plans its unit of work (``schedule`` / ``update`` /
``refusal`` / ``_queue`` / ``_computing``), and a ``SynthesizerBase`` subclass that builds that
scheduler and runs one plan in the worker (``_run`` / ``_batch_size``); its scheduler defines
what it exchanges with the engine, and the engine imports the scheduler. A ``serve`` module is
its entry in the registry (:mod:`tts_service.engines`), which finds it by name. The server
serves any such synthesizer unchanged. Nothing here, in the transports or in the launchers
imports an engine package (tests/test_layout.py).
"""
