"""The key registry on SQLite and the real PostgreSQL: lifecycle, encryption at rest, migrations."""

from __future__ import annotations

import base64
import os
import stat

import pytest
from sqlalchemy import inspect, text

from wmark import KeyNotFoundError, KeyRevokedError, MasterKeyError, TokenizerError
from wmark.keys import KeyRegistry, RegistryConfig
from wmark.keys.db import downgrade, head_revision, make_engine, schema_revision, upgrade


def _add_key(registry: KeyRegistry, tokenizer_json: bytes, name: str = "k"):
    ref = registry.add_tokenizer(tokenizer_json, "words")
    return registry.create_key(name, ref)


def test_key_lifecycle(registry, word_tokenizer_json):
    info = _add_key(registry, word_tokenizer_json, "prod model")
    assert info.status == "active" and info.key_id.startswith("wk_")
    assert registry.get(info.key_id).spec == info.spec
    new = registry.rotate(info.key_id)
    old = registry.get(info.key_id)
    assert old.status == "retired" and old.replaced_by == new.key_id and new.replaces == info.key_id
    assert {k.key_id for k in registry.detection_keys()} == {info.key_id, new.key_id}
    with pytest.raises(KeyRevokedError, match="retired"):
        registry.material(info.key_id, for_generation=True)
    with pytest.raises(KeyRevokedError):
        registry.rotate(info.key_id)
    registry.revoke(new.key_id)
    assert registry.revoke(new.key_id).status == "revoked"  # idempotent
    assert [k.key_id for k in registry.detection_keys()] == [info.key_id]
    with pytest.raises(KeyRevokedError):
        registry.detection_keys([new.key_id])
    with pytest.raises(KeyNotFoundError):
        registry.get("wk_missing")
    assert [k.key_id for k in registry.list_keys("revoked")] == [new.key_id]


def test_secret_decrypts_to_the_same_material_and_tokenizer_round_trips(registry, word_tokenizer_json):
    info = _add_key(registry, word_tokenizer_json)
    a, b = registry.material(info.key_id), registry.material(info.key_id)
    assert a.secret == b.secret and a.secret.fingerprint() == info.fingerprint
    assert registry.tokenizer_json(info.spec.tokenizer.sha256) == word_tokenizer_json
    assert registry.add_tokenizer(word_tokenizer_json, "other name").name == "words"  # idempotent
    with pytest.raises(TokenizerError):
        registry.tokenizer_json("f" * 64)
    with pytest.raises(TokenizerError):
        registry.add_tokenizer(b"{not json", "broken")


def _all_database_bytes(registry: KeyRegistry) -> bytes:
    chunks = []
    with registry.engine.connect() as conn:
        for table in inspect(conn).get_table_names():
            for row in conn.execute(text(f"SELECT * FROM {table}")):
                for value in row:
                    chunks.append(value if isinstance(value, bytes) else str(value).encode())
    return b"\x00".join(chunks)


def test_database_holds_no_secret_in_clear(registry, registry_config, word_tokenizer_json):
    infos = [_add_key(registry, word_tokenizer_json, f"k{i}") for i in range(5)]
    dump = _all_database_bytes(registry)
    if registry_config.database_url.startswith("sqlite"):
        dump += (registry_config.home / "wmark.db").read_bytes()
    for info in infos:
        raw = registry.material(info.key_id).secret.reveal()
        for form in (raw, raw.hex().encode(), base64.b64encode(raw), raw[:12]):
            assert form not in dump


def test_ciphertext_swapped_between_rows_does_not_decrypt(registry, word_tokenizer_json):
    a, b = _add_key(registry, word_tokenizer_json, "a"), _add_key(registry, word_tokenizer_json, "b")
    with registry.engine.begin() as conn:
        blob = conn.execute(
            text("SELECT secret_ciphertext FROM keys WHERE id = :i"), {"i": a.key_id}
        ).scalar_one()
        conn.execute(text("UPDATE keys SET secret_ciphertext = :c WHERE id = :i"), {"c": blob, "i": b.key_id})
    with pytest.raises(MasterKeyError, match="tampered"):
        registry.material(b.key_id)


def test_wrong_master_key_is_a_clear_error(registry, registry_config, word_tokenizer_json):
    info = _add_key(registry, word_tokenizer_json)
    other = RegistryConfig(
        home=registry_config.home,
        database_url=registry_config.database_url,
        master_key=base64.b64encode(os.urandom(32)).decode(),
    )
    with KeyRegistry.open(other) as reg, pytest.raises(MasterKeyError, match="sealed under master key"):
        reg.material(info.key_id)


def test_master_key_file_is_created_0600_and_loose_modes_are_refused(registry, registry_config):
    path = registry_config.key_file
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o644)
    with pytest.raises(MasterKeyError, match="chmod 600"):
        KeyRegistry.open(registry_config).close()


@pytest.mark.parametrize(
    "value", ["changethis", "short", "!!!not base64!!!", base64.b64encode(b"x" * 16).decode()]
)
def test_bad_master_key_values_are_refused(value, tmp_path):
    config = RegistryConfig(home=tmp_path, database_url="sqlite://", master_key=value)
    with pytest.raises(MasterKeyError):
        KeyRegistry.open(config).close()


def test_master_key_accepts_hex_and_base64(tmp_path):
    raw = os.urandom(32)
    ids = set()
    for value in (
        raw.hex(),
        base64.b64encode(raw).decode(),
        base64.urlsafe_b64encode(raw).decode().rstrip("="),
    ):
        with KeyRegistry.open(
            RegistryConfig(home=tmp_path, database_url="sqlite://", master_key=value)
        ) as reg:
            ids.add(reg.master_key.key_id)
    assert len(ids) == 1


def test_migrations_upgrade_downgrade_upgrade(database_url):
    engine = make_engine(database_url)
    upgrade(engine)
    assert schema_revision(engine) == head_revision()
    assert {"keys", "tokenizers"} <= set(inspect(engine).get_table_names())
    downgrade(engine, "base")
    assert "keys" not in inspect(engine).get_table_names()
    upgrade(engine)
    upgrade(engine)  # idempotent
    assert schema_revision(engine) == head_revision()
    engine.dispose()


def test_unreachable_database_is_a_clear_error(tmp_path):
    from wmark import KeyRegistryError

    config = RegistryConfig(home=tmp_path, database_url="postgresql+psycopg://nobody@127.0.0.1:1/none")
    with pytest.raises(KeyRegistryError, match="cannot reach the database"):
        KeyRegistry.open(config).close()
    with pytest.raises(KeyRegistryError, match="invalid database URL"):
        KeyRegistry.open(RegistryConfig(home=tmp_path, database_url="not a url")).close()


def test_repr_hides_credentials():
    config = RegistryConfig(
        home=__import__("pathlib").Path("/x"), database_url="postgresql://u:hunter2@h/db", master_key="k" * 44
    )
    assert "hunter2" not in repr(config) and "k" * 44 not in repr(config)
