"""versions: a request is one versioned call; each vote names the version it approved

`approvals.version` numbers the call's current version (1: as the agent asked it; each edit
makes the next); `asked_input` keeps the model's own arguments when the tool's schema
coerced them (a restart must carry them exactly); `edited_preview` is the tool's preview of
the edited call. `approval_votes.version` is the version a vote counts for.

Revision ID: 0014
Revises: 0017 (main already has 0017 on 0013; the lead re-chains)
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APPROVALS = (
    sa.Column("version", sa.Integer(), server_default="1", nullable=False),
    sa.Column("asked_input", sa.JSON(), nullable=True),
    sa.Column("edited_preview", sa.Text(), nullable=True),
)


def upgrade() -> None:
    for column in APPROVALS:
        op.add_column("approvals", column)
    op.add_column(
        "approval_votes", sa.Column("version", sa.Integer(), server_default="1", nullable=False)
    )


def downgrade() -> None:
    op.drop_column("approval_votes", "version")
    for column in reversed(APPROVALS):
        op.drop_column("approvals", column.name)
