"""A real Milvus server: Milvus 2.3.5 standalone from PyPI's ``milvus`` package (issue 46).

The ``milvus`` package (a dev extra) ships the Milvus standalone binary (with an embedded etcd and
local storage) behind its ``milvus-server`` script; ``MilvusClient(uri="http://127.0.0.1:PORT")``
answers ``v2.3.5-lite``. It is a real Milvus server, unlike milvus-lite (``milvus_lite``: the
engine files of the tests, and the gRPC server process ``bench.perf.api_memory.milvus_server``).
The tests' shared server (``tests/service/milvus_server.py``) and the benchmarks on a server
(``bench.perf.milvus_server``) start it from here.

Its embedded etcd listens on the fixed peer port 2380, so two servers cannot run side by side on
one machine: ``milvus_standalone`` refuses to start a second one rather than let it die.

``python -m bench.common.milvus_standalone [--port 19530] [--data DIR]`` runs one in the
foreground for a developer and prints its URI (``make milvus-server`` runs the same ``main``
through ``tests.service.milvus_server``).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from pymilvus import MilvusClient

from bench.common.service import free_port

START_TIMEOUT_S = 180.0
# SIGINT is what the ``milvus-server`` wrapper handles (it stops the binary, then exits); this
# long after it the whole process group is killed.
STOP_TIMEOUT_S = 20.0
WRAPPER_GAVE_UP = "Milvus server already stopped."
# Runs the wrapper so that it gets SIGINT (its own stop) when this process dies, however it dies:
# a test run killed by a CI timeout would otherwise leave the server running, holding its ports.
# Linux's PR_SET_PDEATHSIG (1), kept across the exec; set in a launcher rather than in Popen's
# preexec_fn, which can deadlock in a process with threads (the tests' apps run some). argv:
# the parent's pid (gone already: exit), the wrapper and its arguments.
STOP_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "if sys.platform.startswith('linux'):\n"
    "    ctypes.CDLL(None).prctl(1, signal.SIGINT)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit('the process that started it is gone')\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)
# The embedded etcd's peer port: fixed in the binary, not configurable by ``milvus-server``.
ETCD_PEER_PORT = 2380


class ServerUnavailable(RuntimeError):
    """The standalone server could not be started here (missing package, start failure)."""


def server_script() -> Path:
    """The ``milvus-server`` script of this interpreter's environment."""
    script = Path(sys.executable).with_name("milvus-server")
    if not script.exists():
        raise ServerUnavailable(
            f"{script} is missing: install the dev extra (pip install -e '.[dev]'), which pins "
            "the `milvus` package that runs a Milvus 2.3 standalone server"
        )
    return script


def _stop(process: subprocess.Popen) -> None:
    """The wrapper, then anything left in its process group (the Milvus binary is its child)."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout=STOP_TIMEOUT_S)
    # Started with start_new_session: the group id is the wrapper's pid, and the group holds
    # only what this module started.
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _wait_ready(uri: str, port: int, process: subprocess.Popen, log: Path) -> str:
    """The server's version once it answers on ``port``."""
    deadline = time.monotonic() + START_TIMEOUT_S
    last: Exception | None = None
    while time.monotonic() < deadline:
        # The wrapper prints this when the binary died, then waits forever instead of exiting.
        if process.poll() is not None or WRAPPER_GAVE_UP in log.read_text(errors="replace"):
            raise ServerUnavailable(
                f"the Milvus binary stopped before answering; see {log} and "
                f"{log.parent / 'logs' / 'milvus-stdout.log'}"
            )
        try:
            client = MilvusClient(uri=uri, timeout=5)
            try:
                client.list_collections()
                return str(client.get_server_version())
            finally:
                client.close()
        except Exception as error:  # not up yet: connection refused, or the proxy not ready
            last = error
            time.sleep(0.5)
    raise ServerUnavailable(
        f"milvus-server did not answer on port {port} within {START_TIMEOUT_S:.0f} s "
        f"(last error: {last}); see {log}"
    )


@contextmanager
def standalone_process(
    data_dir: Path, port: int | None = None, config: Sequence[str] = ()
) -> Iterator[tuple[str, str, subprocess.Popen]]:
    """``milvus_standalone`` with the launcher's process as well (its tree holds the wrapper
    and the Milvus binary: what a benchmark reads the server's memory from)."""
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", ETCD_PEER_PORT)) == 0:
            # Another standalone (``make milvus-server``?) holds it: this one would die at start.
            raise ServerUnavailable(
                f"127.0.0.1:{ETCD_PEER_PORT} is taken (another Milvus standalone running?): "
                "the embedded etcd of a second one cannot start"
            )
    data_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    uri = f"http://127.0.0.1:{port}"
    log = data_dir / "milvus-server.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                STOP_WITH_PARENT,
                str(os.getpid()),
                str(server_script()),
                "--data",
                str(data_dir),
                "--proxy-port",
                str(port),
                *(part for item in config for part in ("--extra-config", item)),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        version = _wait_ready(uri, port, process, log)
        yield uri, version, process
    finally:
        _stop(process)


@contextmanager
def milvus_standalone(
    data_dir: Path, port: int | None = None, config: Sequence[str] = ()
) -> Iterator[tuple[str, str]]:
    """A Milvus standalone server with its data under ``data_dir``: (its URI, its version);
    ``config``: ``key=value`` settings of its milvus.yaml (``--extra-config``).

    ``milvus-server`` moves to the next free port when the one asked for is taken, without
    saying so; the wait checks the port asked for, so such a server would time out here rather
    than let the caller talk to another one."""
    with standalone_process(data_dir, port, config) as (uri, version, _process):
        yield uri, version


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=19530)
    parser.add_argument("--data", type=Path, default=Path("data/milvus-server"))
    args = parser.parse_args()
    # Stopped by Ctrl+C or a TERM alike, even where SIGINT came ignored (a job started with `&`).
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, signal.default_int_handler)
    with milvus_standalone(args.data.resolve(), args.port) as (uri, version):
        print(f"Milvus {version} at {uri} (data in {args.data}); Ctrl+C stops it", flush=True)
        with suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    main()
