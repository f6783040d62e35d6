"""HTTP shapes of embedders."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from app.core.schemas import Page, StrictModel


class EmbedderCreate(StrictModel):
    """The new backbone's embedding endpoint, speaking the OpenAI-compatible embeddings protocol
    (``POST url {"model", "input": [texts]}`` → ``{"data": [{"index", "embedding"}]}``: served by
    text-embeddings-inference, vLLM, Ollama, Infinity and hosted APIs). ``url`` must fall under
    an entry of the server's ``NOBACKFILL_EMBEDDER_ALLOWED_URLS``."""

    name: str = Field(min_length=1, max_length=128)
    url: str = Field(min_length=1, max_length=2048, pattern=r"^https?://")
    model: str = Field(min_length=1, max_length=256, description="the `model` field sent")
    dimension: int = Field(ge=1, description="length of the vectors it returns")
    api_key_env: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="a server environment variable holding its API key, sent as a bearer "
        "token; its name must start with NOBACKFILL_EMBEDDER_API_KEY_ENV_PREFIX",
    )
    query_prefix: str = Field(default="", max_length=256, description="put before query texts")
    document_prefix: str = Field(
        default="", max_length=256, description="put before document texts"
    )
    max_batch: int = Field(default=64, ge=1, description="texts per call at most")


class EmbedderOut(BaseModel):
    id: str
    name: str
    url: str
    model: str
    dimension: int
    api_key_env: str | None = Field(description="the variable's name; its value is never shown")
    query_prefix: str
    document_prefix: str
    max_batch: int
    created_at: datetime


class EmbedderList(Page):
    items: list[EmbedderOut]
