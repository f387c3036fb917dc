"""message_counts: messages per workspace and person per minute, for the message limits

Revision ID: 0013
Revises: 0012
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import storage.models

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "message_counts",
        sa.Column("team_id", sa.String(length=32), nullable=False),
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("minute", storage.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("told", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("team_id", "user_id", "minute"),
    )


def downgrade() -> None:
    op.drop_table("message_counts")
