"""``streamvox simulate``: the agent's runtime driven against a real TTS server on a simulated caller.

A tool beside the product, not part of it (as ``bench`` is for the server): it drives
:mod:`agent.runtime` and a ``TTSClient`` the way an agent would, with a synthetic caller
(:mod:`.sounds`, speech rendered by our own voice), and measures barge-in (:mod:`.barge_in`) and
false interruptions (:mod:`.false_interruption`). Nothing in ``agent``, ``tts_service`` or
``pipelines`` imports it; the CLI finds it through the ``streamvox.commands`` entry point.
"""
