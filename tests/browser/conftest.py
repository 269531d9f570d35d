"""Fixtures for the web page tests: the service in a background thread, and headless Chromium.

Chromium is Debian's /usr/bin/chromium driven by Playwright (the `[dev]` extra); `make test`
installs it when missing. Without it the tests skip, or fail under WMARK_TEST_STRICT=1.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from wmark.api import Settings, create_app
from wmark.keys import RegistryConfig

CHROMIUM = os.environ.get("WMARK_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "build" / "screenshots"


def _missing(reason: str) -> None:
    if os.environ.get("WMARK_TEST_STRICT") == "1":
        pytest.fail(f"required for CI but unavailable: {reason}")
    pytest.skip(reason)


@pytest.fixture()
def live_url(tmp_path: Path) -> Iterator[str]:
    """The service (SQLite in WMARK_HOME) on a free loopback port, in a thread of this process."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    app = create_app(Settings(registry=RegistryConfig.from_env(), migrate=True))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the service did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)


@pytest.fixture()
def browser_page(tmp_path: Path) -> Iterator[Any]:
    """A page of a headless Chromium with a fresh profile (user-data-dir)."""
    if shutil.which(CHROMIUM) is None:
        _missing(f"Chromium not found at {CHROMIUM} (apt-get install chromium, or `make test`)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (pip install -e '.[dev]')")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            args=CHROMIUM_FLAGS,
            headless=True,
            viewport={"width": 1100, "height": 900},
        )
        try:
            yield context.pages[0] if context.pages else context.new_page()
        finally:
            context.close()
