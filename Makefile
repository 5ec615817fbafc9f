# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-quick bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/trainops sop --quick

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-quick: $(STAMP)
	$(BIN)/python -m pytest -m "not slow and not services" $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/trainops bench

clean:
	rm -rf $(VENV) .trainops
