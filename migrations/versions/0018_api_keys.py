"""api_keys: the gateway's API keys (hashed), per workspace and owner

Revision ID: 0018
Revises: 0014
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import storage.models

revision: str = "0018"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("team_id", sa.String(length=32), nullable=False),
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("callback_secret", sa.String(length=64), nullable=False),
        sa.Column("created_at", storage.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column("last_used_at", storage.models.UTCDateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", storage.models.UTCDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("digest"),
    )
    op.create_index("ix_api_keys_owner", "api_keys", ["team_id", "user_id", "name"])
    # One live key per owner and name: a name says which key, when listing or revoking.
    op.create_index(
        "ux_api_keys_live_name",
        "api_keys",
        ["team_id", "user_id", "name"],
        unique=True,
        postgresql_where=sa.text("revoked_at IS NULL"),
        sqlite_where=sa.text("revoked_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_table("api_keys")
