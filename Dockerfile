# Two images from one file (docker-compose.yml builds both):
#   --target api     the API and the one-shot migration
#   --target worker  the Celery worker: FAISS's GPU build (sm_90 code, for H100/H200)
# Every package, torch included, comes from one registry: PIP_INDEX_URL (PyPI by default, or your
# mirror). PyPI's Linux torch is the CUDA build; TORCH_INDEX_URL (empty by default) takes torch
# alone from elsewhere: docker-compose.cpu.yml sets it to torch's CPU-wheel index, for hosts
# without a GPU (a fraction of the CUDA build's size).
# Each installs the project non-editable (`pip install .`), as tests/service/test_installed_stack.py
# does, so the migrations run from the installed package, not from a source tree; with the `milvus`
# extra (pymilvus, milvus-lite), so one image serves NOBACKFILL_VECTOR_ENGINE=faiss and =milvus.
FROM python:3.11-slim AS base

ARG PIP_INDEX_URL=https://pypi.org/simple
ARG TORCH_INDEX_URL=
ENV PIP_INDEX_URL=$PIP_INDEX_URL \
    TORCH_INDEX_URL=$TORCH_INDEX_URL \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NOBACKFILL_DATA_DIR=/data

WORKDIR /srv/nobackfill
RUN useradd --create-home --uid 10001 nobackfill \
    && mkdir -p /data \
    && chown nobackfill /data

# torch first, from TORCH_INDEX_URL when set, else from the registry of everything else.
FROM base AS api
# Pinned: hadolint reads the optional index flags as an unpinned package.
# hadolint ignore=DL3013
RUN pip install "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
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

# The worker: FAISS's GPU wheel replaces faiss-cpu (both provide the `faiss` module). It runs on
# a CPU too, more slowly.
FROM base AS worker
# Pinned: hadolint reads the optional index flags as an unpinned package.
# hadolint ignore=DL3013
RUN pip install "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
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
