"""Per-key calibration results (``wmark calibrate``): the false-positive rate
measured on the user's own unwatermarked corpus, kept with the key.

One row per calibration run; the newest row per key is the one reported.
``spec_sha256`` is the hash of the key's spec at calibration time, so a key
whose spec changed since is seen as stale.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "key_calibrations",
        sa.Column("id", sa.String(16), primary_key=True),
        sa.Column("key_id", sa.String(32), sa.ForeignKey("keys.id"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("corpus_sha256", sa.String(64), nullable=False),
        sa.Column("spec_sha256", sa.String(64), nullable=False),
        sa.Column("alpha", sa.Float, nullable=False),
        sa.Column("n_scored", sa.Integer, nullable=False),
        sa.Column("n_flagged", sa.Integer, nullable=False),
        sa.Column("report", sa.Text, nullable=False),
    )
    op.create_index("ix_key_calibrations_key_id", "key_calibrations", ["key_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_key_calibrations_key_id", table_name="key_calibrations")
    op.drop_table("key_calibrations")
