"""API tokens: shown once, stored as SHA-256 only, roles, revocation, constant-time check, CLI, audit rows."""

from __future__ import annotations

import hashlib
import json

import pytest
from sqlalchemy import event, text
from typer.testing import CliRunner

from wmark import InputError
from wmark.cli.main import app
from wmark.keys import KeyRegistry
from wmark.keys.tokens import TokenNotFoundError, TokenRejected, TokenStore
from wmark.keys.transactions import write_transaction

runner = CliRunner()


def _dump(registry: KeyRegistry) -> str:
    with registry.engine.connect() as conn:
        return repr(conn.execute(text("SELECT * FROM api_tokens")).all()) + repr(
            conn.execute(text("SELECT * FROM audit_log")).all()
        )


def test_token_lifecycle_and_storage(registry):
    issued = registry.tokens.create("detector", "bot", actor="cli:alice")
    token = issued.token
    assert token.startswith(f"wmt_{issued.info.token_id}_") and len(token) == 4 + 12 + 1 + 43
    assert token not in repr(issued)
    dump = _dump(registry)
    secret = token[17:]  # wmt_ + 12-hex id + _
    assert token not in dump and secret not in dump
    assert hashlib.sha256(token.encode()).hexdigest() in dump  # what is stored instead

    info = registry.tokens.authenticate(token)
    assert info.role == "detector" and info.name == "bot" and info.created_by == "cli:alice"
    assert info.allows("detector") and not info.allows("admin") and not info.allows("auditor")
    admin = registry.tokens.authenticate(registry.tokens.create("admin", actor="t").token)
    assert all(admin.allows(r) for r in ("admin", "detector", "auditor"))

    registry.tokens.revoke(info.token_id, actor="cli:bob")
    registry.tokens.revoke(info.token_id, actor="cli:bob")  # idempotent
    with pytest.raises(TokenRejected) as exc:
        registry.tokens.authenticate(token)
    assert exc.value.reason == "revoked" and exc.value.token_id == info.token_id
    assert [t.revoked_at is not None for t in registry.tokens.list()] == [True, False]
    actions = [(r.action, r.actor, r.result["token_id"]) for r in registry.audit.tail(10)]
    assert actions == [
        ("token_create", "cli:alice", info.token_id),
        ("token_create", "t", admin.token_id),
        ("token_revoke", "cli:bob", info.token_id),
    ]
    with pytest.raises(TokenNotFoundError):
        registry.tokens.revoke("000000000000", actor="x")


@pytest.mark.parametrize(
    ("mangle", "reason"),
    [
        pytest.param(lambda _t: None, "missing", id="missing"),
        pytest.param(lambda _t: "", "missing", id="empty"),
        pytest.param(lambda t: "Bearer " + t, "malformed", id="with-scheme"),
        pytest.param(lambda t: t[:-1], "malformed", id="short"),
        pytest.param(lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"), "mismatch", id="wrong-secret"),
        pytest.param(lambda t: "wmt_ffffffffffff_" + t[17:], "unknown", id="unknown-id"),
    ],
)
def test_bad_tokens_are_rejected_with_a_reason(registry, mangle, reason):
    token = registry.tokens.create("auditor", actor="t").token
    with pytest.raises(TokenRejected) as exc:
        registry.tokens.authenticate(mangle(token))
    assert exc.value.reason == reason
    assert token not in str(exc.value)


@pytest.mark.parametrize(("role", "name"), [("root", ""), ("admin", "x" * 201), ("admin", "a\nb")])
def test_bad_role_or_name_is_refused(registry, role, name):
    with pytest.raises(InputError):
        registry.tokens.create(role, name, actor="t")


def _invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_tokens_cli(registry_config):
    created = _invoke("tokens", "create", "--role", "detector", "--name", "moderation")
    assert created.exit_code == 0, created.output
    token = created.stdout.strip()
    assert token.startswith("wmt_") and "not shown again" in created.stderr
    as_json = json.loads(_invoke("tokens", "create", "--role", "admin", "--json").stdout)
    assert as_json["role"] == "admin" and as_json["token"].startswith("wmt_")

    listed = [json.loads(line) for line in _invoke("tokens", "list", "--json").stdout.splitlines()]
    assert [t["role"] for t in listed] == ["detector", "admin"]
    table = _invoke("tokens", "list").stdout
    assert "moderation" in table and token not in table
    assert all("token" not in t and "token_sha256" not in t for t in listed)

    token_id = listed[0]["token_id"]
    assert _invoke("tokens", "revoke", token_id).exit_code == 0
    with KeyRegistry.open(registry_config) as reg, pytest.raises(TokenRejected):
        reg.tokens.authenticate(token)
    assert _invoke("tokens", "revoke", "nope").exit_code == 2
    assert _invoke("tokens", "create", "--role", "root").exit_code == 2


def test_a_revocation_check_is_one_query_per_transaction_and_sees_every_commit(registry):
    # the service re-checks a cached token in each group commit: once per transaction, however
    # many of the group's requests carry it, and a revocation committed since is always seen
    token = registry.tokens.create("detector", "cached", actor="test").info.token_id
    statements: list[str] = []

    def record(conn, cursor, statement, *args) -> None:
        statements.append(statement)

    event.listen(registry.engine, "before_cursor_execute", record)
    try:
        with write_transaction(registry.sessions) as session:
            for _ in range(3):
                TokenStore.ensure_unrevoked(session, token)
    finally:
        event.remove(registry.engine, "before_cursor_execute", record)
    assert sum("api_tokens" in s for s in statements) == 1
    registry.tokens.revoke(token, actor="test")
    with pytest.raises(TokenRejected), write_transaction(registry.sessions) as session:
        TokenStore.ensure_unrevoked(session, token)
