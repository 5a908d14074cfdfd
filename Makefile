# The two commands a newcomer needs are `make plan` and `make test` (see README.md).
# Every target does its own set-up: a fresh clone needs nothing but uv and the Debian
# packages that .ci/run installs.
SHELL := /bin/bash
UV ?= uv
PY := .venv/bin/python
BUILD := build

.PHONY: setup deps venv proto cxx p4 plan test pytest ctest lint format clean

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

# The P4 programs through the toolchain on PATH (docs/dataplane.md, "Checking the P4 programs"):
# the v1model program to BMv2 JSON and P4Info (which must equal the checked-in P4Info), the
# TNA program through p4test with the open Tofino includes where HEROSERVE_TNA_INCLUDE names
# them. Warnings are errors: p4c prints nothing for a clean program.
p4:
	@mkdir -p $(BUILD)/p4
	set -o pipefail; p4c-bm2-ss --p4v 16 --p4runtime-files $(BUILD)/p4/heroserve_ina.p4info.txtpb \
	  -o $(BUILD)/p4/heroserve_ina.json p4/heroserve_ina.p4 2>&1 | tee $(BUILD)/p4/p4c.log
	@test ! -s $(BUILD)/p4/p4c.log || { echo "p4c printed warnings (above)"; exit 1; }
	cmp $(BUILD)/p4/heroserve_ina.p4info.txtpb p4/heroserve_ina.p4info.txtpb
	@if [ -n "$$HEROSERVE_TNA_INCLUDE" ]; then \
	  for lanes in "" -DINA_BFP16; do \
	    echo "p4test -D__TARGET_TOFINO__=1 $$lanes -I $$HEROSERVE_TNA_INCLUDE p4/tna/heroserve_ina.p4"; \
	    out=$$(p4test -D__TARGET_TOFINO__=1 $$lanes -I "$$HEROSERVE_TNA_INCLUDE" p4/tna/heroserve_ina.p4 2>&1); \
	    rc=$$?; echo "$$out"; test $$rc -eq 0 -a -z "$$out" || exit 1; \
	    echo "p4test: TNA program clean ($${lanes:-int32 lanes})"; \
	  done; \
	else echo "p4test: HEROSERVE_TNA_INCLUDE unset, the TNA check skips"; fi
	@echo "p4: v1model compiled without warnings; its P4Info equals p4/heroserve_ina.p4info.txtpb"

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
