# Two commands for a newcomer (see README): `make run` and `make test`.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
export PATH := $(abspath $(BIN)):$(PATH)
# Python caches compiled modules unless told not to; some machines' environments tell it
# (PYTHONDONTWRITEBYTECODE=1). Then every test process, and every server the tests start,
# compiled all of our code again, and pytest rewrote every test module again in each
# test process: 6 s of CPU a process before its first test.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install run test migrate demo bench load audit clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

migrate: install
	$(BIN)/python manage.py migrate --noinput

demo: migrate
	$(BIN)/python manage.py demo_user
	$(BIN)/python manage.py seed_demo --user demo

## Install, migrate, create the demo login, then run the web server and a worker (honcho,
## Procfile) until Ctrl-C, which gives the worker its drain and ends cleanly (assistant/procfile.py).
run: demo
	@echo "Open http://$${WEB_HOST:-127.0.0.1}:$${WEB_PORT:-8000}/ and log in with the demo login above (a new password each run unless DEMO_PASSWORD is set). Ctrl-C stops."
	$(BIN)/python -m assistant.procfile

## Install everything the tests need (Debian's chromium for the browser tests too: as
## root, e.g. in CI; otherwise those tests are skipped), then run the whole suite, in
## TEST_PROCESSES processes (a test file stays in one; the live tests mostly wait). Files
## are handed out in the order they are collected: tests/browser and tests/live, whose
## few tests each take seconds, first; the thousands of short ones fill in at the end.
## (xdist's default hands out the files with most tests first, which left the longest
## single tests to run last, alone.)
TEST_PROCESSES ?= 3
test: install
	@test -x /usr/bin/chromium || if [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "make test: /usr/bin/chromium is missing (install the chromium package as root); the browser tests will be skipped"; fi
	$(BIN)/python -m pytest -n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder -m "not serial" $(PYTEST_ARGS)
	@# Then the few tests that restart a server the others use, alone. A PYTEST_ARGS filter
	@# may leave none of them (pytest's exit code 5): the run above already ran tests.
	$(BIN)/python -m pytest -m serial $(PYTEST_ARGS) || [ $$? -eq 5 ]

## Benchmark on the embedded default and on PostgreSQL + Redis (scratch databases).
BENCH_PG ?= postgres://postgres@127.0.0.1:5432/assistant_bench
bench: install
	$(BIN)/pip install --quiet -e '.[bench]'
	rm -f var/bench/assistant-bench.sqlite3*
	DATABASE_URL=sqlite:///$(abspath var/bench/assistant-bench.sqlite3) $(BIN)/python manage.py migrate --noinput -v0
	DATABASE_URL=sqlite:///$(abspath var/bench/assistant-bench.sqlite3) $(BIN)/python -m benchmarks bench --output bench-results/embedded.json $(BENCH_ARGS)
	psql "$(dir $(BENCH_PG))postgres" -qc 'DROP DATABASE IF EXISTS $(notdir $(BENCH_PG))' -c 'CREATE DATABASE $(notdir $(BENCH_PG))'
	DATABASE_URL=$(BENCH_PG) $(BIN)/python manage.py migrate --noinput -v0
	DATABASE_URL=$(BENCH_PG) REDIS_URL=redis://127.0.0.1:6379/0 $(BIN)/python -m benchmarks bench --output bench-results/postgres-redis.json $(BENCH_ARGS)
	$(BIN)/python -m benchmarks bench --plot bench-results/embedded.json bench-results/postgres-redis.json

## Load: browser-like users over htmx posts and WebSockets against daphne and a qcluster,
## on PostgreSQL + Redis (a scratch database); LOAD_ARGS="--users 5 --duration 30" for a short one.
LOAD_PG ?= postgres://postgres@127.0.0.1:5432/assistant_load
load: install
	$(BIN)/pip install --quiet -e '.[bench]'
	psql "$(dir $(LOAD_PG))postgres" -qc 'DROP DATABASE IF EXISTS $(notdir $(LOAD_PG))' -c 'CREATE DATABASE $(notdir $(LOAD_PG))'
	DATABASE_URL=$(LOAD_PG) $(BIN)/python manage.py migrate --noinput -v0
	DATABASE_URL=$(LOAD_PG) REDIS_URL=redis://127.0.0.1:6379/0 $(BIN)/python -m benchmarks loadtest --users 50 --duration 180 --output bench-results/load.json $(LOAD_ARGS)

## Security checks, in seconds: bandit over our code (fails on medium or high severity; a
## `# nosec` needs its reason beside it) and pip-audit over the installed packages, the
## project itself excepted (fails on a known vulnerability). pip-audit looks each release up
## in PyPI's JSON API; packages it could not look up are counted in a warning (the list is in
## var/pip-audit.txt), and PIP_AUDIT_ARGS=--strict makes them an error.
$(VENV)/.audit-installed: pyproject.toml | $(VENV)/.installed
	$(BIN)/pip install --quiet -e '.[audit]'
	touch $@

audit: install $(VENV)/.audit-installed
	$(BIN)/bandit -q -r assistant benchmarks orchestration skills -ll
	@mkdir -p var
	@$(BIN)/pip-audit --skip-editable --progress-spinner off $(PIP_AUDIT_ARGS) >var/pip-audit.txt 2>&1; \
	status=$$?; grep -v 'could not be audited' var/pip-audit.txt; \
	unchecked=$$(grep -c 'could not be audited' var/pip-audit.txt); \
	if [ "$$unchecked" -gt 0 ]; then \
		echo "make audit: WARNING: pip-audit could not look up $$unchecked packages (see var/pip-audit.txt); is https://pypi.org/pypi/NAME/VERSION/json reachable from here?"; \
	fi; \
	exit $$status

clean:
	rm -rf $(VENV) var .pytest_cache
