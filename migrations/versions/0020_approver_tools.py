"""approver tools: an approval's note, and standing approvals (issue 26)

`tool_policies.note` ("required": an Approve takes a note) and `standing_seconds` (a card may
offer a standing approval that long); on `approvals`, what the policy asked when the request
was made (`note_required`, `standing_offer_seconds`), the standing approval granted with it
(`standing`, `standing_until`, `standing_rule`, `standing_uses`, `standing_revoked_by`,
`standing_revoked_at`), and for a call a standing approval approved, which one (`under`);
`approval_votes.note`, a voter's note.

Revision ID: 0020
Revises: 0019
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import storage.models

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APPROVALS = (
    sa.Column("note_required", sa.Boolean(), server_default=sa.false(), nullable=False),
    sa.Column("standing_offer_seconds", sa.Integer(), nullable=True),
    sa.Column("standing", sa.String(length=16), server_default="none", nullable=False),
    sa.Column("standing_until", storage.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column("standing_rule", sa.String(length=64), nullable=True),
    sa.Column("standing_uses", sa.Integer(), server_default="0", nullable=False),
    sa.Column("standing_revoked_by", sa.String(length=32), nullable=True),
    sa.Column("standing_revoked_at", storage.models.UTCDateTime(timezone=True), nullable=True),
    sa.Column("under", sa.String(length=64), nullable=True),
)
POLICIES = (
    sa.Column("note", sa.String(length=16), nullable=True),
    sa.Column("standing_seconds", sa.Integer(), nullable=True),
)


def upgrade() -> None:
    for column in APPROVALS:
        op.add_column("approvals", column)
    for column in POLICIES:
        op.add_column("tool_policies", column)
    op.add_column("approval_votes", sa.Column("note", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("approval_votes", "note")
    for column in reversed(POLICIES):
        op.drop_column("tool_policies", column.name)
    for column in reversed(APPROVALS):
        op.drop_column("approvals", column.name)
