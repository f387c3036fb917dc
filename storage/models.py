"""Tables: agent snapshots and messages, conversations, paused turns, approvals, policy, audit.

Every row carries the Slack team id so one database can serve several workspaces.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy import JSON, DateTime, Enum, ForeignKey, Index, Integer, String, Text
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from storage.domain import (
    ApprovalState,
    CardState,
    EscalationState,
    ExecutionState,
    ReminderState,
    StandingState,
    TurnState,
)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware timestamps only: a naive one would be read as the server's local time."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime: pass an aware UTC timestamp")
        return value


class CleanText(TypeDecorator[str]):
    """Text with its NUL characters taken out: PostgreSQL refuses them in text, and a
    tool's preview or a person's reason must not fail the write that records it."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return value.replace("\x00", "") if value is not None else None


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dict[str, Any]: JSON,
        list[Any]: JSON,
        datetime: UTCDateTime,
    }


def _enum(cls: type[enum.Enum]) -> Enum:
    return Enum(cls, native_enum=False, length=16, values_callable=lambda e: [m.value for m in e])


class SnapshotRow(Base):
    """One Genkit snapshot without its messages; `meta` is the rest of it, verbatim."""

    __tablename__ = "agent_snapshots"

    team_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    snapshot_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    session_id: Mapped[str | None] = mapped_column(String(128))
    parent_id: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[str] = mapped_column(String(40))
    meta: Mapped[dict[str, Any]]
    # None when the snapshot has no message list at all (not the same as an empty one).
    message_count: Mapped[int | None] = mapped_column(Integer)
    # Leading messages shared with the parent and stored there, not here.
    inherited: Mapped[int] = mapped_column(Integer, default=0)
    digest: Mapped[str] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer, default=1)

    # Session first: with team_id leading, PostgreSQL without statistics yet (a new table)
    # took this index for primary-key lookups and filtered every row of the team.
    __table_args__ = (
        Index("ix_agent_snapshots_session", "session_id", "team_id", "created_at"),
        Index("ix_agent_snapshots_created", "created_at"),  # retention finds old sessions
    )


class MessageRow(Base):
    """A message stored once, under the snapshot that first had it."""

    __tablename__ = "agent_messages"

    team_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    snapshot_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[dict[str, Any]]


class ConversationRow(Base):
    """A Slack thread bound to one agent session."""

    __tablename__ = "conversations"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    team_id: Mapped[str] = mapped_column(String(32))
    channel_id: Mapped[str] = mapped_column(String(32))
    thread_ts: Mapped[str] = mapped_column(String(32))
    # The snapshot the next message continues from: the last turn that finished well, so a
    # turn that failed mid-way never leaves the thread stuck on dangling tool requests.
    snapshot_id: Mapped[str | None] = mapped_column(String(128))
    busy_until: Mapped[datetime | None]
    created_at: Mapped[datetime]
    # When a message last took the thread: retention keeps the conversation until
    # RETENTION_DAYS after it (storage/retention.py).
    last_active_at: Mapped[datetime]
    # Every human whose message ran a turn here: none of them may approve what it leads to.
    participants: Mapped[list[Any]] = mapped_column(server_default=sa.text("'[]'"))

    __table_args__ = (
        Index("ux_conversations_thread", "team_id", "channel_id", "thread_ts", unique=True),
        Index("ix_conversations_last_active", "last_active_at"),
        Index("ix_conversations_snapshot", "snapshot_id"),  # is a session still in use?
    )


class TurnRow(Base):
    """A turn paused on interrupts, from the interrupt to its resume (storage/lifecycle.py)."""

    __tablename__ = "turns"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    team_id: Mapped[str] = mapped_column(String(32))
    conversation_id: Mapped[str] = mapped_column(ForeignKey("conversations.id"))
    session_id: Mapped[str] = mapped_column(String(128))
    snapshot_id: Mapped[str] = mapped_column(String(128))
    state: Mapped[TurnState] = mapped_column(_enum(TurnState))
    lease_until: Mapped[datetime | None]
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]

    __table_args__ = (
        Index("ix_turns_state", "state", "lease_until"),
        Index("ix_turns_conversation", "conversation_id"),
        Index("ix_turns_session", "session_id"),
    )


