# The two commands a newcomer needs are `make plan` and `make test` (see README.md).
# Every target does its own set-up: a fresh clone needs nothing but uv and the Debian
# packages that .ci/run installs.
SHELL := /bin/bash
UV ?= uv
PY := .venv/bin/python
BUILD := build

.PHONY: setup deps venv proto cxx plan test pytest ctest lint format clean

setup: deps venv proto cxx

deps:
	@bash .ci/install-deps

venv:
	@command -v $(UV) >/dev/null || python3 -m pip install --quiet uv
	$(UV) sync --quiet

proto: venv
	@if [ -d proto ] && ls proto/*.proto >/dev/null 2>&1 || ls proto/*/*/*.proto >/dev/null 2>&1; then \
	  $(PY) proto/build_proto.py; fi

cxx:
	@if [ -f csrc/CMakeLists.txt ]; then \
	  cmake -S csrc -B $(BUILD)/csrc -DCMAKE_BUILD_TYPE=Release >/dev/null && \
	  cmake --build $(BUILD)/csrc -j2; fi

plan: venv proto
	.venv/bin/heroserve plan $(ARGS)

test: setup
	.venv/bin/lint-imports --no-cache
	$(PY) -m pytest -q
	@if [ -f $(BUILD)/csrc/CTestTestfile.cmake ]; then ctest --test-dir $(BUILD)/csrc --output-on-failure; fi

lint:
	.venv/bin/ruff check controller agents tests benchmarks mininet
	.venv/bin/ruff format --check controller agents tests benchmarks mininet

format:
	.venv/bin/ruff format controller agents tests benchmarks mininet
	.venv/bin/ruff check --fix controller agents tests benchmarks mininet

clean:
	rm -rf $(BUILD) controller/_gen agents/_gen agents/proto
