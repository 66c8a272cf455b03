# `make demo` and `make test` each set everything up first (idempotent).
PY := .venv/bin/python
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup demo smoke test test-slow lint format clean labs

setup:
	bash scripts/setup.sh

demo: setup
	$(PY) -m vlastack.cli demo

smoke: setup
	$(PY) -m vlastack.cli smoke

test: setup
	$(PY) -m ruff check . && $(PY) -m ruff format --check .
	$(PY) -m pytest -q -x -n 2 --dist worksteal --durations=15

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
