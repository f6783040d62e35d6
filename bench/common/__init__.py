"""What the benchmarks share: the WordNet-noun loader (``wordnet``), tiled lifting (``tiled``),
markdown sections (``report``), the machine description (``machine``), the server harness
(``service``)."""
