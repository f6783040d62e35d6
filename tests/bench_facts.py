"""What a benchmark's results record about its machine (``bench.common.machine.machine_facts``),
as the renderer tests give it: the renderers print these facts and nothing in them is judged."""

from __future__ import annotations

MACHINE = {
    "cpu": "cpu",
    "cores": 2,
    "gpu": None,
    "python": "3.11",
    "torch": "2",
    "torch_threads": 1,
    "faiss": "1",
    "faiss_threads": 1,
    "numpy": "2",
    "date": "today",
}
