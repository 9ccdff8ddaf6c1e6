# The README's two commands. Each sets up .venv on first use (Python >= 3.11), then:
#   make test   lint + format check, then pytest
#   make book   build and execute the whole book (warnings are errors), then run every lab
# and, for CI after `make book`:
#   make site-test   the built site in a real browser (chromium), plus its link and label checks
.PHONY: test book clean vendor site-test

VENV   := .venv
STAMP  := $(VENV)/.installed
PYTHON := $(shell command -v python3.11 2>/dev/null || command -v python3)
LINTED := $(wildcard pylib tests labs bench tools)
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

$(VENV)/bin/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
	  || { echo "Python >= 3.11 is needed; '$(PYTHON)' is older (make PYTHON=...)" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)

# Reinstall only when the requirements or the package metadata change (the stamp is newer than both otherwise).
$(STAMP): requirements.txt requirements-common.txt pyproject.toml | $(VENV)/bin/python
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
_build/.pylib-stamp: $(shell find pylib -name '*.py' 2>/dev/null) requirements.txt requirements-common.txt
	rm -rf _build/.jupyter_cache
	mkdir -p _build && touch $@

# Build and execute the book, then run every lab in solution mode through the harness (report in labs/_runs/).
book: $(STAMP) _build/.pylib-stamp vendor
	jupyter-book build . --all --builder html -W -n
	python -m pylib.labs run --all

# --- The site as readers see it (tools/site, tests/site) ------------------------------------------------------------
# vendor: MathJax, require.js and the widget manager from the npm registry into book/_static/vendor/ (git-ignored),
# so the built site loads nothing from another host. A no-op once the pinned versions are there.
VENDORED := book/_static/vendor/.vendored.json
$(VENDORED): tools/site/vendor.py
	$(PYTHON) tools/site/vendor.py
vendor: $(VENDORED)

# site-test: run after `make book` (it checks _build/html as built). Needs Debian's chromium (apt-get install
# chromium); Playwright, from requirements-site.txt, drives it and never downloads a browser.
$(VENV)/.site-installed: requirements-site.txt $(STAMP)
	$(VENV)/bin/python -m pip install -r requirements-site.txt
	touch $@
site-test: $(VENV)/.site-installed
	@test -f _build/html/index.html || { echo "no built site in _build/html: run make book first" >&2; exit 1; }
	python -m pytest tests/site -p no:cacheprovider

clean:
	rm -rf _build labs/_runs .pytest_cache .ruff_cache .hypothesis
