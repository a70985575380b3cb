"""A toy third engine, outside ``tts_service``, to prove the engine registry.

It has the parts every engine has (``engine``, ``scheduler``, ``runtime`` and the registry
entry ``serve``), in the same import direction as Piper and Orpheus, and renders each text
segment as a sine tone (0.01 s per character at the voice's pitch): enough to check, from the
audio alone, that the server streamed what this engine made. Registered by module path
(``tts_service.engines.register("toy", "tests.tts_service.toy_engine.serve")`` or a
``streamvox.engines`` entry point); nothing in ``tts_service`` names it.
"""
