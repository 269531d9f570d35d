"""The harness of the generation tests: `wmark serve --generate`'s app under uvicorn, in this process.

Tiny random word-level models built here (`word_model_dir`, with a chat template added). `gen`
starts servers and holds the helpers both test modules use; `gate` holds the model between
blocks (a sampler that waits for the test's permission), so tests are bounded by the engine's
progress, not by the clock.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import openai
import pytest
import uvicorn

from wmark.api import Settings, create_app
from wmark.api.generate_settings import GenerationSettings
from wmark.generator import engine
from wmark.keys import KeyRegistry, RegistryConfig

T = TypeVar("T")

WAIT_S = 120  # a safety net only: every wait ends on a state change long before


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory, word_model_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    out = {"target": word_model_dir(root / "target", 0), "drafter": word_model_dir(root / "drafter", 1)}
    for path in out.values():  # the word models have no chat template: a plain one
        (path / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }} {% endfor %}")
    return out


@dataclass
class Served:
    url: str
    registry: KeyRegistry
    key_id: str
    tokens: dict[str, str]
    app: object
    clients: list[openai.OpenAI] = field(default_factory=list)  # closed when the server stops

    def client(self, role: str = "generator", **kwargs: Any) -> openai.OpenAI:
        """An OpenAI client of `role`; its pooled connections close with the server, not at some
        later garbage collection (where an unclosed socket's warning fails another test)."""
        made = openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.tokens[role], max_retries=0, **kwargs)
        self.clients.append(made)
        return made

    @property
    def generation(self) -> Any:
        return self.app.state.generation  # type: ignore[attr-defined]

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


class Harness:
    """Servers over the module's models, and the helpers the generation tests share."""

    MODEL = "tiny"
    PROMPT = "w10 w11 w12 w13 w14 w15 w16 w17 w18 w19"
    WAIT_S = WAIT_S

    def __init__(self, dirs: dict[str, Path]) -> None:
        self.dirs = dirs

    @contextmanager
    def served(self, **generation: object) -> Iterator[Served]:
        """create_app under uvicorn in a thread of this process (the test can reach its queue)."""
        registry, key_id, tokens = self.setup_registry()
        options = {
            "target": str(self.dirs["target"]),
            "drafter": str(self.dirs["drafter"]),
            "method": "mpfr",
            "model_name": self.MODEL,
            "precision": "exact-fp32",
            "max_tokens": 160,
            "max_prompt_tokens": 64,
        }
        options.update(generation)
        settings = Settings(
            registry=RegistryConfig.from_env(),
            migrate=True,
            rate_per_second=1000.0,
            rate_burst=1000,
            auth_fail_per_second=1000.0,
            auth_fail_burst=1000,
        )
        app = create_app(settings, GenerationSettings(**options))  # type: ignore[arg-type]
        port = self.free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        self.until(lambda: server.started or not thread.is_alive(), "the server to start")
        assert server.started, "the server did not start"
        served = Served(f"http://127.0.0.1:{port}", registry, key_id, tokens, app)
        try:
            yield served
        finally:
            for client in served.clients:
                client.close()
            server.should_exit = True
            thread.join(WAIT_S)
            registry.close()

    def setup_registry(self) -> tuple[KeyRegistry, str, dict[str, str]]:
        """A registry (SQLite under the test's WMARK_HOME) with a key and a token of each role."""
        registry = KeyRegistry.open(RegistryConfig.from_env())
        ref = registry.add_tokenizer((self.dirs["target"] / "tokenizer.json").read_bytes(), "words")
        key = registry.create_key("served", ref)
        roles = ("generator", "detector", "auditor", "admin")
        tokens = {r: registry.tokens.create(r, f"{r}-test", actor="test").token for r in roles}
        return registry, key.key_id, tokens

    @staticmethod
    def free_port() -> int:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])

    @staticmethod
    def until(condition: Callable[[], T], what: str) -> T:
        """Poll `condition` until it is truthy; return what it returned."""
        deadline = time.monotonic() + WAIT_S
        while not (value := condition()):
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.01)
        return value

    @staticmethod
    def generations(registry: KeyRegistry) -> list[Any]:
        """The audit rows of generations, oldest first."""
        return registry.audit.page(limit=1000, action="generate")[::-1]

    @staticmethod
    def error(exc: openai.APIStatusError) -> dict[str, Any]:
        """The OpenAI error object of a refusal (and that the body has that shape)."""
        body = exc.response.json()
        assert set(body) == {"error"} and {"message", "type", "code"} <= set(body["error"])
        return dict(body["error"])

    @classmethod
    def running_job(cls, srv: Served) -> Any:
        """The job the worker holds (waits for one to start).

        Tests keep the job, not `srv.generation.current`, to see it cancelled: a job cancelled
        before its first block ends at once and is let go within milliseconds, so a poll of
        `current` can miss it (CI did; reproduced by holding the worker until the cancel).
        """
        return cls.until(lambda: srv.generation.current, "a generation to start")


@pytest.fixture(scope="module")
def gen(dirs: dict[str, Path]) -> Harness:
    return Harness(dirs)


@pytest.fixture()
def gate(monkeypatch: pytest.MonkeyPatch) -> threading.Semaphore:
    """basic-uwm, but each block first waits for a permit from the test (`gate.release(n)`)."""
    permits = threading.Semaphore(0)
    real = engine.METHODS["basic-uwm"]

    def gated(inputs: Any) -> Any:
        permits.acquire()
        return real.block(inputs)

    monkeypatch.setitem(engine.METHODS, "basic-uwm", engine.Method(gated, True, False, False))
    return permits
