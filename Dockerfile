# Two images from one file (docker-compose.yml builds both):
#   --target api     the API and the one-shot migration: CPU-only torch, no CUDA libraries
#   --target worker  the Celery worker: CUDA torch and FAISS's GPU build (sm_90 code, for H100/H200)
# Each installs the project non-editable (`pip install .`), as tests/service/test_installed_stack.py
# does, so the migrations run from the installed package, not from a source tree; with the `milvus`
# extra (pymilvus, milvus-lite), so one image serves NOBACKFILL_VECTOR_ENGINE=faiss and =milvus.
FROM python:3.11-slim AS base

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NOBACKFILL_DATA_DIR=/data

WORKDIR /srv/nobackfill
RUN useradd --create-home --uid 10001 nobackfill \
    && mkdir -p /data \
    && chown nobackfill /data

# The API: torch's CPU-only wheel (a fraction of the CUDA build's size).
FROM base AS api
ARG TORCH_CPU_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN pip install "torch==2.13.0" --index-url "$TORCH_CPU_INDEX_URL"
COPY pyproject.toml README.md ./
COPY app ./app
COPY worker ./worker
COPY bench ./bench
COPY migrations ./migrations
# Versions come from pyproject.toml's ranges, which torch==2.13.0 above satisfies.
# hadolint ignore=DL3013
RUN pip install ".[milvus]" && rm -rf /srv/nobackfill/*
USER 10001
VOLUME ["/data"]
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --retries=5 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
CMD ["nobackfill", "serve", "--host", "0.0.0.0", "--port", "8000"]

# The worker: the default Linux wheel of torch is the CUDA build; FAISS's GPU wheel replaces
# faiss-cpu (both provide the `faiss` module). It runs on a CPU too, more slowly.
FROM base AS worker
RUN pip install "torch==2.13.0"
COPY pyproject.toml README.md ./
COPY app ./app
COPY worker ./worker
COPY bench ./bench
COPY migrations ./migrations
# hadolint ignore=DL3013
RUN pip install ".[milvus]" \
    && pip uninstall -y faiss-cpu \
    && pip install "faiss-gpu==1.15.1" \
    && rm -rf /srv/nobackfill/*
USER 10001
VOLUME ["/data"]
CMD ["celery", "-A", "worker.celery_app", "worker", "--concurrency", "1", "--pool", "prefork", "--queues", "nobackfill", "--loglevel", "INFO"]