class ApprovalRow(Base):
    """One interrupted tool call: request, decision, execution and card (storage/lifecycle.py)."""

    __tablename__ = "approvals"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    team_id: Mapped[str] = mapped_column(String(32))
    turn_id: Mapped[str] = mapped_column(ForeignKey("turns.id"), index=True)
    tool: Mapped[str] = mapped_column(String(128))
    ref: Mapped[str] = mapped_column(String(128))
    input: Mapped[dict[str, Any]]
    requester: Mapped[str] = mapped_column(String(32))
    requested_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    why: Mapped[str] = mapped_column(CleanText)
    # The conversation's participants when the call was made (the requester among them).
    participants: Mapped[list[Any]] = mapped_column(server_default=sa.text("'[]'"))
    preview: Mapped[str | None] = mapped_column(CleanText)  # see storage/lifecycle.py Request
    context: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # what led to the call
    # A question's: whom it asks (requester, approvers; NULL for an approval), the answer.
    asks: Mapped[str | None] = mapped_column(String(16))
    answer: Mapped[Any | None] = mapped_column(JSON)
    # Approved with changes: the input the call runs with, and who changed it when.
    edited_input: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    edited_by: Mapped[str | None] = mapped_column(String(32))
    edited_at: Mapped[datetime | None]
    edited_preview: Mapped[str | None] = mapped_column(Text)  # the preview of the edited call
    # The call's current version: 1 as the agent asked it, the next for each edit. What an
    # approver saw is named by it; a decision on another version changes nothing.
    version: Mapped[int] = mapped_column(Integer, server_default="1")
    # The model's own arguments (any JSON value), when the tool's schema coerced them into
    # `input` or they are not an object (a restart of the call must carry them exactly);
    # NULL when they are `input`.
    asked_input: Mapped[Any] = mapped_column(JSON, nullable=True)
    status: Mapped[ApprovalState] = mapped_column(_enum(ApprovalState))
    decided_by: Mapped[str | None] = mapped_column(String(32))
    decided_at: Mapped[datetime | None]
    reason: Mapped[str | None] = mapped_column(CleanText)
    execution: Mapped[ExecutionState] = mapped_column(_enum(ExecutionState))
    output: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    card_channel: Mapped[str | None] = mapped_column(String(32))
    card_ts: Mapped[str | None] = mapped_column(String(32))
    card_state: Mapped[CardState] = mapped_column(_enum(CardState), server_default="posting")
    card_attempted_at: Mapped[datetime | None]
    approvals_needed: Mapped[int] = mapped_column(Integer, server_default="1")  # a quorum
    votes: Mapped[int] = mapped_column(Integer, server_default="0")  # approvals so far
    remind_at: Mapped[datetime | None]
    reminder: Mapped[ReminderState] = mapped_column(_enum(ReminderState), server_default="none")
    escalate_at: Mapped[datetime | None]
    escalation: Mapped[EscalationState] = mapped_column(
        _enum(EscalationState), server_default="none"
    )
    escalation_channel: Mapped[str | None] = mapped_column(String(32))
    escalation_ts: Mapped[str | None] = mapped_column(String(32))
    # The escalated card's outbox, as the card's: posting before the post, posted once out
    # (at escalation_ts), failed when Slack refused it for good; NULL: not escalated.
    escalation_card: Mapped[CardState | None] = mapped_column(_enum(CardState), nullable=True)
    escalation_attempted_at: Mapped[datetime | None]
    # What its policy asked when it was made: a note with an approval, the standing
    # approval a card may offer (seconds; NULL: none). See storage/domain.py Request.
    note_required: Mapped[bool] = mapped_column(server_default=sa.false())
    standing_offer_seconds: Mapped[int | None] = mapped_column(Integer)
    # The standing approval granted with it (storage/lifecycle.py GRANT, USE, REVOKE).
    standing: Mapped[StandingState] = mapped_column(_enum(StandingState), server_default="none")
    standing_until: Mapped[datetime | None]
    standing_rule: Mapped[str | None] = mapped_column(String(64))
    standing_uses: Mapped[int] = mapped_column(Integer, server_default="0")
    standing_revoked_by: Mapped[str | None] = mapped_column(String(32))
    standing_revoked_at: Mapped[datetime | None]
    # A call approved by a standing approval: that approval's id.
    under: Mapped[str | None] = mapped_column(String(64))
    # Redacted fields (storage/redaction.py): the keys its policy hid when it was made, and
    # their values, [{"path": [...], "value": ...}], for the call that runs and nothing
    # else (`input`, `edited_input` and the audit trail hold only their masks).
    redact: Mapped[list[Any]] = mapped_column(server_default=sa.text("'[]'"))
    secrets: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)

    __table_args__ = (
        Index("ix_approvals_status_expiry", "status", "expires_at"),
        Index("ix_approvals_follow_ups", "status", "remind_at", "escalate_at"),
        Index("ix_approvals_requester", "team_id", "requester", "tool", "requested_at"),
    )


