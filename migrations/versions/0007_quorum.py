"""quorum: an approval may need several distinct approvers; each one's vote is a row

Revision ID: 0007
Revises: 0006
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "approvals",
        sa.Column("approvals_needed", sa.Integer(), nullable=False, server_default="1"),
    )
    op.add_column("approvals", sa.Column("votes", sa.Integer(), nullable=False, server_default="0"))
    op.create_table(
        "approval_votes",
        sa.Column("approval_id", sa.String(length=64), nullable=False),
        sa.Column("voter", sa.String(length=32), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["approval_id"], ["approvals.id"]),
        sa.PrimaryKeyConstraint("approval_id", "voter"),
    )


def downgrade() -> None:
    op.drop_table("approval_votes")
    op.drop_column("approvals", "votes")
    op.drop_column("approvals", "approvals_needed")
