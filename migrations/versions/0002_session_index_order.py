"""session index: session_id first

With team_id leading, PostgreSQL without statistics yet (a new table) used this index for
primary-key lookups by (team_id, snapshot_id) and filtered every row of the team.

Revision ID: 0002
Revises: 0001
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_agent_snapshots_session", table_name="agent_snapshots")
    op.create_index(
        "ix_agent_snapshots_session",
        "agent_snapshots",
        ["session_id", "team_id", "created_at"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_agent_snapshots_session", table_name="agent_snapshots")
    op.create_index(
        "ix_agent_snapshots_session",
        "agent_snapshots",
        ["team_id", "session_id", "created_at"],
        unique=False,
    )
