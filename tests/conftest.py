"""Shared fixtures. Tests never touch the developer's real data: WMARK_HOME is a temp dir.

WMARK_TEST_STRICT=1 (set by .ci/run) turns a missing PostgreSQL or missing model extra into a
failure instead of a skip, so CI cannot pass by skipping.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import create_engine, text
from tokenizers import Tokenizer, models, pre_tokenizers

from wmark import KeyMaterial, Secret, TokenizerRef, WatermarkSpec
from wmark.keys import KeyRegistry, RegistryConfig

STRICT = os.environ.get("WMARK_TEST_STRICT") == "1"
# One intra-op thread: test models are tiny, and OpenMP threads spinning on a busy 2-core machine
# made them several times slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Converted embedded models are cached once per checkout (build/ is ignored by git), not per test.
os.environ.setdefault("WMARK_MODEL_CACHE", str(Path(__file__).resolve().parents[1] / "build" / "test-models"))
PG_ADMIN_URL = os.environ.get("WMARK_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
VOCAB_WORDS = 500


def unavailable(reason: str) -> None:
    """Skip, or fail under WMARK_TEST_STRICT=1."""
    if STRICT:
        pytest.fail(f"required for CI but unavailable: {reason}")
    pytest.skip(reason)


@pytest.fixture(autouse=True)
def _seeded_key_secrets(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys created through the registry get secrets seeded by the test's name, not the OS.

    Several tests check that unwatermarked text is *not* flagged under a registry key; with a
    random secret that fails in 1% of runs (the p-value is uniform). Seeding makes each such test
    deterministic, as every other random test here is. The seed is the test's name (with its
    parameters), not its path, so moving a test file does not redraw its keys.
    """
    import hashlib

    import wmark.keys.registry as registry_module

    counter = iter(range(1_000_000))

    def seeded() -> Secret:
        return Secret(hashlib.sha256(f"{request.node.name}#{next(counter)}".encode()).digest())

    monkeypatch.setattr(registry_module, "new_secret", seeded)


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "wmark-home"
    monkeypatch.setenv("WMARK_HOME", str(home))
    monkeypatch.delenv("WMARK_DATABASE_URL", raising=False)
    monkeypatch.delenv("WMARK_MASTER_KEY", raising=False)
    return home


@pytest.fixture()
def install_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[str, list[bytes]], None]]:
    """Installs chunks as importable packages {name}1..{name}N whose get_part_path() returns each
    chunk's file: the layout of the embedded models' PyPI part packages."""
    import sys

    names: list[str] = []

    def install(name: str, chunks: list[bytes]) -> None:
        for i, chunk in enumerate(chunks, start=1):
            pkg = tmp_path / "site" / f"{name}{i}"
            (pkg / "data").mkdir(parents=True)
            (pkg / "data" / "part.bin").write_bytes(chunk)
            (pkg / "__init__.py").write_text(
                "import os\n\n\ndef get_part_path():\n"
                "    return os.path.join(os.path.dirname(__file__), 'data', 'part.bin')\n"
            )
            names.append(f"{name}{i}")
        monkeypatch.syspath_prepend(str(tmp_path / "site"))

    yield install
    for module in names:
        sys.modules.pop(module, None)


def build_word_tokenizer(n_words: int = VOCAB_WORDS) -> bytes:
    """A WordLevel tokenizer over w0..w{n-1} plus [UNK], split on whitespace (built, not downloaded)."""
    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(n_words)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return str(tok.to_str()).encode()


@pytest.fixture(scope="session")
def word_tokenizer_json() -> bytes:
    """tokenizer.json bytes of the test WordLevel tokenizer."""
    return build_word_tokenizer()


@pytest.fixture()
def word_spec(word_tokenizer_json: bytes) -> WatermarkSpec:
    """A default spec bound to the test tokenizer."""
    import hashlib

    ref = TokenizerRef(
        name="words", sha256=hashlib.sha256(word_tokenizer_json).hexdigest(), vocab_size=VOCAB_WORDS + 1
    )
    return WatermarkSpec(tokenizer=ref)


@pytest.fixture()
def word_key(word_spec: WatermarkSpec) -> KeyMaterial:
    """A key with a fixed secret (seeded tests stay reproducible)."""
    return KeyMaterial(key_id="wk_test000001", secret=Secret(bytes(range(32))), spec=word_spec)


@pytest.fixture(scope="session")
def pg_available() -> bool:
    engine = create_engine(PG_ADMIN_URL)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        return True
    except Exception:
        return False
    finally:
        engine.dispose()


@pytest.fixture()
def pg_url(pg_available: bool) -> Iterator[str]:
    """A fresh, empty PostgreSQL database on 127.0.0.1:5432, dropped afterwards."""
    if not pg_available:
        unavailable("PostgreSQL on 127.0.0.1:5432 is not reachable")
    name = f"wmark_test_{secrets.token_hex(4)}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


