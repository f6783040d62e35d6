"""Benchmarks, grouped by what they measure; each runs as ``python -m bench.<group>.<name>``
(``--quick`` for a smoke run) and writes its JSON under ``bench/results`` and its section of
BENCHMARKS.md:

quality  retrieval quality on real data: compat (every method, class and instance views),
         querydoc (lemma → gloss), backfill (quality against the share re-embedded), continual
perf     speed and memory: search, indexes, ingest, engines (Milvus against FAISS), load,
         api_memory, training, profile, milvus_layouts
data     the WordNet-noun data: build_wordnet rebuilds it, make_fixtures cuts the test fixtures,
         reference_figures checks its README's published figures
common   what they share: the data loader, the server harness, reports, machine descriptions"""
