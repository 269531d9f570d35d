"""The master-key check value: proves which master key seals the registry's secrets.

One row (id 1) holds a known constant sealed under the master key (`check_value`) and that
key's id. Writers lock the row and open the value before sealing a new secret, so a wrong
`WMARK_MASTER_KEY` cannot add keys that the right one cannot open. The row is inserted empty
here (migrations have no master key): it is filled with the first secret of a new registry, or,
for an existing one, on the first write whose master key opens one of the secrets already stored
(a write under a master key that opens none of them is refused).

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
    check = op.create_table(
        "master_key_check",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("master_key_id", sa.String(16), nullable=True),
        sa.Column("check_value", sa.LargeBinary, nullable=True),
        sa.Column("set_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.bulk_insert(check, [{"id": 1, "master_key_id": None, "check_value": None, "set_at": None}])


def downgrade() -> None:
    op.drop_table("master_key_check")
