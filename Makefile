.PHONY: help install reference-package fmt lint test docs image migrate run

help:     ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

install:  ## virtualenv with Sandhive, its dev tools and the Python client (clients/python)
	python3 -m venv .venv && .venv/bin/pip install -q -U pip && .venv/bin/pip install -q -e '.[dev]' -e clients/python

reference-package:  ## the paper's package (its tools and runtime, not litellm) in .package-lib, for the listing-order test
	test -d .package-lib/llm_in_sandbox || { \
		.venv/bin/pip install -q --disable-pip-version-check --target .package-lib 'docker==7.1.0' && \
		.venv/bin/pip install -q --disable-pip-version-check --target .package-lib --no-deps 'llm-in-sandbox==0.2.0'; }

fmt:      ## rewrite code in place
	.venv/bin/ruff format . && .venv/bin/ruff check --fix .

lint:     ## what CI enforces; writes nothing (the rooms' map and budgets: tests/support/rooms.py)
	.venv/bin/ruff format --check . && .venv/bin/ruff check . && .venv/bin/mypy && .venv/bin/lint-imports \
		&& .venv/bin/python -m tests.support.rooms

TEST_WORKERS ?= 3

test:     ## every test, against real Postgres, Redis and Docker, on $(TEST_WORKERS) pytest-xdist workers
	.venv/bin/pytest -n $(TEST_WORKERS) --durations=15

docs:     ## regenerate docs/configuration.md from the settings' docstrings (app/config.py)
	.venv/bin/python -m app.config --markdown > docs/configuration.md

image:    ## the sandbox image, base built from Debian packages (no registry needed)
	.venv/bin/sandhive image build --offline

migrate:  ## apply migrations to SANDHIVE_DATABASE_URL
	.venv/bin/sandhive migrate

run:      ## migrate, then the API on 127.0.0.1:8000 and one worker, with the scripted demo profile and image builds; Ctrl-C stops both
	.venv/bin/sandhive migrate
	export SANDHIVE_SCRIPTED_PROFILE=$${SANDHIVE_SCRIPTED_PROFILE:-true}; \
	export SANDHIVE_IMAGE_BUILDS=$${SANDHIVE_IMAGE_BUILDS:-true}; \
	trap 'kill 0' INT TERM; .venv/bin/sandhive worker & .venv/bin/sandhive serve --port 8000; wait
