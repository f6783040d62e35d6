"""What stands between a search and a failing or costly embedder (issue 43, item 7): a circuit
per embedder and an embedding budget per tenant. In-process state: each API process keeps its
own (a circuit or a budget shared across processes would need the broker on every search)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class _Circuit:
    failures: int = 0
    open_until: float = 0.0


class Circuits:
    """After ``failures`` consecutive failed calls an embedder's circuit opens for ``open_s``:
    searches then skip it (degraded at once, instead of each waiting for a timeout); the first
    call after that is a trial, and one success closes it."""

    def __init__(
        self, failures: int, open_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.failures, self.open_s, self.clock = failures, open_s, clock
        self._state: dict[str, _Circuit] = {}
        self._lock = threading.Lock()

    def is_open(self, embedder_id: str) -> bool:
        with self._lock:
            circuit = self._state.get(embedder_id)
            return circuit is not None and self.clock() < circuit.open_until

    def record(self, embedder_id: str, ok: bool) -> None:
        with self._lock:
            circuit = self._state.setdefault(embedder_id, _Circuit())
            if ok:
                circuit.failures, circuit.open_until = 0, 0.0
                return
            circuit.failures += 1
            if circuit.failures >= self.failures:
                circuit.open_until = self.clock() + self.open_s


class Budgets:
    """Texts a tenant may have embedded per minute: a token bucket of ``per_minute`` that
    refills continuously. ``take`` answers 0 when granted, else the seconds until it would be."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute, self.clock = per_minute, clock
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, tenant_id: str, count: int) -> int:
        rate = self.per_minute / 60.0
        with self._lock:
            now = self.clock()
            tokens, then = self._buckets.get(tenant_id, (float(self.per_minute), now))
            tokens = min(float(self.per_minute), tokens + (now - then) * rate)
            if count <= tokens:
                self._buckets[tenant_id] = (tokens - count, now)
                return 0
            self._buckets[tenant_id] = (tokens, now)
            if count > self.per_minute:
                return 60
            return max(1, math.ceil((count - tokens) / rate))


class EmbeddingGuards:
    """The process's circuits (per embedder) and budgets (per tenant)."""

    def __init__(self, failures: int, open_s: float, per_minute: int) -> None:
        self.circuits = Circuits(failures, open_s)
        self.budgets = Budgets(per_minute)

    @classmethod
    def of(cls, settings: Any) -> EmbeddingGuards:
        return cls(
            settings.embedder_circuit_failures,
            settings.embedder_circuit_open_s,
            settings.embed_items_per_minute,
        )
