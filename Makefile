# Two commands for a newcomer (see README): `make run` and `make test`.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: install run test migrate demo clean

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

## Install everything the tests need, then run the whole suite.
test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) var .pytest_cache
