"""``streamvox bench``: tell real streaming from chunked batch rendering, with numbers.

* ``conformance`` - the five streaming tests (TTFB vs length, delivery vs real time, mid-stream
  cancel, mid-stream input update, connection persistence);
* ``load`` - a concurrency sweep with simulated real-time players;
* ``--baseline`` - the same tests, in the same run, against a whole-utterance (batch) server
  speaking the same protocol (:mod:`bench.baseline`).

A tool beside the server, not part of it: it drives streamvox over the wire like any client (all
of it through :mod:`tts_service.protocol`), and the server package never imports it. ``streamvox
bench`` finds it through the ``streamvox.commands`` entry point (pyproject.toml), as it finds
``streamvox simulate``.
"""


class BenchError(Exception):
    """A problem the user can fix (a bad option, a server that did not start or answer): printed as
    one line, exit status 2 - the bench's own type, so it needs nothing of the server's CLI."""
