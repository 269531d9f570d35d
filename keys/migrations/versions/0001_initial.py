"""Keys and tokenizers.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tokenizers",
        sa.Column("sha256", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("vocab_size", sa.Integer, nullable=False),
        sa.Column("content", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "keys",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("fingerprint", sa.String(16), nullable=False),
        sa.Column("tokenizer_sha256", sa.String(64), sa.ForeignKey("tokenizers.sha256"), nullable=False),
        sa.Column("secret_ciphertext", sa.LargeBinary, nullable=False),
        sa.Column("master_key_id", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("rotated_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("replaces", sa.String(32), nullable=True),
        sa.Column("replaced_by", sa.String(32), nullable=True),
    )
    op.create_index("ix_keys_status", "keys", ["status"])


def downgrade() -> None:
    op.drop_index("ix_keys_status", table_name="keys")
    op.drop_table("keys")
    op.drop_table("tokenizers")
