"""The WordNet-noun benchmark data: rebuilt from public sources (``build_wordnet``), cut into test
fixtures (``make_fixtures``), checked against its README's figures (``reference_figures``)."""
