"""follow-ups: an approval's reminder and escalation, each due once

Revision ID: 0008
Revises: 0007
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _state(name: str, *values: str) -> sa.Enum:
    return sa.Enum(*values, name=name, native_enum=False, length=16)


COLUMNS = (
    sa.Column("remind_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column(
        "reminder",
        _state("reminderstate", "none", "scheduled", "sent"),
        nullable=False,
        server_default="none",
    ),
    sa.Column("escalate_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column(
        "escalation",
        _state("escalationstate", "none", "scheduled", "escalated"),
        nullable=False,
        server_default="none",
    ),
    sa.Column("escalation_channel", sa.String(length=32), nullable=True),
    sa.Column("escalation_ts", sa.String(length=32), nullable=True),
)


def upgrade() -> None:
    for column in COLUMNS:
        op.add_column("approvals", column)
    op.create_index("ix_approvals_follow_ups", "approvals", ["status", "remind_at", "escalate_at"])


def downgrade() -> None:
    op.drop_index("ix_approvals_follow_ups", table_name="approvals")
    for column in reversed(COLUMNS):
        op.drop_column("approvals", column.name)
