"""participants: everyone whose message led to a call, for the four-eyes rule

A conversation remembers every human whose message ran a turn in it; an approval records
them as they were when the call was made, and none of them may decide it.

Revision ID: 0003
Revises: 0002
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    for table in ("conversations", "approvals"):
        op.add_column(
            table,
            sa.Column("participants", sa.JSON(), nullable=False, server_default=sa.text("'[]'")),
        )


def downgrade() -> None:
    for table in ("conversations", "approvals"):
        op.drop_column(table, "participants")
