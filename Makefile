# The README's two commands. Each sets up .venv on first use (Python >= 3.11), then:
#   make test   lint + format check, then pytest
#   make book   check the translation catalogs, build and execute the whole book in English and in Chinese
#               (_build/html/zh/) side by side, warnings are errors. I18N_ALLOW_INCOMPLETE=1 (development only;
#               CI keeps the strict default) builds even while translations are missing or outdated.
# (Every lab runs end to end through the lab harness, solution and learner versions, in `make test`:
# tests/test_labs_harness.py, one of the slow tests. `python -m pylib.labs run --all` runs them by hand.)
# and, for CI (.ci/run runs the hub's and nbgrader's tests beside `make book`, the site test after it):
#   make site-test   the built site in a real browser (chromium), plus its link and label checks (after make book)
#   make hub-test    a chapter's launch link followed on a local JupyterHub, the chapter and a lab run there
#   make nbgrader-test  two labs exported to nbgrader, released and autograded by nbgrader (its own venv)
.PHONY: test book clean vendor site-test hub-setup hub-test nbgrader-setup nbgrader-test

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
# The editable install writes pylib.egg-info/ here: tools/locked.py makes it take turns with hub-setup's (CI runs both
# at once).
$(STAMP): requirements.txt requirements-common.txt pyproject.toml | $(VENV)/bin/python
	$(VENV)/bin/python -m pip install -r requirements.txt
	$(PYTHON) tools/locked.py .editable-install.lock $(VENV)/bin/python -m pip install --no-deps -e .
	touch $@

# pytest exits 5 when it collects no test; make fails on any non-zero status, so that counts as a failure too.
# The suite runs on every core (pytest-xdist, -n auto). loadfile: a module's tests stay on one worker, so what they
# share (a module-scoped fixture such as the lab harness's every-lab run, a module's cache of launched runs) runs
# once, not once per worker. (loadgroup would spread the other tests one by one, but under pytest 9 its groups are
# silently ignored: xdist 3.8 renames a test by assigning `item._nodeid`, which pytest 9's `nodeid` no longer reads.)
# --no-loadscope-reorder: the modules go out in collection order, which tests/conftest.py starts with the longest
# (LONGEST_FIRST), so no long module starts last. PYTEST_WORKERS=0 runs the suite in this process alone.
PYTEST_WORKERS ?= auto
test: $(STAMP)
	ruff check $(LINTED)
	ruff format --check $(LINTED)
	python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The execution cache is keyed on each chapter's code only, so drop it whenever pylib or the requirements change:
# otherwise a chapter would show what an older pylib computed.
_build/.pylib-stamp: $(shell find pylib -name '*.py' 2>/dev/null) requirements.txt requirements-common.txt
	rm -rf _build/.jupyter_cache _build/zh/_build/.jupyter_cache
	mkdir -p _build && touch $@

# Check the catalogs (tools/i18n/catalogs.py: 0 missing, 0 outdated, markup and glossary terms kept) and build and
# execute the book in English and in Chinese, the three side by side (tools/i18n/build_editions.py; the Chinese
# build is tools/i18n/build_zh.py's: PYLIB_LANG=zh, Sphinx's language zh_CN, its own execution cache, the site moved
# to _build/html/zh/).
I18N_ALLOW_INCOMPLETE ?=
book: $(STAMP) _build/.pylib-stamp vendor
	I18N_ALLOW_INCOMPLETE=$(I18N_ALLOW_INCOMPLETE) python tools/i18n/build_editions.py

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

# --- The JupyterHub side (hub/, tests/hub) ----------------------------------------------------------------------------
# hub-test: a JupyterHub on 127.0.0.1 (hub/jupyterhub_config.py) with the book's user environment, driven by
# Playwright + Debian's chromium (as site-test). Its own venv, .venv-hub, holds what a hub's user environment holds
# (hub/requirements.txt, pylib, hub/overrides.json as JupyterLab's settings overrides) plus Playwright; npm installs
# configurable-http-proxy into hub/node_modules from hub/package-lock.json. Each is reinstalled only when its files
# change. Needs no built site: the launch link comes from tools/site/launch_links.py and _config.yml.
HUB_VENV     := .venv-hub
HUB_STAMP    := $(HUB_VENV)/.installed
HUB_SETTINGS := $(HUB_VENV)/share/jupyter/lab/settings/overrides.d/parallelism-book.json
HUB_PROXY    := hub/node_modules/.bin/configurable-http-proxy
$(HUB_VENV)/bin/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
	  || { echo "Python >= 3.11 is needed; '$(PYTHON)' is older (make PYTHON=...)" >&2; exit 1; }
	$(PYTHON) -m venv $(HUB_VENV)
$(HUB_STAMP): hub/requirements.txt requirements.txt requirements-common.txt requirements-site.txt pyproject.toml \
  | $(HUB_VENV)/bin/python
	$(HUB_VENV)/bin/python -m pip install --no-compile -r requirements.txt -r hub/requirements.txt -r requirements-site.txt
	$(PYTHON) tools/locked.py .editable-install.lock $(HUB_VENV)/bin/python -m pip install --no-deps -e .
	touch $@
$(HUB_SETTINGS): hub/overrides.json $(HUB_STAMP)
	mkdir -p $(@D)
	cp $< $@
$(HUB_PROXY): hub/package.json hub/package-lock.json
	npm ci --prefix hub --no-audit --no-fund
	touch $@
# hub-setup: only the installs (CI starts it in the background while `make test` runs: pip and npm use about one
# core, and the test phase's own install leaves the other idle).
hub-setup: $(HUB_STAMP) $(HUB_SETTINGS) $(HUB_PROXY)
hub-test: hub-setup
	$(HUB_VENV)/bin/python -m pytest tests/hub -p no:cacheprovider -s

clean:
	rm -rf _build labs/_runs .pytest_cache .ruff_cache .hypothesis

# --- The labs as an nbgrader course (pylib/labs/nbgrader.py, tests/test_course_nbgrader.py) -------------------------
# nbgrader lives in its own venv (.venv-nbgrader, from requirements-nbgrader.txt): it brings JupyterLab, a notebook
# server and a database layer that the labs' install does not need. The kernel that grades is .venv's (torch, pylib).
NBG_VENV  := .venv-nbgrader
NBG_STAMP := $(NBG_VENV)/.installed
$(NBG_VENV)/bin/python:
	$(PYTHON) -m venv $(NBG_VENV)
$(NBG_STAMP): requirements-nbgrader.txt | $(NBG_VENV)/bin/python
	$(NBG_VENV)/bin/python -m pip install --no-compile -r requirements-nbgrader.txt
	touch $@
nbgrader-setup: $(NBG_STAMP)
nbgrader-test: $(STAMP) nbgrader-setup
	NBGRADER_VENV=$(CURDIR)/$(NBG_VENV) python -m pytest tests/test_course_nbgrader.py -p no:cacheprovider -s --durations=0
