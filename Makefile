# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: demo test test-quick bench clean

# -qq: pip still prints errors, but not the notes of a successful build (setuptools says
# "Editable installation" on every `pip install -e`) nor warnings about this machine's indexes.
PIP := $(BIN)/pip --quiet --quiet --disable-pip-version-check

$(STAMP): pyproject.toml
	@echo "installing trainops, torch and the test tools into $(VENV) (minutes the first time)"
	$(PY) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install "$(TORCH_SPEC)"
	$(PIP) install -e ".[test]"
	touch $(STAMP)

# The demo needs trainops and torch only: no test tools (transformers, deepspeed, megatron-core...).
$(DEMO_STAMP): pyproject.toml
	@echo "installing trainops and torch into $(VENV) (minutes the first time)"
	$(PY) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install "$(TORCH_SPEC)"
	$(PIP) install -e .
	touch $(DEMO_STAMP)

# A venv that `make test` installed already has everything the demo needs.
demo: $(if $(wildcard $(STAMP)),$(STAMP),$(DEMO_STAMP))
	$(BIN)/trainops sop --quick
	@echo "trainops is installed in $(VENV): run it as $(BIN)/trainops, or 'source $(BIN)/activate' first"

# --durations: the slowest tests, so a suite drifting towards CI's time limit shows where.
# -n 3 --dist loadgroup: most tests wait on processes, jobs and timeouts rather than compute, so three
# workers share the 2 cores; the real-service tests stay on one worker (tests/conftest.py). The tests
# that judge a measured speed-up (marker `quiet`) run after, alone; the exit code is the worse of the two.
TEST_WORKERS ?= 3
test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not quiet" --durations=25 $(PYTEST_ARGS); \
	parallel=$$?; $(BIN)/python -m pytest -m quiet --durations=10 $(PYTEST_ARGS); quiet=$$?; \
	[ $$parallel -eq 0 ] && [ $$quiet -eq 0 ]

test-quick: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not slow and not services" $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/trainops bench

clean:
	rm -rf $(VENV) .trainops
