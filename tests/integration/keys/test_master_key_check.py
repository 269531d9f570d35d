"""The master-key check: no secret written under a master key that is not the registry's, keys
sealed under another master key left out of detection (each named), weak master keys refused."""

from __future__ import annotations

import base64
import hashlib

import pytest

from wmark import MasterKeyError
from wmark.keys import KeyRegistry, MasterKey, RegistryConfig
from wmark.keys.db import downgrade, make_engine, upgrade
from wmark.keys.master_check import KeyUnavailableError, WrongMasterKeyError
from wmark.keys.models import Key, MasterKeyCheck, utcnow
from wmark.vllm_gumbel import VllmWatermarkConfig


def _master(seed: str) -> str:
    return base64.b64encode(hashlib.sha256(seed.encode()).digest()).decode()


GOOD, OTHER = _master("good"), _master("other")


def _as(config: RegistryConfig, master: str) -> RegistryConfig:
    return RegistryConfig(home=config.home, database_url=config.database_url, master_key=master)


def _plant_foreign_key(registry: KeyRegistry, foreign: MasterKey, like: str) -> str:
    """A key row sealed under `foreign`, as a write under a wrong master key made it before the
    check existed (the registry now refuses to write one)."""
    with registry.sessions.begin() as session:
        model = session.get(Key, like)
        assert model is not None
        key_id = "wk_f0f0f0f0f0f0"
        session.add(
            Key(
                id=key_id,
                name="foreign",
                status="active",
                spec=model.spec,
                fingerprint="0" * 16,
                tokenizer_sha256=model.tokenizer_sha256,
                secret_ciphertext=foreign.seal(b"s" * 32, key_id.encode()),
                master_key_id=foreign.key_id,
                created_at=utcnow(),
            )
        )
    return key_id


@pytest.fixture()
def good(registry_config):
    with KeyRegistry.open(_as(registry_config, GOOD)) as reg:
        yield reg


def test_no_secret_is_written_under_another_master_key(good, registry_config, word_tokenizer_json):
    ref = good.add_tokenizer(word_tokenizer_json, "words")
    first = good.create_key("k", ref)
    before = good.key_state()
    with KeyRegistry.open(_as(registry_config, OTHER)) as wrong:
        other_id = wrong.master_key.key_id
        vllm = VllmWatermarkConfig.from_dict({"key": 7, "algorithm": "gumbel"})
        for write in (
            lambda: wrong.create_key("k2", ref),
            lambda: wrong.rotate(first.key_id),
            lambda: wrong.import_vllm_key("v", ref, vllm),
            lambda: wrong.receipt_keys.rotate(actor="test"),  # a receipt signing key's private half
        ):
            with pytest.raises(WrongMasterKeyError, match="nothing was written") as err:
                write()
            assert err.value.status == 503 and other_id in str(err.value)
            assert OTHER not in str(err.value) and GOOD not in str(err.value)
    assert good.key_state() == before  # the good key is still the active one
    assert good.rotate(first.key_id).status == "active"  # the right master key still writes


def test_the_check_value_is_written_with_the_first_secret(good, registry_config, word_tokenizer_json):
    with good.sessions() as session:
        assert session.get(MasterKeyCheck, 1).check_value is None  # migrated: the empty row
    good.create_key("k", good.add_tokenizer(word_tokenizer_json, "words"))
    with good.sessions() as session:
        row = session.get(MasterKeyCheck, 1)
    assert row.master_key_id == good.master_key.key_id and good.master_key.opens_check(row.check_value)
    assert not MasterKey.load(_as(registry_config, OTHER)).opens_check(row.check_value)


