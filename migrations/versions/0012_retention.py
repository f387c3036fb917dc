"""retention: when each conversation was last active, indexes for the bounded deletes, and
an append-only audit trail that only the retention job may trim

Conversations that exist at the upgrade count as active at the upgrade: nothing is deleted
until RETENTION_DAYS after it (their real last activity is not recorded anywhere).

Revision ID: 0012
Revises: 0011
"""

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

import storage.models

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = (
    ("ix_agent_snapshots_created", "agent_snapshots", ["created_at"]),
    ("ix_conversations_last_active", "conversations", ["last_active_at"]),
    ("ix_conversations_snapshot", "conversations", ["snapshot_id"]),
    ("ix_turns_conversation", "turns", ["conversation_id"]),
    ("ix_turns_session", "turns", ["session_id"]),
    ("ix_audit_at", "audit_events", ["at", "id"]),
    ("ix_seen_events_received", "seen_events", ["received_at"]),
)

# PostgreSQL: UPDATE, DELETE and TRUNCATE of audit rows raise, except a DELETE of rows older
# than what greenlight_purge_audit set for its own transaction (set_config(..., true) lasts
# until the transaction ends). Anyone who can run SQL can set that too: this stops accidents
# and application bugs, not a database owner.
PG_UPGRADE = (
    """
CREATE FUNCTION greenlight_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    purge_before text := current_setting('greenlight.audit_purge_before', true);
BEGIN
    IF TG_OP = 'DELETE' AND coalesce(purge_before, '') <> '' THEN
        IF OLD.at < purge_before::timestamptz THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION 'audit_events is append-only: % refused', TG_OP
        USING HINT = 'old rows are removed by greenlight_purge_audit(before, batch)';
END
$$
""",
    """
CREATE TRIGGER audit_events_append_only BEFORE UPDATE OR DELETE ON audit_events
FOR EACH ROW EXECUTE FUNCTION greenlight_audit_append_only()
""",
    """
CREATE TRIGGER audit_events_no_truncate BEFORE TRUNCATE ON audit_events
FOR EACH STATEMENT EXECUTE FUNCTION greenlight_audit_append_only()
""",
    """
CREATE FUNCTION greenlight_purge_audit(before timestamptz, batch integer)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    deleted integer;
BEGIN
    PERFORM set_config('greenlight.audit_purge_before', before::text, true);
    DELETE FROM audit_events WHERE id IN (
        SELECT id FROM audit_events WHERE at < before ORDER BY at, id LIMIT batch
    );
    GET DIAGNOSTICS deleted = ROW_COUNT;
    PERFORM set_config('greenlight.audit_purge_before', '', true);
    RETURN deleted;
END
$$
""",
)
PG_DOWNGRADE = (
    "DROP FUNCTION greenlight_purge_audit(timestamptz, integer)",
    "DROP TRIGGER audit_events_no_truncate ON audit_events",
    "DROP TRIGGER audit_events_append_only ON audit_events",
    "DROP FUNCTION greenlight_audit_append_only()",
)


def upgrade() -> None:
    # A constant default fills the existing rows, and goes again: inserts give one.
    upgraded = datetime.now(UTC).isoformat()
    op.add_column(
        "conversations",
        sa.Column(
            "last_active_at",
            storage.models.UTCDateTime(timezone=True),
            nullable=False,
            server_default=sa.text(f"'{upgraded}'"),
        ),
    )
    op.alter_column("conversations", "last_active_at", server_default=None)
    for name, table, columns in INDEXES:
        op.create_index(name, table, columns)
    op.create_table(  # SQLite's purge permit, which PostgreSQL never used; 0017 drops it
        "audit_purges",
        sa.Column("before", storage.models.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("before"),
    )
    for statement in PG_UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    for statement in PG_DOWNGRADE:
        op.execute(statement)
    op.drop_table("audit_purges")
    for name, table, _ in reversed(INDEXES):
        op.drop_index(name, table_name=table)
    op.drop_column("conversations", "last_active_at")
