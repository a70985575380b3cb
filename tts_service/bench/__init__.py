"""``streamvox bench``: tell real streaming from chunked batch rendering, with numbers.

* ``conformance`` - the five streaming tests (TTFB vs length, delivery vs real time, mid-stream
  cancel, mid-stream input update, connection persistence);
* ``load`` - a concurrency sweep with simulated real-time players;
* ``--baseline`` - the same tests, in the same run, against a whole-utterance (batch) server
  speaking the same protocol (:mod:`tts_service.bench.baseline`).

Everything that touches the wire goes through :mod:`tts_service.protocol`.
"""
