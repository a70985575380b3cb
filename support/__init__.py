"""Helpers that the tests, the scripts and the benchmarks share (callers, echo paths, in-process
servers, the Pipecat and browser harnesses): not part of the product.

Nothing in ``tts_service``, ``agent`` or ``pipelines`` imports this package; scripts put the
repository root on ``sys.path`` and import it, tests import it directly. A helper that a script
needs lives here rather than in ``tests/``: nothing outside ``tests/`` imports ``tests/``.
"""
