"""request context: what led to a call (the request, the agent's words, each value's source,
the requester's history), and an index to count a requester's earlier requests

Revision ID: 0009
Revises: 0008
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("approvals", sa.Column("context", sa.JSON(), nullable=True))
    op.create_index(
        "ix_approvals_requester", "approvals", ["team_id", "requester", "tool", "requested_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_approvals_requester", table_name="approvals")
    op.drop_column("approvals", "context")
