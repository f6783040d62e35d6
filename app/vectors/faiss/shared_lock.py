"""A readers–writer lock: many holders share it, or one holds it alone.

FAISS releases the GIL while it searches and while it adds or removes, and its structures are
changed in place (a flat or HNSW index's storage vector is reallocated as it grows): a search
running beside a write reads freed memory and can take the whole server process down. Searches
share this lock around what they read of a FAISS structure; a write holds it alone. A waiting
writer stops new readers from entering, so a steady stream of searches cannot starve uploads.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class SharedLock:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._writing or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writing or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()
