"""API tokens and the hash-chained audit log.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_BigInt = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
GENESIS = "0" * 64  # wmark.keys.audit.GENESIS; migrations never import application code


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(16), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("token_sha256", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(200), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_table(
        "audit_log",
        sa.Column("seq", _BigInt, primary_key=True, autoincrement=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("key_ids", sa.Text, nullable=False),
        sa.Column("text_sha256", sa.String(64), nullable=True),
        sa.Column("result", sa.Text, nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("row_hash", sa.String(64), nullable=False),
    )
    op.create_index("ix_audit_log_action", "audit_log", ["action"])
    head = op.create_table(
        "audit_head",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("seq", _BigInt, nullable=False),
        sa.Column("row_hash", sa.String(64), nullable=False),
    )
    op.bulk_insert(head, [{"id": 1, "seq": 0, "row_hash": GENESIS}])


def downgrade() -> None:
    op.drop_table("audit_head")
    op.drop_index("ix_audit_log_action", table_name="audit_log")
    op.drop_table("audit_log")
    op.drop_table("api_tokens")
