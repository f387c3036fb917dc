"""edits: an approval approved with changes keeps the input its call runs with, and who
changed it when

Revision ID: 0011
Revises: 0010
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import storage.models

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (
    sa.Column("edited_input", sa.JSON(), nullable=True),
    sa.Column("edited_by", sa.String(length=32), nullable=True),
    sa.Column("edited_at", storage.models.UTCDateTime(timezone=True), nullable=True),
)


def upgrade() -> None:
    for column in COLUMNS:
        op.add_column("approvals", column)


def downgrade() -> None:
    for column in reversed(COLUMNS):
        op.drop_column("approvals", column.name)
