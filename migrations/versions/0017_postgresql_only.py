"""postgresql only: drop audit_purges, the permit table SQLite's audit trigger read

Greenlight runs on PostgreSQL alone now. Migration 0012 created the table on every backend,
but on PostgreSQL the trail's purge path is greenlight_purge_audit and nothing ever wrote a
row here, so dropping it loses nothing. (The SQLite triggers never existed on PostgreSQL.)

Revision ID: 0017
Revises: 0013
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import storage.models

revision: str = "0017"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_table("audit_purges")


def downgrade() -> None:
    op.create_table(
        "audit_purges",
        sa.Column("before", storage.models.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("before"),
    )
