"""policy rules: quorum, CEL rules, reminder and escalation per tool

Set by POLICY_FILE at start (and kept until an admin or the next start changes them).

Revision ID: 0006
Revises: 0005
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (
    sa.Column("approvals", sa.Integer(), nullable=True),
    sa.Column("rules", sa.JSON(), nullable=False, server_default=sa.text("'[]'")),
    sa.Column("remind_after_seconds", sa.Integer(), nullable=True),
    sa.Column("escalate_after_seconds", sa.Integer(), nullable=True),
    sa.Column("escalate_to", sa.String(length=32), nullable=True),
    sa.Column("escalate_approvers", sa.JSON(), nullable=False, server_default=sa.text("'[]'")),
)


def upgrade() -> None:
    for column in COLUMNS:
        op.add_column("tool_policies", column)


def downgrade() -> None:
    for column in reversed(COLUMNS):
        op.drop_column("tool_policies", column.name)
