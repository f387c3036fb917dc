"""gateway: callbacks owed, MCP callers waiting (by lease), MCP sessions' facts

Revision ID: 0019
Revises: 0018
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import storage.models

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WHEN = storage.models.UTCDateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "gateway_callbacks",
        sa.Column("approval_id", sa.String(length=64), nullable=False),
        sa.Column("team_id", sa.String(length=32), nullable=False),
        sa.Column("key_id", sa.String(length=64), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_at", WHEN, nullable=False),
        sa.Column("claimed_until", WHEN, nullable=True),
        sa.Column("delivered_at", WHEN, nullable=True),
        sa.Column("gave_up_at", WHEN, nullable=True),
        sa.Column("last_error", sa.String(length=200), nullable=True),
        sa.ForeignKeyConstraint(["approval_id"], ["approvals.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("approval_id"),
    )
    op.create_index(
        "ix_gateway_callbacks_owed",
        "gateway_callbacks",
        ["next_at"],
        postgresql_where=sa.text("delivered_at IS NULL AND gave_up_at IS NULL"),
    )
    op.create_table(
        "gateway_waiters",
        sa.Column("approval_id", sa.String(length=64), nullable=False),
        sa.Column("until", WHEN, nullable=False),
        sa.ForeignKeyConstraint(["approval_id"], ["approvals.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("approval_id"),
    )
    op.create_index("ix_gateway_waiters_until", "gateway_waiters", ["until"])
    op.create_table(
        "mcp_sessions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("team_id", sa.String(length=32), nullable=False),
        sa.Column("key_id", sa.String(length=64), nullable=False),
        sa.Column("client", sa.String(length=300), nullable=True),
        sa.Column("created_at", WHEN, nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_mcp_sessions_created_at", "mcp_sessions", ["created_at"])


def downgrade() -> None:
    op.drop_table("mcp_sessions")
    op.drop_table("gateway_waiters")
    op.drop_table("gateway_callbacks")