REDIS_URL = os.environ.get("WMARK_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture()
def redis_url() -> str:
    """The Redis server on 127.0.0.1:6379 (the service's shared rate limits)."""
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError:
        unavailable("Redis on 127.0.0.1:6379 is not reachable")
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, _isolated_home: Path) -> str:
    """Each registry test runs on SQLite (a file in WMARK_HOME) and on the real PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{_isolated_home / 'wmark.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture()
def registry_config(
    database_url: str, _isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> RegistryConfig:
    """Registry settings pointing at the parametrised database; also exported to the environment."""
    monkeypatch.setenv("WMARK_DATABASE_URL", database_url)
    return RegistryConfig.from_env()


@pytest.fixture()
def registry(registry_config: RegistryConfig) -> Iterator[KeyRegistry]:
    """An opened, migrated registry."""
    with KeyRegistry.open(registry_config) as reg:
        yield reg


def plant_watermark(
    key: KeyMaterial, n_tokens: int, rng: np.random.Generator, *, support: int = 40
) -> list[int]:
    """Tokens drawn by the keyed race from distributions built here (no model).

    Each position gets its own random distribution over `support` random token IDs (Dirichlet
    with concentration 0.5: natural-language-like entropy). Repeated windows use unkeyed
    randomness, exactly as the generator does, so the text is a faithful watermarked sample.
    """

    from wmark.contexts import ContextTracker
    from wmark.prf import FreeSource, KeyedSource, seed_uniforms
    from wmark.race import race_winner

    vocab = key.spec.tokenizer.vocab_size
    keyed = KeyedSource(key.secret, key.spec)
    free = FreeSource(rng.bytes(32), key.spec.spec_version)
    ids = [int(x) for x in rng.integers(1, vocab, size=key.spec.context_width)]  # a "prompt"
    tracker = ContextTracker(key.spec.context_width, start=len(ids))
    while len(ids) < n_tokens + key.spec.context_width:
        cand = rng.choice(np.arange(1, vocab), size=support, replace=False)
        probs = rng.dirichlet(np.full(support, 0.5))
        label = tracker.label(ids)
        seed = keyed.seed(label) if label is not None else free.seed(len(ids), tracker.window(ids))
        tracker.commit(ids)
        ids.append(int(cand[race_winner(probs, seed_uniforms(seed, cand))]))
    return ids[key.spec.context_width :]


def plant_vllm_watermark(
    key: KeyMaterial, n_tokens: int, rng: np.random.Generator, *, support: int = 40
) -> list[int]:
    """Tokens drawn as vLLM's watermarking sampler draws them (vLLM scheme keys), no model.

    vLLM's Gumbel-max argmax_v log P(v) - ln(-ln U(v)) is the race argmin_v -ln U(v) / P(v), run
    here with vLLM's PRF (pinned to vLLM's code by tests/vectors/vllm_gumbel.json): contexts are
    the generated tokens before, -1 padded; a repeated context draws without the key; the
    dual-key scheme draws with key B with probability alpha, else key A.
    """
    from wmark.race import race_winner
    from wmark.vllm_gumbel import VllmGumbelKey, vllm_contexts, vllm_uniforms

    subkeys = VllmGumbelKey(key.secret, key.spec).subkeys
    h, alpha = key.spec.context_width, key.spec.dual_key_alpha
    ids: list[int] = []
    seen: set[tuple[int, ...]] = set()
    while len(ids) < n_tokens:
        cand = rng.choice(np.arange(1, key.spec.tokenizer.vocab_size), size=support, replace=False)
        probs = rng.dirichlet(np.full(support, 0.5))
        context = vllm_contexts(np.array(ids + [0], dtype=np.uint32), h)[-1]
        if tuple(context) in seen:
            ids.append(int(rng.choice(cand, p=probs)))
            continue
        seen.add(tuple(context))
        subkey = subkeys[1] if alpha is not None and rng.random() < alpha else subkeys[0]
        u = vllm_uniforms(subkey, np.repeat(context[None], support, axis=0), cand.astype(np.uint32))
        ids.append(int(cand[race_winner(probs, u)]))
    return ids


@pytest.fixture()
def planted() -> Callable[..., list[int]]:
    """`plant_watermark` (`plant_vllm_watermark` for vLLM keys) as a fixture (test modules cannot
    import conftest)."""

    def plant(key: KeyMaterial, n_tokens: int, rng: np.random.Generator, **kwargs: int) -> list[int]:
        fn = plant_vllm_watermark if key.spec.is_vllm else plant_watermark
        return fn(key, n_tokens, rng, **kwargs)

    return plant
