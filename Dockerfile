# The image of the `api`, `worker` and `migrate` services (docker-compose.yml).
FROM python:3.11-slim

# torch is installed first and pinned. The default index serves a wheel that runs on CPU and on
# NVIDIA GPUs alike; pass --build-arg TORCH_INDEX_URL=<a PyTorch wheel index> for another build.
ARG TORCH_INDEX_URL=""

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NOBACKFILL_DATA_DIR=/data

WORKDIR /srv/nobackfill

# (pinned: hadolint cannot read the version through the optional --index-url expansion)
# hadolint ignore=DL3013
RUN pip install "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}

COPY pyproject.toml README.md alembic.ini ./
COPY app ./app
COPY worker ./worker
COPY bench ./bench
COPY migrations ./migrations
# Versions come from pyproject.toml's ranges, which torch==2.13.0 above satisfies.
# hadolint ignore=DL3013
RUN pip install .

RUN useradd --create-home --uid 10001 nobackfill \
    && mkdir -p /data \
    && chown nobackfill /data
USER 10001
VOLUME ["/data"]
EXPOSE 8000

HEALTHCHECK --interval=15s --timeout=5s --retries=5 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
CMD ["nobackfill", "serve", "--host", "0.0.0.0", "--port", "8000"]
