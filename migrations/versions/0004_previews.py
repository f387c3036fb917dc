"""previews: what a tool's own preview said about a call, shown on its card

NULL: the tool has no preview; '': it had one, which failed or took too long.

Revision ID: 0004
Revises: 0003
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("approvals", sa.Column("preview", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("approvals", "preview")
