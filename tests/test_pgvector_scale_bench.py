"""bench.perf.pgvector_scale (issue 46 item 4): the owner's table it loads by binary COPY holds
exactly the rows it was given, its truth is the float64 cosine top-10, and its section's
verdicts follow the figures."""

from __future__ import annotations

import numpy as np
import psycopg

from bench.perf import pgvector_scale as bench
from tests.bench_facts import MACHINE
from tests.service.pgvector_server import (  # noqa: F401  (the fixtures)
    pgvector_database_fixture,
    pgvector_server_fixture,
)


def test_the_binary_copy_loads_exactly_the_rows_and_builds_the_index(
    pgvector_database: str, wordnet_small: dict
) -> None:
    vectors = np.asarray(wordnet_small["gloss.all-MiniLM-L6-v2"][:300], dtype=np.float32)
    loaded = bench.load_table(pgvector_database, vectors, chunk=128)  # three COPY chunks
    assert loaded["table_bytes"] > 0 and loaded["index_bytes"] > 0
    with psycopg.connect(pgvector_database) as conn:
        rows = conn.execute("SELECT id, embedding::real[] FROM items ORDER BY id").fetchall()
        index = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'items_embedding_hnsw'"
        ).fetchone()
    assert [r[0] for r in rows] == list(range(300))
    np.testing.assert_array_equal(np.asarray([r[1] for r in rows], dtype=np.float32), vectors)
    assert index is not None and "hnsw (embedding vector_cosine_ops)" in index[0]


def test_the_truth_is_the_float64_cosine_top_10(wordnet_small: dict) -> None:
    vectors = np.asarray(wordnet_small["gloss.all-MiniLM-L6-v2"][:500], dtype=np.float32)
    queries = np.asarray(wordnet_small["lemma.all-MiniLM-L6-v2"][:20], dtype=np.float64)
    vectors[7] = vectors[3]  # a tie: the lower row comes first
    queries[0] = vectors[3]
    truth = bench.exact_top(vectors, queries)
    cosines = bench.unit(queries) @ bench.unit(vectors).T
    for row, found in enumerate(truth):
        expected = np.lexsort((np.arange(len(vectors)), -cosines[row]))[: bench.K]
        assert list(found) == list(expected)
    assert list(truth[0][:2]) == [3, 7]
    # Recall counts a tie as right: row 7 in place of row 3 is no loss.
    swapped = [[7, *truth[0][1:].tolist()]]
    assert bench.recall_per_query(swapped, truth[:1], vectors, queries[:1])[0] == 1.0
    wrong = [[499, *truth[0][1:].tolist()]]
    assert bench.recall_per_query(wrong, truth[:1], vectors, queries[:1])[0] == 0.9


def test_the_section_states_each_target_met_or_missed() -> None:
    result = {
        "command": "python -m bench.perf.pgvector_scale",
        "seconds": 600.0,
        "machine": MACHINE,
        "load_start": [0, 0, 0],
        "load_end": [0, 0, 0],
        "run": {
            "rows": 1000,
            "queries": 256,
            "server": {"postgresql": "18", "pgvector": "0.8.2", "shared_buffers": "1GB"},
            "load": {"copy_s": 1.0, "index_s": 60.0, "table_bytes": 2**30, "index_bytes": 2**29},
            "attach": {"exact_s": 0.5, "store_bytes": 1000},
            "api_rss_mib": {"started": 500.0, "attached": 501.0, "searched": 502.0},
            "hnsw": [
                {
                    "ef_search": 40,
                    "recall": {
                        "service": [0.95, 0.94, 0.96],
                        "direct": [0.95, 0.94, 0.96],
                        "service_minus_direct": [0.0, -0.001, 0.001],
                    },
                    "qps": {
                        "engine_1": 100.0,
                        "service_1": 50.0,
                        "direct_1": 400.0,
                        "engine_256": 300.0,
                        "service_256": 200.0,
                        "direct_256": 350.0,
                    },
                }
            ],
            "exact": {
                "queries": 8,
                "ordered_equal": 1.0,
                "recall": 1.0,
                "service_s": 1.0,
                "direct_s": 0.9,
            },
        },
    }
    text = bench.render(result)
    assert "batch 1: engine 0.25 × psycopg (target ≥ 0.8): missed by 0.550" in text
    assert "batch 256: engine 0.86 × psycopg (target ≥ 0.8): met" in text
    assert "interval low end -0.0010 (target ≥ −0.005): met" in text
    assert "no copy: the attach wrote 0.0 MiB against 1,024 MiB of table: met" in text
    result["run"]["hnsw"][0]["recall"]["service_minus_direct"] = [-0.01, -0.02, 0.0]
    assert "interval low end -0.0200 (target ≥ −0.005): missed by 0.015" in bench.render(result)
