"""Ed25519 signing keys of detection receipts.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

The private half is sealed under the master key like a watermark secret
(``private_ciphertext``, ``master_key_id``); the public half is kept in the
clear forever, so receipts signed by a retired or revoked key still verify
(revoked ones as such).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "receipt_keys",
        sa.Column("kid", sa.String(64), primary_key=True),
        sa.Column("public_key", sa.String(64), nullable=False),
        sa.Column("private_ciphertext", sa.LargeBinary, nullable=False),
        sa.Column("master_key_id", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_receipt_keys_status", "receipt_keys", ["status"])


def downgrade() -> None:
    op.drop_index("ix_receipt_keys_status", table_name="receipt_keys")
    op.drop_table("receipt_keys")
