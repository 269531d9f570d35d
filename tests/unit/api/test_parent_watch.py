"""A worker of `wmark serve --workers N` stops when the server process is gone, however early."""

from __future__ import annotations

import os
import signal

from wmark.api import parent_watch


def _kills(monkeypatch) -> list[tuple[int, int]]:
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(parent_watch.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    return sent


def test_outside_wmark_serve_nothing_is_watched(monkeypatch):
    sent = _kills(monkeypatch)
    monkeypatch.delenv(parent_watch.ENV, raising=False)
    assert parent_watch.watch_parent() is None
    monkeypatch.setenv(parent_watch.ENV, str(os.getpid()))  # the single-process server itself
    assert parent_watch.watch_parent() is None
    assert sent == []


def test_a_worker_whose_server_died_before_it_started_shuts_down_at_once(monkeypatch):
    sent = _kills(monkeypatch)
    gone = os.getppid() + 1_000_000  # a server pid that is not this process's parent
    monkeypatch.setenv(parent_watch.ENV, str(gone))
    assert parent_watch.watch_parent() is not None
    assert sent == [(os.getpid(), signal.SIGTERM)]


def test_a_live_server_is_watched_without_a_signal(monkeypatch):
    sent = _kills(monkeypatch)
    monkeypatch.setenv(parent_watch.ENV, str(os.getppid()))
    stop = parent_watch.watch_parent()
    assert stop is not None
    stop.set()
    assert sent == []
