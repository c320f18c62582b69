# Every target creates .venv and installs the package with its dev extras on first use.
VENV ?= .venv
PYTHON ?= python3
PY = $(VENV)/bin/python
PYTEST = $(PY) -m pytest
ARGS ?=
LINT_PATHS = $(wildcard celery_fence tests example_app benchmarks)

.PHONY: venv test pkg unit contract stores run mutation mutation-clean contract-pg-ha contract-etcd-cluster contract-cluster integration chaos soak soak-sim lint type check demo bench compare flower-screenshot clean

venv: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

# Everything but the soaks and the contract suites on the clusters, then the packaging check; CI runs
# this. The chaos tests size themselves by FENCE_SOAK_RUNS. Three pytest-xdist workers (a file stays in one
# worker), each on databases of its own (tests/conftest.py): on 2 cores the tests wait on workers and ttls a
# good part of the time, so a third worker helps: 619 s against 863 s with two (2026-12-06). PARALLEL= runs
# it in one process. (A two-worker run once hung: the fault kit's pid_of left a reply BRPOP in flight on a
# pooled connection and a forked child's after-fork cleanup read the shared socket. Fixed in pid_of, with a
# test that forks after it.)
PARALLEL ?= -n 3 --dist loadfile
test: venv
	$(PYTEST) $(PARALLEL) -m "not soak and not etcd_cluster and not cluster_full" $(ARGS)
	$(MAKE) pkg

# Build the sdist and wheel (a setuptools warning about a package it would leave out fails it), twine
# check them, check that the wheel with its redis extra alone gives a working Redis broker (a venv of its
# own), then install the wheel with every extra in a fresh venv and run the unit and contract suites
# against it (a .lua file or py.typed missing from the wheel fails here).
pkg: venv
	$(VENV)/bin/tox -e pkg

unit: venv
	$(PYTEST) tests/unit $(ARGS)

# The store tests: the every-store contract (tests/contract), each store's own tests (tests/stores/{sql,redis,
# etcd}) and the run-level tests on the stores (tests/run); `make stores` and `make run` run one part.
STORE_TESTS = tests/contract tests/stores tests/run
contract: venv
	$(PYTEST) $(STORE_TESTS) $(ARGS)

stores: venv
	$(PYTEST) tests/stores $(ARGS)

run: venv
	$(PYTEST) tests/run $(ARGS)

# The contract suite on a PostgreSQL primary and standby behind a multi-host URL
# (tests/support/harnesses/postgresql_ha.py); not in `make test`, which would run the PostgreSQL half of the
# suite twice.
contract-pg-ha: venv
	FENCE_TEST_PG_HA=1 $(PYTEST) $(STORE_TESTS) -k postgresql-ha $(ARGS)

# The whole store contract suite on a 3-member etcd cluster (the etcd_cluster marker; make test runs only
# the failover cases of tests/stores/etcd/test_etcd_cluster.py).
contract-etcd-cluster: venv
	$(PYTEST) $(STORE_TESTS) -m etcd_cluster $(ARGS)

# The whole contract suite on a private Redis Cluster (make test runs its representative part)
contract-cluster: venv
	$(PYTEST) $(STORE_TESTS) -m cluster_full -k redis_cluster $(ARGS)

integration: venv
	$(PYTEST) tests/integration -m "not soak" $(ARGS)

chaos: venv
	$(PYTEST) tests/chaos -m "not soak" $(ARGS)

# The chaos suite at FENCE_SOAK_RUNS faulted runs per fault and store (default 1000), SOAK_BATCH of them
# at once, on a private PostgreSQL (its own max_connections; the shared server is left alone) and Redis
# databases of its own, then the table in docs/reliability.md. A soak of a few cases
# (ARGS="-k ..." SOAK_SECTION=name) writes its own table, between <!-- soak-name:begin/end --> markers.
SOAK_RUNS ?= 1000
SOAK_BATCH ?= 50
SOAK_SECTION ?=
soak: venv
	rm -f .soak.jsonl
	FENCE_SOAK_RUNS=$(SOAK_RUNS) FENCE_SOAK_BATCH=$(SOAK_BATCH) FENCE_TEST_PG_PRIVATE=1 \
	FENCE_TEST_BROKER_DB=3 FENCE_TEST_BACKEND_DB=4 FENCE_SOAK_REPORT=$(CURDIR)/.soak.jsonl \
	$(PYTEST) tests/chaos --timeout=0 $(ARGS)
	FENCE_SOAK_BATCH=$(SOAK_BATCH) $(PY) -m tests.chaos.report .soak.jsonl docs/reliability.md $(SOAK_SECTION)
	$(MAKE) soak-sim ARGS=

# The simulation of the real run (tests/simulation) at SIM_PROGRAMS random programs on the memory store through
# Celery's tracer, as many without it (Run through a fake host), and a tenth of that on SQLite; make test runs its short, derandomized form. A failure prints a replay line.
SIM_PROGRAMS ?= 200000
soak-sim: venv
	FENCE_SIM_PROGRAMS=$(SIM_PROGRAMS) $(PYTEST) tests/simulation -m soak --timeout=0 $(ARGS)

# Mutation testing of the run path (issue 26; figures and survivors in docs/reliability.md, "Mutation
# testing"). First mutmut 3 (configured in setup.cfg [mutmut]) over celery_fence/_decide.py, run.py,
# fence.py, task.py, stores/sql/run.py and the SQL store's acquire and complete, through
# tests/mutation/mutmut_run.py; then the decide table's rows, which mutmut cannot mutate (module-level
# dicts and returned constants), through tests/mutation/table_mutation.py: each row's action replaced by
# every other Action, and deleted. The backing tests: tests/unit (but test_pytest_plugin.py) and the
# run-level contract tests on the memory and SQLite stores (tests/mutation/stores.py drops the others).
# One child at a time (--max-children 1: the machine is shared).
#   MODULES=  a subset, of: _decide run fence task sql.run sql.store (or mutant-name globs); default all;
#             MODULES=none runs the table rows alone
#   SAMPLE=N  at most N random mutants per module (SEED=26), so that one run fits in a session
#   ROWS=     only the table rows whose name contains this text (e.g. ROWS=_REFUSED); ROWS=none skips them
# After new tests, run only the survivors again: `$(PY) -m tests.mutation.mutmut_run MODULE --survivors`
# and `$(PY) -m tests.mutation.table_mutation --survivors mutants/table-rows.json --json FILE`.
# e.g. make mutation MODULES="fence sql.run" ROWS=none; make mutation MODULES=run SAMPLE=200 ROWS=none;
# make mutation MODULES=none (the table rows only: about 11 minutes).
# Quirks: mutmut copies the package, tests/ (with tests/conftest.py) and the also_copy files into ./mutants
# and runs pytest there with mutants/ first on sys.path, so the editable install's finder (appended to
# sys.meta_path) never serves celery_fence and the pytest11 entry point (celery_fence.testing's plugin)
# loads the mutated copy; the doc tests need docs/, README.md, example_app/ in also_copy.
# test_pytest_plugin.py is left out: it runs pytest in child projects on the installed package, not on
# mutants/. mutmut picks the tests of a mutant by function (those that called it while it mapped them), and
# generates mutants only inside `mutmut run`: the driver lists them by asking for a mutant that does not
# exist first (mutmut stops there with an AssertionError, by design). Results are kept in mutants/ per
# function and reused while its code is unchanged, but a change of the [mutmut] test selection resets every
# result (rerun what the figures need), and a change of a non-Python file is only warned about: after a
# rewrite run `make mutation-clean` first. A whole run of every module takes hours: sample.
MODULES ?=
SAMPLE ?= 0
SEED ?= 26
ROWS ?=
mutation: venv
	$(if $(filter none,$(MODULES)),,$(PY) -m tests.mutation.mutmut_run $(MODULES) --sample $(SAMPLE) --seed $(SEED) --max-children 1)
	mkdir -p mutants
	$(if $(filter none,$(ROWS)),,$(PY) -m tests.mutation.table_mutation --only "$(ROWS)" --json mutants/table-rows.json)

mutation-clean:
	rm -rf mutants

lint: venv
	$(VENV)/bin/ruff check $(LINT_PATHS)

type: venv
	$(VENV)/bin/mypy --strict celery_fence

check: lint type test

demo: venv
	$(PY) -m example_app demo

bench: venv
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) -m benchmarks

# celery-fence against celery-once, celery-singleton, fencekit and relier on the same faults (docs/comparison.md).
# The peers go into a venv of their own, so .venv stays as the tests expect it.
COMPARE_VENV = .venv-compare
compare: $(COMPARE_VENV)/.installed
	$(COMPARE_VENV)/bin/python -m benchmarks.comparison $(ARGS)

$(COMPARE_VENV)/.installed: setup.cfg pyproject.toml
	test -x $(COMPARE_VENV)/bin/python || $(PYTHON) -m venv $(COMPARE_VENV)
	$(COMPARE_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(COMPARE_VENV)/bin/python -m pip install --quiet -e '.[compare]'
	touch $@

# docs/img/flower-*.png from a real Flower in headless Chromium (docs/flower.md).
flower-screenshot: venv
	$(PY) -m benchmarks.flower_screenshot $(ARGS)

clean:
	rm -rf build dist mutants *.egg-info .tox .mypy_cache .ruff_cache .pytest_cache .hypothesis .fence-demo
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
