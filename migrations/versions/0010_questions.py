"""questions: an interrupt that asks a person for input is a request that asks (the
requester or the approvers) and is answered once

Revision ID: 0010
Revises: 0009
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("approvals", sa.Column("asks", sa.String(length=16), nullable=True))
    op.add_column("approvals", sa.Column("answer", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("approvals", "answer")
    op.drop_column("approvals", "asks")
