"""redacted fields, and the escalated card's outbox (issues 26 and 21)

`tool_policies.redact`: the keys of a tool's input nobody is shown. On `approvals`, the keys
its policy hid when it was made (`redact`) and their values (`secrets`), which only the call
that runs reads; and the escalated card's outbox (`escalation_card`, posting, posted or
failed, and `escalation_attempted_at`), so a failed escalation post is retried as a card's
is. Escalations already made are taken as posted when their card's ts is known, else as
failed (never retried now, as before).

Revision ID: 0022
Revises: 0021
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import storage.models

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APPROVALS = (
    sa.Column("escalation_card", sa.String(length=16), nullable=True),
    sa.Column("escalation_attempted_at", storage.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column("redact", sa.JSON(), nullable=False, server_default=sa.text("'[]'")),
    sa.Column("secrets", sa.JSON(), nullable=True),
)


def upgrade() -> None:
    for column in APPROVALS:
        op.add_column("approvals", column)
    op.add_column(
        "tool_policies",
        sa.Column("redact", sa.JSON(), nullable=False, server_default=sa.text("'[]'")),
    )
    op.execute(
        "UPDATE approvals SET escalation_card = CASE WHEN escalation_ts IS NULL"
        " THEN 'failed' ELSE 'posted' END WHERE escalation = 'escalated'"
    )


def downgrade() -> None:
    op.drop_column("tool_policies", "redact")
    for column in reversed(APPROVALS):
        op.drop_column("approvals", column.name)
