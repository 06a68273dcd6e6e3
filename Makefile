# queen-pg: `make run` starts the broker, `make test` runs the whole suite. Both set everything up.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-run
TSTAMP := $(VENV)/.installed-test
# make run: 2 workers won every paired run on the 2-core box (benchmarks/results/2026-12-02-929c557-workers.json; docs/benchmarks.md)
WORKERS ?= 2

.DEFAULT_GOAL := help
.PHONY: help run test lint install clean bench bench-status bench-mesh bench-workers chaos fresh ha ha-smoke chaos-ha

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-8s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --disable-pip-version-check -e .
	@touch $@

$(TSTAMP): pyproject.toml Makefile | $(BIN)/python
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]'
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps --upgrade --target $(VENV)/queen-mq-0.15 queen-mq==0.15.0  # the 0.x client (same package name as 2.6.0): tests/test_e2e_client_015.py
	@touch $@ $(STAMP)

install: $(TSTAMP) ## create .venv and install queen-pg with its test and dev extras

run: $(STAMP) ## start the broker on :6632, 2 workers (WORKERS=1 for one; embedded PostgreSQL in ./.queen unless DATABASE_URL is set)
	$(BIN)/queen-pg serve --workers $(WORKERS)

test: $(TSTAMP) ## run the whole test suite (real PostgreSQL, real HTTP, the queen-mq client)
	$(BIN)/python -m pytest

lint: $(TSTAMP) ## ruff, mypy and the import layers (lint-imports: [tool.importlinter] in pyproject.toml)
	$(BIN)/ruff check queen_pg tests migrations benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

# make bench: the broker as make run starts it (--workers $(WORKERS); a --workers in BENCH_ARGS wins), pgmq beside it
bench: $(TSTAMP) ## run the benchmarks and pgmq on the same shapes (own broker, ~10 min): benchmarks/results/<date>-<commit>.json; BENCH_ARGS="--help"
	$(BIN)/python -m benchmarks.run --workers $(WORKERS) $(BENCH_ARGS)

fresh: ## the CI fresh-machine check: wheel -> empty venv -> serve outside the tree -> queen-mq push/pop (~1 min)
	bash .ci/fresh_machine.sh

bench-status: $(TSTAMP) ## /status, /resources/overview, /metrics, /status/analytics, lagging at 1k, 10k, 100k queues (~3 min): benchmarks/results/<date>-<commit>-status.json
	$(BIN)/python -m benchmarks.status_scale $(BENCH_ARGS)

bench-workers: $(TSTAMP) ## the JSON suite with --workers 1, then 2 (~6 min): benchmarks/results/<date>-<commit>-workers.json
	$(BIN)/python -m benchmarks.workers $(BENCH_ARGS)

bench-mesh: $(TSTAMP) ## idle long-polls and the cross-replica wake (2 meshed replicas, ~3 min): benchmarks/results/<date>-<commit>-mesh.json
	$(BIN)/python -m benchmarks.mesh_idle $(BENCH_ARGS)

chaos: $(TSTAMP) ## the chaos test (~2-3 min): 3 replicas behind HAProxy, kill -9 and a PostgreSQL restart, zero lost
	QUEEN_CHAOS=1 $(BIN)/python -m pytest tests/chaos -s -p no:cacheprovider -o timeout=600

ha: $(STAMP) ## etcd + 3 PostgreSQL under Patroni (synchronous) + 2 brokers behind HAProxy on :6632, until Ctrl-C; HA_ARGS="--help"
	$(BIN)/python deploy/ha/run.py $(HA_ARGS)

ha-smoke: $(TSTAMP) ## the smoke test of make ha, twice (~1-2 min; brokers on a multi-host URL, then via HAProxy): queen-mq through HAProxy, a patronictl switchover under a writer, zero lost
	QUEEN_HA=1 $(BIN)/python -m pytest tests/ha/test_ha_smoke.py -s -p no:cacheprovider

chaos-ha: $(TSTAMP) ## make ha under load, brokers on a multi-host URL then via HAProxy (~3 min): a switchover, a postmaster kill -9, a machine lost; zero lost, no 500
	QUEEN_HA=1 $(BIN)/python -m pytest tests/ha/test_chaos_ha.py -s -p no:cacheprovider

clean: ## remove the venv, build output and caches (keeps ./.queen, the embedded database)
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache
