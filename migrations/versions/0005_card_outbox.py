"""card outbox: an approval's card is posting, posted or failed

A card is recorded as being posted before it is posted, so a sweep that finds a post cut off
looks for it in the channel before it posts again, and never posts a second live card.

Revision ID: 0005
Revises: 0004
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "approvals",
        sa.Column(
            "card_state",
            sa.Enum(
                "posting",
                "posted",
                "failed",
                name="cardstate",
                native_enum=False,
                length=16,
            ),
            nullable=False,
            server_default="posting",
        ),
    )
    op.add_column("approvals", sa.Column("card_attempted_at", sa.DateTime(timezone=True)))
    op.execute("UPDATE approvals SET card_state = 'posted' WHERE card_ts IS NOT NULL")
    op.execute("UPDATE approvals SET card_state = 'failed' WHERE card_channel IS NULL")
    op.execute("UPDATE approvals SET card_attempted_at = requested_at")


def downgrade() -> None:
    op.drop_column("approvals", "card_attempted_at")
    op.drop_column("approvals", "card_state")
