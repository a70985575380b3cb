"""The Piper engine (the default, CPU): a Piper VITS voice split for exact streaming.

* ``voices``    - finding a voice, splitting its graph at the decoder's input (cached on disk);
* ``receptive`` - the decoder's receptive field, read from its graph (and measured at load);
* ``engine``    - :class:`~tts_service.piper.engine.PiperEngine`: front parts per segment,
  decoder windows with exactly the context they need;
* ``scheduler`` - window planning on top of the core's ``StreamScheduler`` (it defines the
  prepared segment it plans for; the engine imports it, as in every engine here);
* ``runtime``   - :class:`~tts_service.piper.runtime.PiperSynthesizer`, the driver the server runs;
* ``serve``     - the registry's entry (:mod:`tts_service.engines`): options, ``build``, and
  :func:`~tts_service.piper.serve.load_piper_engine`.

The engine-independent parts are in :mod:`tts_service.core`.
"""