def test_an_existing_registry_gets_its_check_value_from_a_secret_that_opens(
    registry_config, word_tokenizer_json
):
    """A registry from before the check (migration 0002, with keys) is upgraded; the check value
    comes from the first write whose master key opens a stored secret, and none other writes."""
    engine = make_engine(registry_config.database_url)
    with KeyRegistry.open(_as(registry_config, GOOD)) as reg:
        ref = reg.add_tokenizer(word_tokenizer_json, "words")
        kept = reg.create_key("old", ref)
    downgrade(engine, "0002")  # the registry as 0002 left it, its key and audit rows kept
    upgrade(engine)
    engine.dispose()
    with KeyRegistry.open(_as(registry_config, OTHER)) as wrong:
        with pytest.raises(WrongMasterKeyError, match="opens none of the registry's 1 key secrets"):
            wrong.create_key("k2", ref)
        with wrong.sessions() as session:
            assert session.get(MasterKeyCheck, 1).check_value is None  # the refusal set nothing
    with KeyRegistry.open(_as(registry_config, GOOD)) as reg:
        assert reg.material(kept.key_id).key_id == kept.key_id  # the upgrade kept the secret
        reg.rotate(kept.key_id)
        with reg.sessions() as session:
            assert reg.master_key.opens_check(session.get(MasterKeyCheck, 1).check_value)
        assert reg.audit.verify().ok


def test_detection_leaves_out_keys_sealed_under_another_master_key(
    good, registry_config, word_tokenizer_json
):
    ref = good.add_tokenizer(word_tokenizer_json, "words")
    mine = good.create_key("k", ref)
    foreign = _plant_foreign_key(good, MasterKey.load(_as(registry_config, OTHER)), mine.key_id)
    keys, skipped = good.open_detection_keys()
    assert [k.key_id for k in keys] == [mine.key_id]
    assert [s.key_id for s in skipped] == [foreign] and "sealed under master key" in skipped[0].message
    assert [k.key_id for k in good.detection_keys()] == [mine.key_id]
    assert [k.key_id for k in good.detection_keys([mine.key_id])] == [mine.key_id]
    with pytest.raises(KeyUnavailableError) as err:
        good.detection_keys([foreign])
    assert err.value.status == 409 and foreign in str(err.value)
    with pytest.raises(KeyUnavailableError):
        good.material(foreign)
    good.revoke(mine.key_id)
    with pytest.raises(WrongMasterKeyError, match="opens none of the registry's detection keys"):
        good.detection_keys()


def test_readiness_check_of_the_master_key_is_cached(good, registry_config, word_tokenizer_json, monkeypatch):
    ref = good.add_tokenizer(word_tokenizer_json, "words")
    mine = good.create_key("k", ref)
    opened = []
    real_open = MasterKey.open
    monkeypatch.setattr(MasterKey, "open", lambda self, *a: opened.append(1) or real_open(self, *a))
    assert good.master_key_health.problem() is None
    first = len(opened)
    for _ in range(5):
        assert good.master_key_health.problem() is None
    assert len(opened) == first  # unchanged keys: nothing decrypted again
    with KeyRegistry.open(_as(registry_config, OTHER)) as wrong:
        assert "is not this registry's" in wrong.master_key_health.problem()
    foreign = _plant_foreign_key(good, MasterKey.load(_as(registry_config, OTHER)), mine.key_id)
    problem = good.master_key_health.problem()  # the active keys changed: checked again
    assert problem is not None and foreign in problem and mine.key_id not in problem
    good.revoke(foreign)
    assert good.master_key_health.problem() is None


@pytest.mark.parametrize(
    "raw",
    [bytes(32), b"\xff" * 32, bytes(range(32)), b"\x01\x02" * 16, bytes(range(7)) * 4 + b"\0" * 4],
    ids=["zero", "ones", "counting", "pattern2", "seven-values"],
)
@pytest.mark.parametrize("encoding", ["hex", "base64", "file"])
def test_trivially_weak_master_keys_are_refused(raw, encoding, tmp_path):
    value = raw.hex() if encoding == "hex" else base64.b64encode(raw).decode()
    if encoding == "file":
        (tmp_path / "master.key").write_text(value + "\n")
        (tmp_path / "master.key").chmod(0o600)
    config = RegistryConfig(
        home=tmp_path, database_url="sqlite://", master_key=None if encoding == "file" else value
    )
    with pytest.raises(
        MasterKeyError, match="not a random key: generate one with `wmark keys master-key`"
    ) as err:
        MasterKey.load(config)
    assert value not in str(err.value)


def test_a_random_master_key_is_not_weak():
    for seed in range(200):
        MasterKey(hashlib.sha256(f"{seed}".encode()).digest())
