"""The Piper engine (the default, CPU): a Piper VITS voice split for exact streaming.

* ``voices``    - finding a voice, splitting its graph at the decoder's input (cached on disk);
* ``receptive`` - the decoder's receptive field, read from its graph (and measured at load);
* ``engine``    - :class:`~tts_service.piper.engine.PiperEngine`: front parts per segment,
  decoder windows with exactly the context they need;
* ``scheduler`` - window planning on top of the core's ``StreamScheduler``;
* ``runtime``   - :class:`~tts_service.piper.runtime.Synthesizer`, the driver the server runs.

The engine-independent parts are in :mod:`tts_service.core`.
"""
