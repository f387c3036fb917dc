"""one replica syncs the people directory: when each workspace's next users.list is due

Every replica used to list the whole workspace every PEOPLE_SYNC_MINUTES; the first to
claim a due sync now does it for all (issue 23's follow-up).

Revision ID: 0024
Revises: 0023
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import storage.models

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "people_syncs",
        sa.Column("team_id", sa.String(length=32), primary_key=True),
        sa.Column("due_at", storage.models.UTCDateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("people_syncs")