class VoteRow(Base):
    """One person's approval of a request that needs several (a quorum)."""

    __tablename__ = "approval_votes"

    approval_id: Mapped[str] = mapped_column(ForeignKey("approvals.id"), primary_key=True)
    voter: Mapped[str] = mapped_column(String(32), primary_key=True)
    at: Mapped[datetime]
    version: Mapped[int] = mapped_column(Integer, server_default="1")  # what it approved
    note: Mapped[str | None] = mapped_column(CleanText)  # the voter's note, if any


class PolicyRow(Base):
    """An admin's settings for one tool; absent fields fall back to configuration."""

    __tablename__ = "tool_policies"

    team_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tool: Mapped[str] = mapped_column(String(128), primary_key=True)
    allowed: Mapped[bool] = mapped_column(default=False)
    channel: Mapped[str | None] = mapped_column(String(32))
    approver_users: Mapped[list[Any]] = mapped_column(JSON, default=list)
    approver_groups: Mapped[list[Any]] = mapped_column(JSON, default=list)
    timeout_seconds: Mapped[int | None] = mapped_column(Integer)
    approvals: Mapped[int | None] = mapped_column(Integer)  # distinct approvers needed
    rules: Mapped[list[Any]] = mapped_column(server_default=sa.text("'[]'"))  # see POLICY_FILE
    remind_after_seconds: Mapped[int | None] = mapped_column(Integer)
    escalate_after_seconds: Mapped[int | None] = mapped_column(Integer)
    escalate_to: Mapped[str | None] = mapped_column(String(32))
    escalate_approvers: Mapped[list[Any]] = mapped_column(server_default=sa.text("'[]'"))
    note: Mapped[str | None] = mapped_column(String(16))  # "required": Approve takes a note
    standing_seconds: Mapped[int | None] = mapped_column(Integer)  # a standing approval's
    redact: Mapped[list[Any]] = mapped_column(server_default=sa.text("'[]'"))  # hidden keys
    updated_at: Mapped[datetime]
    updated_by: Mapped[str] = mapped_column(String(32))


class AuditRow(Base):
    """Append-only trail: requests, decisions, expiries, executions, policy changes."""

    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    team_id: Mapped[str] = mapped_column(String(32))
    at: Mapped[datetime]
    actor: Mapped[str] = mapped_column(String(32))
    action: Mapped[str] = mapped_column(String(32))
    tool: Mapped[str | None] = mapped_column(String(128))
    approval_id: Mapped[str | None] = mapped_column(String(64))
    detail: Mapped[dict[str, Any]]

    __table_args__ = (
        Index("ix_audit_team_at", "team_id", "at"),
        Index("ix_audit_at", "at", "id"),  # retention and `greenlight audit export`
    )


class SeenEventRow(Base):
    """Slack event ids already handled, so a retried delivery runs nothing twice."""

    __tablename__ = "seen_events"

    event_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    received_at: Mapped[datetime]

    __table_args__ = (Index("ix_seen_events_received", "received_at"),)


