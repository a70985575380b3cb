"""What the assembled agents say and how they are told to speak, shared by the Pipecat and LiveKit agents.

Kept free of either framework so the LiveKit worker does not import Pipecat (and back). Both read
the same environment variables, so a prompt set for one agent means the same for the other, and
their number settings go through one rule (:func:`env_number`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

SYSTEM_PROMPT = (
    "You are a friendly voice assistant on a phone or video call. Your replies are spoken aloud: "
    "answer in one to three short sentences of plain conversational English, with no lists, "
    "no markdown, no emoji and no special characters. If you did not understand, ask briefly."
)
GREETING = "Hello! I am the streamvox demo agent. Ask me anything, and feel free to interrupt me."


def system_prompt(env: Mapping[str, str] = os.environ) -> str:
    """``AGENT_SYSTEM_PROMPT``; ``AGENT_INSTRUCTIONS`` (the LiveKit worker's former name) still works."""
    return env.get("AGENT_SYSTEM_PROMPT") or env.get("AGENT_INSTRUCTIONS") or SYSTEM_PROMPT


def greeting(env: Mapping[str, str] = os.environ) -> str | None:
    """``AGENT_GREETING``: the agent's first words; set but empty: no greeting."""
    text = env.get("AGENT_GREETING", GREETING).strip()
    return text or None


def llm_temperature(env: Mapping[str, str] = os.environ) -> float | None:
    """``LLM_TEMPERATURE``; unset: None, the endpoint's own default (``pipelines.local_llm``: greedy).

    Raises ValueError with a one-line reason for anything but a number within [0, 2].
    """
    return env_number("LLM_TEMPERATURE", None, low=0.0, high=2.0, what="a number within [0, 2]", env=env)


def env_number(
    name: str,
    default: float | None,
    *,
    low: float,
    high: float = math.inf,
    what: str,
    env: Mapping[str, str] = os.environ,
) -> float | None:
    """A number setting from the environment (``default`` when unset or empty); anything else than
    a number within [``low``, ``high``] raises ValueError: "NAME must be <what>, got '<value>'"."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not low <= value <= high:
        raise ValueError(f"{name} must be {what}, got {raw!r}")
    return value


ECHO_MODES = ("auto", "phone", "on", "off")


def echo_mode(env: Mapping[str, str] = os.environ, default: str = "phone") -> str:
    """``STREAMVOX_ECHO_CANCEL`` (``default`` when unset: each agent passes its own), where the agent
    removes its own echo: "auto" (the Pipecat agent: phone calls, and page calls whose page asks the
    browser for echo cancellation, i.e. does not say headphones; the LiveKit worker reads it as
    "phone"), "phone" (the Pipecat agent: phone calls; the LiveKit worker: SIP participants), "on"
    (every call), "off". ValueError with a one-line reason for anything else."""
    raw = env.get("STREAMVOX_ECHO_CANCEL", "").strip().lower() or default
    if raw not in ECHO_MODES:
        raise ValueError(
            f"STREAMVOX_ECHO_CANCEL must be one of {', '.join(ECHO_MODES)}, got {env.get('STREAMVOX_ECHO_CANCEL')!r}"
        )
    return raw
