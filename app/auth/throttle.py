"""Failed authentications are rate limited per client address: a client guessing keys gets 429
with ``Retry-After`` after ``limit`` failures in ``window_s`` (300 wrong keys in 1.9 s all got
401 before: issue 24). Per process, in memory: a restart forgets, which only ever lets a client
try again sooner."""

from __future__ import annotations

import math
import threading
import time
from collections import deque


class AuthThrottle:
    def __init__(self, limit: int, window_s: float, max_clients: int = 100_000) -> None:
        self.limit = limit
        self.window_s = window_s
        self.max_clients = max_clients
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, client: str, now: float) -> deque[float]:
        times = self._failures.get(client)
        if times is None:
            return deque()
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._failures[client]
        return times

    def retry_after(self, client: str, now: float | None = None) -> int | None:
        """Seconds until ``client`` may try again, or None when it may now."""
        now = time.monotonic() if now is None else now
        with self._lock:
            times = self._recent(client, now)
            if len(times) < self.limit:
                return None
            return max(1, math.ceil(times[0] + self.window_s - now))

    def failed(self, client: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            if client not in self._failures and len(self._failures) >= self.max_clients:
                # Bounded memory under a spray from many addresses: forget the oldest client.
                self._failures.pop(next(iter(self._failures)))
            self._recent(client, now)
            self._failures.setdefault(client, deque()).append(now)
