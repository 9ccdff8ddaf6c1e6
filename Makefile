# The README's two commands. Each sets up .venv on first use (Python >= 3.11), then:
#   make test   lint + format check, then pytest
#   make book   build and execute the whole book (warnings are errors), then run every lab
.PHONY: test book clean

VENV   := .venv
STAMP  := $(VENV)/.installed
PYTHON := $(shell command -v python3.11 2>/dev/null || command -v python3)
LINTED := $(wildcard pylib tests labs bench)
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

$(VENV)/bin/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
	  || { echo "Python >= 3.11 is needed; '$(PYTHON)' is older (make PYTHON=...)" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)

# Reinstall only when the requirements or the package metadata change (the stamp is newer than both otherwise).
$(STAMP): requirements.txt pyproject.toml | $(VENV)/bin/python
	$(VENV)/bin/python -m pip install -r requirements.txt
	$(VENV)/bin/python -m pip install --no-deps -e .
	touch $@

# pytest exits 5 when it collects no test; make fails on any non-zero status, so that counts as a failure too.
test: $(STAMP)
	ruff check $(LINTED)
	ruff format --check $(LINTED)
	python -m pytest

# The execution cache is keyed on each chapter's code only, so drop it whenever pylib or the requirements change:
# otherwise a chapter would show what an older pylib computed.
_build/.pylib-stamp: $(shell find pylib -name '*.py' 2>/dev/null) requirements.txt
	rm -rf _build/.jupyter_cache
	mkdir -p _build && touch $@

# Build and execute the book, then run every lab in solution mode through the harness (report in labs/_runs/).
book: $(STAMP) _build/.pylib-stamp
	jupyter-book build . --all --builder html -W -n
	python -m pylib.labs run --all

clean:
	rm -rf _build labs/_runs .pytest_cache .ruff_cache .hypothesis
