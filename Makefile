# `make demo` and `make test` each set everything up first (idempotent).
PY := .venv/bin/python
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup demo smoke test test-integration test-py312 test-py313 test-slow lint format clean labs

setup:
	bash scripts/setup.sh

demo: setup
	$(PY) -m vlastack.cli demo

smoke: setup
	$(PY) -m vlastack.cli smoke

test: setup
	$(PY) -m ruff check . && $(PY) -m ruff format --check .
	$(PY) -m pytest -q -x -n 2 --dist worksteal --durations=15

# The end-to-end tier (marker `integration`: simulators, the compiler, several processes; 10-100 s
# a test), kept out of `make test` so that stays under 6 minutes on 2 cores. CI runs both.
test-integration: setup
	$(PY) -m pytest -q -x -n 2 --dist worksteal --durations=15 -m integration

# The same suite on Python 3.12 (LeRobot 0.6's Python) and 3.13, each in its own venv; CI runs
# them after `test`.
test-py312 test-py313: test-py%:
	PYTHON=python3.$(patsubst 3%,%,$*) VENV=.venv$* bash scripts/setup.sh
	.venv$*/bin/python -m pytest -q -x -n 2 --dist worksteal --durations=5
	.venv$*/bin/python -m pytest -q -x -n 2 --dist worksteal --durations=5 -m integration

test-slow: setup
	$(PY) -m pytest -q -m 'slow or timing'

lint:
	$(PY) -m ruff check . && $(PY) -m ruff format --check .

format:
	$(PY) -m ruff check --fix . && $(PY) -m ruff format .

# One full run of the labs -> the committed figures (docs/research/labs.md, bench/results/labs.json).
labs: setup
	$(PY) -m vlastack.cli lab all --json bench/results/labs.json --markdown docs/research/labs.md

clean:
	rm -rf runs .pytest_cache
