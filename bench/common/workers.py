"""Worker processes that do not outlive the bench that started them.

A spawned pool worker is a child of the bench process, but nothing ends it when that process is
killed (SIGKILL, a closed terminal, a cut-off session): it goes on training its seed for tens of
minutes and takes the cores from whatever runs next — a CI run on the same machine ran three times
slower beside such orphans. Every pool the benches start passes ``exit_with_parent`` as its
initializer.
"""

from __future__ import annotations

import os
import threading
import time

# How often a worker looks at its parent: a second of lag is nothing beside a seed's minutes.
PARENT_POLL_SECONDS = 1.0


def _watch_parent(parent_pid: int, poll_seconds: float) -> None:
    while True:
        # Orphans are re-parented (to init or a subreaper), so another parent id means ours died.
        if os.getppid() != parent_pid:
            os._exit(1)
        time.sleep(poll_seconds)


def exit_with_parent(parent_pid: int, poll_seconds: float = PARENT_POLL_SECONDS) -> None:
    """Pool initializer: end this worker as soon as ``parent_pid`` is no longer its parent.

    Pass the starting process's ``os.getpid()`` in ``initargs``: read in the worker, the parent
    may already be gone.
    """
    if os.getppid() != parent_pid:
        os._exit(1)
    watcher = threading.Thread(
        target=_watch_parent, args=(parent_pid, poll_seconds), name="exit-with-parent", daemon=True
    )
    watcher.start()