class MessageCountRow(Base):
    """Messages per workspace and person per minute (user_id "" counts the workspace), so
    that the message limits hold across replicas. Rows of past minutes are swept away."""

    __tablename__ = "message_counts"

    team_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    minute: Mapped[datetime] = mapped_column(primary_key=True)
    count: Mapped[int] = mapped_column(Integer)
    told: Mapped[bool] = mapped_column(default=False)  # the "wait" reply is out


class PersonRow(Base):
    """What Slack says of a person that decides what they may do here (a guest, an admin,
    their home organisation), shared by every replica (bot/people.py): written by
    users.list, Slack's user_change and team_join events, and users.info. `checked_at`:
    when Slack last said it, so a row nobody refreshed for long is asked again."""

    __tablename__ = "people"

    team_id: Mapped[str] = mapped_column(String(32), primary_key=True)  # who asked Slack
    user_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    facts: Mapped[dict[str, Any]]
    checked_at: Mapped[datetime]


class PeopleSyncRow(Base):
    """When a workspace's people directory is next due a users.list sync: the replica that
    claims it first (storage/people.py `claim_sync`) syncs, the others leave it."""

    __tablename__ = "people_syncs"

    team_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    due_at: Mapped[datetime]


class ApiKeyRow(Base):
    """An API key of the gateway (gateway/): it acts as the Slack user who owns it, in one
    workspace. Only the key's SHA-256 is kept; the callback signing secret is kept as is
    (Greenlight signs with it), shown once with the key."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    team_id: Mapped[str] = mapped_column(String(32))
    user_id: Mapped[str] = mapped_column(String(32))
    name: Mapped[str] = mapped_column(String(64))
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    callback_secret: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime]
    last_used_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]

    __table_args__ = (
        Index("ix_api_keys_owner", "team_id", "user_id", "name"),
        # One live key per owner and name: a name says which key, when listing or revoking.
        Index(
            "ux_api_keys_live_name",
            "team_id",
            "user_id",
            "name",
            unique=True,
            postgresql_where=sa.text("revoked_at IS NULL"),
        ),
    )


class GatewayCallbackRow(Base):
    """A `callback_url` owed a POST of an approvals-API request's final status: due once the
    request is decided, claimed by one replica at a time (`claimed_until`), retried with
    backoff (`next_at`) until delivered or given up."""

    __tablename__ = "gateway_callbacks"

    approval_id: Mapped[str] = mapped_column(
        ForeignKey("approvals.id", ondelete="CASCADE"), primary_key=True
    )
    team_id: Mapped[str] = mapped_column(String(32))
    key_id: Mapped[str] = mapped_column(String(64))  # whose callback secret signs it
    url: Mapped[str] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_at: Mapped[datetime]
    claimed_until: Mapped[datetime | None]
    delivered_at: Mapped[datetime | None]
    gave_up_at: Mapped[datetime | None]
    last_error: Mapped[str | None] = mapped_column(String(200))

    __table_args__ = (
        Index(
            "ix_gateway_callbacks_owed",
            "next_at",
            postgresql_where=sa.text("delivered_at IS NULL AND gave_up_at IS NULL"),
        ),
    )


class GatewayWaiterRow(Base):
    """An MCP caller waiting for a decision, held by its process's lease: a lease that ran out
    (the process died) means the caller is gone, and the card says so."""

    __tablename__ = "gateway_waiters"

    approval_id: Mapped[str] = mapped_column(
        ForeignKey("approvals.id", ondelete="CASCADE"), primary_key=True
    )
    until: Mapped[datetime] = mapped_column(index=True)


class McpSessionRow(Base):
    """An MCP session's facts, from its initialize request, so that any replica serves any
    request of it: whose key opened it and which client (name and version) it is."""

    __tablename__ = "mcp_sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    team_id: Mapped[str] = mapped_column(String(32))
    key_id: Mapped[str] = mapped_column(String(64))
    client: Mapped[str | None] = mapped_column(String(300))
    created_at: Mapped[datetime] = mapped_column(index=True)
