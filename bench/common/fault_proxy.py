"""A TCP proxy that can be frozen: a wedged dependency (PostgreSQL, Redis) as its clients see it.
Shared by the dependency-fault tests (``tests/service``) and the soak bench's wedged-PostgreSQL
phase (``bench.perf.soak``)."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time


class FreezableProxy:
    """Forwards 127.0.0.1:<port> to ``upstream``. ``freeze()`` stops forwarding in both
    directions while every connection stays open, and new connections are accepted and never
    answered: a wedged server, as its clients see it (the kernel still acknowledges)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.frozen = threading.Event()
        self.stopped = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self.listener.settimeout(0.1)
        while not self.stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            server = socket.create_connection(self.upstream, timeout=5)
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peer = {a: b, b: a}
        watch = selectors.DefaultSelector()
        watch.register(a, selectors.EVENT_READ)
        watch.register(b, selectors.EVENT_READ)
        while not self.stopped.is_set():
            if self.frozen.is_set():
                time.sleep(0.05)
                continue
            try:
                for key, _ in watch.select(0.05):
                    if self.frozen.is_set():
                        break
                    sock = key.fileobj
                    data = sock.recv(65536)
                    if not data:
                        raise OSError("closed")
                    peer[sock].sendall(data)
            except OSError:
                break
        watch.close()
        self._close(a, b)

    @staticmethod
    def _close(*sockets: socket.socket) -> None:
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def freeze(self) -> None:
        self.frozen.set()

    def thaw(self) -> None:
        self.frozen.clear()

    def stop(self) -> None:
        self.stopped.set()
        self.listener.close()
        self._thread.join(timeout=5)
        with self._lock:
            self._close(*self._sockets)
