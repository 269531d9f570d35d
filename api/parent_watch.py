"""Worker processes of `wmark serve --workers N` stop when the server process is gone.

uvicorn's supervisor stops its workers when it is told to (SIGTERM, Ctrl-C), but a supervisor
killed outright (`kill -9`, the OOM killer) cannot: its workers are re-parented and go on serving
on the port. `wmark serve` exports its process id as WMARK_SERVE_PID; a worker whose parent is
that process watches its parent id and, when it changes, sends itself SIGTERM, which uvicorn turns
into a graceful shutdown (requests in flight are finished, then the process exits).
"""

from __future__ import annotations

import logging
import os
import signal
import threading

__all__ = ["watch_parent"]
_POLL_S = 0.5

log = logging.getLogger("wmark.api")


def watch_parent(parent: int | None) -> threading.Event | None:
    """Start watching when this process is a worker of the `wmark serve` whose process id is
    `parent` (`Settings.serve_pid`); set the returned event to stop.

    Returns None in any other process (`parent` None or this process: a single-process `wmark
    serve`, `uvicorn --factory`, tests).
    A worker that starts after the server process died (its parent is already another process)
    shuts down at once: it would otherwise serve on the port with nobody to stop it.
    """
    if parent is None or os.getpid() == parent:
        return None
    stop = threading.Event()
    if os.getppid() != parent:
        log.warning("the server process %s is gone: this worker shuts down", parent)
        os.kill(os.getpid(), signal.SIGTERM)
        return stop

    def run() -> None:
        while not stop.wait(_POLL_S):
            if os.getppid() != parent:
                log.warning("the server process %s is gone: this worker shuts down", parent)
                os.kill(os.getpid(), signal.SIGTERM)
                return

    threading.Thread(target=run, name="wmark-parent-watch", daemon=True).start()
    return stop
