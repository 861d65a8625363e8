# Cascade: `make demo` runs the main job on the local stack; `make test` runs the whole suite.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.cascade-installed
export SPARK_LOCAL_IP ?= 127.0.0.1
export DS_ACCELERATOR ?= cpu

.PHONY: venv lock demo test test-fast e2e up down status lint bench docs clean

venv: $(STAMP)

$(STAMP): pyproject.toml infra/install.sh infra/requirements.lock infra/kafka/pom.xml infra/kafka/jars.sha256
	bash infra/install.sh $(VENV)
	touch $(STAMP)

# Rewrites infra/requirements.lock from the packages installed in $(VENV) (infra/lock.py says how).
lock:
	$(PY) -m infra.lock

demo: venv
	$(VENV)/bin/cascade demo

up: venv
	$(VENV)/bin/cascade up

down:
	$(VENV)/bin/cascade down

status:
	$(VENV)/bin/cascade status

test: venv
	$(PY) -m pytest -m "not gpu" -p no:cacheprovider --durations=20 -n 2 --dist loadgroup

test-fast: venv
	$(PY) -m pytest -m "not gpu and not e2e and not slow" -p no:cacheprovider

e2e: venv
	$(PY) -m pytest -m "e2e" -p no:cacheprovider

# Every benchmark into bench-results/NAME.json and NAME.png; docs/benchmarks.md from them.
bench: venv
	mkdir -p bench-results
	for name in $$($(PY) -c "from benchmarks.registry import BENCHMARKS; print(' '.join(BENCHMARKS))"); do \
		$(VENV)/bin/cascade bench $$name --out bench-results/$$name.json || exit 1; \
	done
	$(PY) -m benchmarks.docs --results bench-results

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

clean:
	rm -rf .cascade .pytest_cache site

# The documentation site into site/ (mkdocs.yml); strict: any warning fails the build.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict
