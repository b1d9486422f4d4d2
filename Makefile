# Two commands for a newcomer (see README): `make run` and `make test`.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: install run test migrate demo bench clean

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

## Install, migrate, create the demo login, then run the web server and a worker.
run: demo
	@echo "Open http://127.0.0.1:$${WEB_PORT:-8000}/ and log in with the demo login above."
	$(BIN)/honcho start

## Install everything the tests need (Debian's chromium for the browser tests too: as
## root, e.g. in CI; otherwise those tests are skipped), then run the whole suite.
test: install
	@test -x /usr/bin/chromium || if [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "make test: /usr/bin/chromium is missing (install the chromium package as root); the browser tests will be skipped"; fi
	$(BIN)/python -m pytest $(PYTEST_ARGS)

## Benchmark on the embedded default and on PostgreSQL + Redis (scratch databases).
BENCH_PG ?= postgres://postgres@127.0.0.1:5432/assistant_bench
bench: install
	$(BIN)/pip install --quiet -e '.[bench]'
	rm -f var/bench/assistant-bench.sqlite3*
	DATABASE_URL=sqlite:///$(abspath var/bench/assistant-bench.sqlite3) $(BIN)/python manage.py migrate --noinput -v0
	DATABASE_URL=sqlite:///$(abspath var/bench/assistant-bench.sqlite3) $(BIN)/python manage.py bench --output bench-results/embedded.json $(BENCH_ARGS)
	psql "$(dir $(BENCH_PG))postgres" -qc 'DROP DATABASE IF EXISTS $(notdir $(BENCH_PG))' -c 'CREATE DATABASE $(notdir $(BENCH_PG))'
	DATABASE_URL=$(BENCH_PG) $(BIN)/python manage.py migrate --noinput -v0
	DATABASE_URL=$(BENCH_PG) REDIS_URL=redis://127.0.0.1:6379/0 $(BIN)/python manage.py bench --output bench-results/postgres-redis.json $(BENCH_ARGS)
	$(BIN)/python manage.py bench --plot bench-results/embedded.json bench-results/postgres-redis.json

clean:
	rm -rf $(VENV) var .pytest_cache
