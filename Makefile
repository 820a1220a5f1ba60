# `make demo`: install what is missing, then run the end-to-end demo on the local stack.
# `make test`: install what is missing, then run the whole test suite.
# Everything installs into a virtual environment in .venv, so that nothing on the machine changes.
SYSTEM_PYTHON ?= python3
VENV ?= .venv
PYTHON := $(VENV)/bin/python
PIP := $(PYTHON) -m pip
PYTEST_ARGS ?=
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: install install-system install-python test demo bench clean

install: install-system install-python

# OpenSSH's sshd plays the TPU worker hosts; tmux is the terminal the live views' tests
# (`tpuq watch`) type into and read; Debian's Chromium is the browser of the dashboard's tests (tests/ui,
# through Playwright: its own browser downloads are not used). Java and the gcloud Pub/Sub and Firestore
# emulator components are prerequisites (see README); this only checks for them.
install-system:
	@command -v /usr/sbin/sshd >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server; \
	  else echo "openssh-server is missing: sudo apt-get install openssh-server" >&2; exit 1; fi; }
	@command -v tmux >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux; \
	  else echo "tmux is missing (the live views' tests run tpuq watch in it): sudo apt-get install tmux" >&2; exit 1; fi; }
	@test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; \
	  else echo "chromium is missing (the dashboard's browser tests drive it; they skip without it): sudo apt-get install chromium chromium-driver" >&2; fi; }
	@mkdir -p /run/sshd 2>/dev/null || true
	@command -v java >/dev/null 2>&1 || { echo "Java is missing (the emulators need it): apt-get install default-jre-headless" >&2; exit 1; }
	@command -v gcloud >/dev/null 2>&1 || { echo "gcloud is missing: install the Google Cloud CLI with the pubsub and firestore emulator components" >&2; exit 1; }

install-python:
	@$(SYSTEM_PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required")'
	@test -x $(PYTHON) || $(SYSTEM_PYTHON) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check -e '.[dev]' -e ./dev

# Two pytest-xdist workers by default, as CI runs it (the whole-system tests one group, each other module a group,
# the longest groups first in tests/conftest.py's order: --no-loadscope-reorder keeps it): 12-13 minutes instead of
# 19 in one process. PYTEST_WORKERS=0 runs it in one process (docs/DEVELOPING.md, Tests).
PYTEST_WORKERS ?= 2
test: install
	$(PYTHON) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=25 $(PYTEST_ARGS)

demo: install
	tpuq demo

bench: install
	$(PYTHON) benchmarks/run_all.py

clean:
	rm -rf build dist *.egg-info dev/*.egg-info .pytest_cache .hypothesis $(VENV)
