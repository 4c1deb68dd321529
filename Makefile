# Two commands do everything on a fresh clone: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.deps-installed

.PHONY: run test test-all install lint typecheck pytest pytest-slow bench validate calibrate clean

# The development environment includes the validate extra (torchtitan, megatron-core: the trace path and its
# tests); `pip install frenzy-opt` alone stays light.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q "torch==2.13.0" -e ".[dev,validate]"
	touch $(STAMP)

# An editable install points at the source tree, so new modules need no reinstall.
install: $(STAMP)

# The plans of the embedded default scenario, then the serverless flow: the HTTP service on its cluster with the
# simulated executor (an hour per second), the jobs submitted over HTTP, decisions printed live (about 30 s).
# `make run LAUNCH=1` then really trains a tiny decoder with torch.distributed on CPU slots (frenzy launch).
run: install
	$(BIN)/frenzy run
	$(BIN)/frenzy demo
	@if [ -n "$(LAUNCH)" ]; then $(BIN)/frenzy launch job-tiny --workdir .frenzy-runs; fi

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy -p frenzy_opt

# `make test` is the fast suite: every test not marked slow (torchrun and Ray runs, real server processes,
# slurmctld, schemathesis). `make test-all` adds the slow ones: what .ci/run runs.
pytest: install
	$(BIN)/pytest -n 2 -m "not slow"

pytest-slow: install
	$(BIN)/pytest -n 2 -m slow

test: lint typecheck pytest

test-all: test pytest-slow

# MARP and the step-time model against published measured runs (leave one source out) when ../shared is
# present (the kernel model against Sailor's measured layer times, and the step-time model priced from those
# layer profiles), and the FakeTensorMode harness of the reference decoder (self-consistency only, about 5 minutes).
CALIBRATION := ../shared/calibration/memory-measured.csv
STEPTIME_CALIBRATION := ../shared/calibration/steptime-measured.csv
SAILOR_PROFILES := ../shared/traces/sailor-llm-profiles
validate: install
	@if [ -f $(CALIBRATION) ]; then $(BIN)/frenzy validate memory $(CALIBRATION) --out docs/marp-validation.md; \
	else echo "make validate: $(CALIBRATION) not found; skipping the measured-runs report"; fi
	@if [ -f $(STEPTIME_CALIBRATION) ]; then \
	$(BIN)/frenzy validate steptime $(STEPTIME_CALIBRATION) --out docs/steptime-validation.md; \
	else echo "make validate: $(STEPTIME_CALIBRATION) not found; skipping the step-time report"; fi
	@if [ -d $(SAILOR_PROFILES) ] && [ -f $(STEPTIME_CALIBRATION) ]; then \
	$(BIN)/frenzy validate layers $(SAILOR_PROFILES) --out docs/layer-profiles-validation.md; \
	d=$$(mktemp -d); FRENZY_CALIBRATIONS=$$d $(BIN)/frenzy profile --from-sailor $(SAILOR_PROFILES) --name sailor --json >/dev/null \
	&& FRENZY_CALIBRATIONS=$$d $(BIN)/frenzy validate steptime $(STEPTIME_CALIBRATION) --calibration sailor \
	--out docs/steptime-validation-profiled.md; rm -rf $$d; \
	else echo "make validate: $(SAILOR_PROFILES) not found; skipping the layer-profile reports"; fi
	$(BIN)/python -m frenzy_opt.validation.harness_report --out docs/marp-harness.md

# Refit the shipped parameters (frenzy_opt/data/memory-fit.json, frenzy_opt/data/steptime-fit.json).
calibrate: install
	$(BIN)/frenzy calibrate $(CALIBRATION) --name memory
	$(BIN)/frenzy calibrate $(STEPTIME_CALIBRATION) --name steptime

bench: install
	$(BIN)/python benchmarks/plan_enumeration.py --out benchmarks/results/plan_enumeration.md

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache
