# NexusFlow developer commands. Every target is idempotent.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.requirements.stamp

.PHONY: venv db static bytecode lint test demo chaos bench clean

venv: $(STAMP)

$(STAMP): requirements.txt
	@command -v $(PYTHON) >/dev/null || { echo "make: $(PYTHON) not found"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if ! pkg-config --exists libmariadb 2>/dev/null && ! pkg-config --exists mysqlclient 2>/dev/null; then \
		echo "venv: installing the MariaDB client headers"; \
		$$( [ "$$(id -u)" -eq 0 ] || echo sudo ) env DEBIAN_FRONTEND=noninteractive apt-get install -y libmariadb-dev pkg-config >/dev/null; \
	fi
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	@touch $(STAMP)

db: venv
	@bash scripts/ensure_mariadb.sh $(PY)
	@$(PY) scripts/create_databases.py
	$(PY) manage.py migrate --noinput --verbosity 0
	$(PY) manage.py migrate --noinput --verbosity 0 --database control

# The admin's and the API docs' assets, gathered into STATIC_ROOT (var/static) for the web server (WhiteNoise).
static: venv
	$(PY) manage.py collectstatic --noinput --verbosity 0

# Where PYTHONDONTWRITEBYTECODE is set Python caches no bytecode, and every process the suite and the demo start
# (hundreds of Django processes) would compile the project's modules from source again: about 0.6 s of CPU each,
# half of a process's start. Compile them once; a changed file is compiled again by the next run.
SOURCES := nexusflow connectors cutover runtime_outbox packs ops scripts tests manage.py
bytecode: venv
	@$(PY) -m compileall -q -j 0 $(SOURCES) >/dev/null

# ruff (pinned in requirements.txt, rules in ruff.toml): pyflakes, import order, bugbear, pyupgrade and unused
# noqa directives. `make test` runs it first and fails on what it finds.
lint: venv
	$(PY) -m ruff check --no-cache .

# The suite waits on real processes and the database far more than it computes: TEST_WORKERS pytest-xdist
# workers (each with its own test databases) run whole files side by side. TEST_WORKERS=0 runs serially.
# --no-loadscope-reorder keeps the files in the order tests/conftest.py gives them (the longest first): by default
# pytest-xdist hands out the files with the most tests first, which left the one-test journeys for the end.
TEST_WORKERS ?= 3
test: lint db static promtool bytecode
	@$(PY) -m pytest -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# promtool (Debian's prometheus package) checks ops/prometheus/alerts.yml and runs its rule unit tests in the suite.
.PHONY: promtool
promtool:
	@if ! command -v promtool >/dev/null; then \
		echo "test: installing promtool (prometheus)"; \
		$$( [ "$$(id -u)" -eq 0 ] || echo sudo ) env DEBIAN_FRONTEND=noninteractive apt-get install -y prometheus >/dev/null; \
	fi

demo: venv db static bytecode
	$(PY) manage.py demo $(DEMO_ARGS)

chaos: venv db static bytecode
	$(PY) -m pytest -p no:cacheprovider -m chaos --run-chaos $(PYTEST_ARGS)

# The chaos demo (docs/operations.md "What `make chaos-demo` does") with a fixed seed (override: make chaos-demo CHAOS_SEED=N).
CHAOS_SEED ?= 7
.PHONY: chaos-demo
chaos-demo: venv db static bytecode
	$(PY) manage.py demo --chaos $(CHAOS_SEED) $(DEMO_ARGS)

# NexusFlow beside the database floor, django-q2 and DBOS Transact (var/bench/report.json), then the capacity checks.
# BENCH_ARGS=--profile adds per-role worker profiles to the report (a profiled run is slower).
BENCH_SCALE ?= 1
BENCH_STAMP := $(VENV)/.requirements-bench.stamp
$(BENCH_STAMP): requirements-bench.txt $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-bench.txt
	@touch $(BENCH_STAMP)
# The DBOS Transact peer in a virtualenv of its own (its dependencies stay out of .venv); it runs against the
# local PostgreSQL at 127.0.0.1:5432 and the report says so when that is not reachable.
DBOS_VENV := var/bench/dbos-venv
DBOS_STAMP := $(DBOS_VENV)/.requirements.stamp
$(DBOS_STAMP): requirements-bench-dbos.txt
	@command -v $(PYTHON) >/dev/null || { echo "make: $(PYTHON) not found"; exit 1; }
	@test -x $(DBOS_VENV)/bin/python || $(PYTHON) -m venv $(DBOS_VENV)
	$(DBOS_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-bench-dbos.txt
	@touch $(DBOS_STAMP)
bench: venv db static bytecode $(BENCH_STAMP) $(DBOS_STAMP)
	$(PY) manage.py bench --scale $(BENCH_SCALE) $(BENCH_ARGS)
	$(PY) manage.py capacity_plan --plan packs/bench/plans/hot_account.json
	$(PY) -m pytest -p no:cacheprovider -m bench --run-bench $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) var
