"""The master-key check value: proves which master key seals the registry's secrets.

One row (id 1) holds a known constant sealed under the master key. Writers open it before
sealing a new secret, so a wrong `WMARK_MASTER_KEY` cannot add keys that the right one cannot
open. The row is written with the first secret; an existing registry gets it on the first
successful open of one of its secrets (migrations have no master key to derive it here).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "master_key_check",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("master_key_id", sa.String(16), nullable=False),
        sa.Column("check_value", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("master_key_check")
