"""the people directory (issue 23): what Slack says of each person, for every replica

Guest checks (issue 21) read it instead of calling users.info for each new person; it is
filled by users.list, the user_change and team_join events, and users.info.

Revision ID: 0023
Revises: 0022
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import storage.models

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "people",
        sa.Column("team_id", sa.String(length=32), primary_key=True),
        sa.Column("user_id", sa.String(length=32), primary_key=True),
        sa.Column("facts", sa.JSON(), nullable=False),
        sa.Column("checked_at", storage.models.UTCDateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("people")
