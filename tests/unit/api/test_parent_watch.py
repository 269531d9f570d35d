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
    assert parent_watch.watch_parent(None) is None
    assert parent_watch.watch_parent(os.getpid()) is None  # the single-process server itself
    assert sent == []


def test_a_worker_whose_server_died_before_it_started_shuts_down_at_once(monkeypatch):
    sent = _kills(monkeypatch)
    gone = os.getppid() + 1_000_000  # a server pid that is not this process's parent
    assert parent_watch.watch_parent(gone) is not None
    assert sent == [(os.getpid(), signal.SIGTERM)]


def test_a_live_server_is_watched_without_a_signal(monkeypatch):
    sent = _kills(monkeypatch)
    stop = parent_watch.watch_parent(os.getppid())
    assert stop is not None
    stop.set()
    assert sent == []


def test_the_settings_read_the_servers_pid_and_the_metrics_directory():
    from wmark.api.settings import SERVE_PID_ENV, Settings

    env = {"WMARK_HOME": "/tmp/unused", SERVE_PID_ENV: "4242", "PROMETHEUS_MULTIPROC_DIR": "/tmp/m"}
    settings = Settings.from_env(env)
    assert (settings.serve_pid, settings.metrics_dir) == (4242, "/tmp/m")
    bare = Settings.from_env({"WMARK_HOME": "/tmp/unused", SERVE_PID_ENV: "not a pid"})
    assert (bare.serve_pid, bare.metrics_dir) == (None, None)
