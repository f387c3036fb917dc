"""Follow-ups: the sweep, the cards' outboxes, reminders and escalations.

The sweep expires overdue requests, takes over cards (and escalated cards) whose post
failed or was cut off, resumes turns nobody is resuming (after a crash) and deletes what
is past retention.

Each is recorded as done before the transport does it (EXPIRE, RETRY_CARD,
RETRY_ESCALATION, REMIND, ESCALATE, a CLAIM): whichever replica gets there first does it,
once.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from agent.eligibility import for_version
from agent.observer import Watch
from agent.outcomes import Due, Owed, SweepReport, TextSink
from agent.policy import PolicyService
from agent.turns import Turns
from storage.approval_store import ApprovalStore
from storage.domain import Approval
from storage.lifecycle import ESCALATE, REMIND, IllegalTransition, Transition
from storage.retention import Purged, Retention

log = logging.getLogger(__name__)

CARD_GRACE = timedelta(minutes=1)


@dataclass(frozen=True)
class FollowUps:
    """What falls due after a request is made, and where its card got to."""

    store: ApprovalStore
    policies: PolicyService
    turns: Turns  # the sweep resumes turns nobody is resuming
    retention: Retention
    watch: Watch
    clock: Callable[[], datetime]

    async def sweep(
        self, team_id: str | None = None, on_text: TextSink | None = None
    ) -> SweepReport:
        """Expire overdue approvals, resume turns nobody is resuming (after a crash), report
        cards never posted, and delete what is past retention (storage/retention.py).

        Runs over every workspace unless `team_id` narrows it to one (then nothing is
        deleted: retention is the database's, not a workspace's).
        """
        now = self.clock()
        expired = []
        for approval in await self.store.follow_ups.overdue(now=now, team_id=team_id):
            with contextlib.suppress(IllegalTransition):  # decided meanwhile, or by a replica
                expired.append(await self.store.decisions.expire(approval, now=now))
                self.watch.settled(expired[-1])
        uncarded = await self._stale_cards(now, team_id, escalated=False)
        unescalated = await self._stale_cards(now, team_id, escalated=True)
        turn_ids = await self.store.turns.recoverable(now=now, team_id=team_id)
        resumed = [r for t in turn_ids if (r := await self.turns.resume(t, on_text)) is not None]
        purged = Purged()
        if team_id is None:
            purged = await self.retention.purge(now=now)
        return SweepReport(
            tuple(expired), tuple(resumed), uncarded, purged, unescalated=unescalated
        )

    async def _stale_cards(
        self, now: datetime, team_id: str | None, *, escalated: bool
    ) -> tuple[Approval, ...]:
        """Cards (`escalated`: escalated cards) whose post failed or a process died making
        (a live one posts within moments), now this sweep's (RETRY_CARD, RETRY_ESCALATION)."""
        stale, taken = now - CARD_GRACE, []
        outbox = self.store.follow_ups
        for approval in await outbox.stale_cards(stale=stale, team_id=team_id, escalated=escalated):
            retry = outbox.retry_escalation if escalated else outbox.retry_card
            with contextlib.suppress(IllegalTransition):  # another sweep took it
                taken.append(await retry(approval, now=now, stale=stale))
        return tuple(taken)

    async def due(self, team_id: str | None = None) -> Owed:
        """Reminders and escalations due now, each recorded as done (REMIND, ESCALATE)
        before the transport does it: whichever replica gets there first does it, once."""
        now = self.clock()
        done: dict[Transition, list[Due]] = {REMIND: [], ESCALATE: []}
        for transition, owed in done.items():
            for approval in await self.store.follow_ups.due(transition, now=now, team_id=team_id):
                try:
                    taken = await self.store.follow_ups.follow_up(transition, approval, now=now)
                except IllegalTransition:  # another replica did it, or it was decided
                    continue
                base = await self.policies.get(taken.thread.team_id, taken.request.tool)
                owed.append(Due(taken, for_version(base, taken)))
        return Owed(tuple(done[REMIND]), tuple(done[ESCALATE]))

    async def card_posted(
        self, approval: Approval, *, ts: str, escalated: bool = False
    ) -> Approval | None:
        """The card (`escalated`: the escalated card) is out, at `ts`; None when its outbox
        had already moved on (another attempt recorded its own card, say)."""
        outbox = self.store.follow_ups
        posted = outbox.escalation_posted if escalated else outbox.card_posted
        try:
            return await posted(approval, ts=ts)
        except IllegalTransition as refused:
            _not_taken("posted", approval, refused)
            return None

    async def card_failed(self, approval: Approval, *, escalated: bool = False) -> Approval | None:
        """Slack refused the card (`escalated`: the escalated card) for good; for the card,
        the transport tells the requester."""
        outbox = self.store.follow_ups
        failed = outbox.escalation_failed if escalated else outbox.card_failed
        try:
            return await failed(approval, now=self.clock())
        except IllegalTransition as refused:
            _not_taken("failed", approval, refused)
            return None


def _not_taken(what: str, approval: Approval, refused: IllegalTransition) -> None:
    log.warning(
        "card of approval %s %s, but: %s",
        approval.id,
        what,
        refused,
        extra={"approval_id": approval.id},
    )
