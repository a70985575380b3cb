"""Both assembled agents read their prompt, greeting and LLM temperature the same way."""

from __future__ import annotations

import pytest

from pipelines.persona import GREETING, SYSTEM_PROMPT, greeting, llm_temperature, system_prompt


def test_the_system_prompt_comes_from_one_variable_for_both_agents():
    assert system_prompt({}) == SYSTEM_PROMPT
    assert system_prompt({"AGENT_SYSTEM_PROMPT": "Be terse."}) == "Be terse."
    # the LiveKit worker's former name still works, and the shared name wins over it
    assert system_prompt({"AGENT_INSTRUCTIONS": "Be kind."}) == "Be kind."
    assert system_prompt({"AGENT_SYSTEM_PROMPT": "Be terse.", "AGENT_INSTRUCTIONS": "Be kind."}) == "Be terse."
    assert system_prompt({"AGENT_SYSTEM_PROMPT": ""}) == SYSTEM_PROMPT


def test_an_empty_greeting_means_none():
    assert greeting({}) == GREETING
    assert greeting({"AGENT_GREETING": "Hi there."}) == "Hi there."
    assert greeting({"AGENT_GREETING": "  "}) is None


def test_the_temperature_is_the_endpoints_unless_set_and_a_bad_one_is_named():
    assert llm_temperature({}) is None
    assert llm_temperature({"LLM_TEMPERATURE": "0.7"}) == 0.7
    assert llm_temperature({"LLM_TEMPERATURE": "0"}) == 0.0
    for bad in ("hot", "-1", "2.5", "nan"):
        with pytest.raises(ValueError, match="LLM_TEMPERATURE must be a number within"):
            llm_temperature({"LLM_TEMPERATURE": bad})
