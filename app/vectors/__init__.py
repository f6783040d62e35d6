"""Where a gallery's vectors live: one interface (``engine``), one implementation per storage."""
