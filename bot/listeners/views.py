"""Modal submissions: a denial with its optional reason, the answer to a question, an
approval with changes, and an approval with a note."""

from __future__ import annotations

import json
from typing import Any

from slack_bolt.async_app import AsyncAck, AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

from agent.outcomes import DecisionRefused, InvalidAnswer
from bot import forms, modals, refusals
from bot.deps import Deps
from bot.listeners.shared import Interaction, facts_for, in_modal, obj, seen_in, settled

MAX_REASON = 500


def metadata(body: dict[str, Any]) -> dict[str, Any]:
    """The modal's private_metadata (only we write it), as an object."""
    try:
        return obj(json.loads(str(obj(body.get("view")).get("private_metadata") or "{}")))
    except ValueError:
        return {}


def submitted(
    body: dict[str, Any], block: str = "reason", action: str = "reason"
) -> tuple[Interaction, str | None] | None:
    """The Interaction of a view_submission, and the free text of its input `block` (a
    denial's reason, an approval's note; None when empty); or None."""
    opened = in_modal(body)
    if opened is None:
        return None
    return opened, text_in(body, block, action)


def text_in(body: dict[str, Any], block: str, action: str) -> str | None:
    """A modal's free-text input, trimmed; None when empty. PostgreSQL stores no NUL."""
    field = obj(obj(obj(obj(body.get("view")).get("state")).get("values")).get(block))
    text = obj(field.get(action)).get("value")
    if not isinstance(text, str):
        return None
    return text.replace("\x00", "").strip()[:MAX_REASON] or None


async def on_deny_submitted(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, deps: Deps
) -> None:
    parsed = submitted(body)
    if parsed is None:
        await ack()
        return
    asked, reason = parsed
    # A modal is in no channel: who may decide is asked of Slack again, membership included.
    facts = facts_for(deps, client, asked, home=True)
    seen = seen_in(metadata(body).get("seen"))
    try:
        decided = await deps.workflow.decisions.decide(
            asked.team,
            asked.approval_id,
            asked.user,
            approve=False,
            reason=reason,
            facts=facts,
            seen=seen,
            resume_here=True,  # `settled` resumes it
        )
    except DecisionRefused as refusal:
        text = refusals.refusal_text(refusal.reason, refusal.approval)
        await ack(response_action="errors", errors={"reason": text})
        if refusal.reason in ("already_decided", "changed") and refusal.approval is not None:
            await deps.delivery.refresh_card(client, refusal.approval)  # the state changed
        return
    await ack()
    await settled(deps, client, decided)


async def on_note_submitted(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, deps: Deps
) -> None:
    """Approve with note: the version the modal showed, approved with the approver's words
    (refused, shown in the modal, when the note is missing where the policy needs one, or
    the request changed or was decided since)."""
    parsed = submitted(body, "note", "note")
    if parsed is None:
        await ack()
        return
    asked, note = parsed
    facts = facts_for(deps, client, asked, home=True)  # asked of Slack again
    seen = seen_in(metadata(body).get("seen"))
    try:
        decided = await deps.workflow.decisions.decide(
            asked.team,
            asked.approval_id,
            asked.user,
            approve=True,
            reason=note,
            facts=facts,
            seen=seen,
            resume_here=True,  # `settled` resumes it
        )
    except DecisionRefused as refusal:
        text = refusals.refusal_text(refusal.reason, refusal.approval)
        if refusal.reason == "note_required":
            text = "A note is needed: the policy for this tool asks for one with an approval."
        await ack(response_action="errors", errors={"note": text})
        if refusal.reason in ("already_decided", "changed") and refusal.approval is not None:
            await deps.delivery.refresh_card(client, refusal.approval)  # the state changed
        return
    await ack()
    await settled(deps, client, decided)


async def on_answer_submitted(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, deps: Deps
) -> None:
    """The answer to a question: free text, or its tool's form; checked, then recorded once.
    Whatever is wrong is shown in the modal, next to the input it concerns."""
    opened = in_modal(body)
    approval = (
        await deps.workflow.reads.approval(opened.team, opened.approval_id) if opened else None
    )
    if opened is None or approval is None:
        await ack()
        return
    state = obj(obj(obj(body.get("view")).get("state")).get("values"))
    form = deps.workflow.runtime.question_form(approval.request.tool)
    answer: Any
    if form is not None:
        answer, errors = forms.form_values(form, state)
        first = next(iter(forms.properties(form)), "answer")
    else:
        text = obj(obj(state.get("answer")).get("value")).get("value")
        answer, errors, first = str(text or "").replace("\x00", "").strip(), {}, "answer"
    if errors:
        await ack(response_action="errors", errors=errors)
        return
    facts = facts_for(deps, client, opened, home=True)  # asked of Slack again
    try:
        decided = await deps.workflow.decisions.answer(
            opened.team, opened.approval_id, opened.user, answer, facts=facts
        )
    except InvalidAnswer as invalid:
        shown = {
            k if k in forms.properties(form or {}) else first: v for k, v in invalid.errors.items()
        }
        await ack(response_action="errors", errors=shown)
        return
    except DecisionRefused as refusal:
        text = refusals.refusal_text(refusal.reason, refusal.approval)
        await ack(response_action="errors", errors={first: text})
        if refusal.reason == "already_decided" and refusal.approval is not None:
            await deps.delivery.refresh_card(client, refusal.approval)  # the state changed
        return
    await ack()
    await settled(deps, client, decided)


async def on_edit_submitted(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, deps: Deps
) -> None:
    """Edit & approve: the changed input, typed and checked against the tool's schema, then
    approved once, if it is still the version the modal showed (fields left as they were
    keep their values exactly). A modal of an older version is shown the current one."""
    opened = in_modal(body)
    approval = (
        await deps.workflow.reads.approval(opened.team, opened.approval_id) if opened else None
    )
    form = (
        deps.workflow.runtime.edit_form(approval.request.tool, approval.current.input)
        if approval
        else None
    )
    if opened is None or approval is None or form is None:
        await ack()
        return
    view = obj(body.get("view"))
    state = obj(obj(view.get("state")).get("values"))
    meta = metadata(body)
    seen = seen_in(meta.get("seen"))
    changed, errors = forms.form_values(form, state, approval.current.input)
    if errors and seen == approval.version:
        await ack(response_action="errors", errors=errors)
        return
    facts = facts_for(deps, client, opened, home=True)  # asked of Slack again
    fields = forms.properties(form)
    first = next(iter(fields), "")
    note = text_in(body, modals.EDIT_NOTE, "note")
    try:
        decided = await deps.workflow.decisions.approve_with_changes(
            opened.team,
            opened.approval_id,
            opened.user,
            changed,
            facts=facts,
            seen=seen,
            note=note,
        )
    except InvalidAnswer as invalid:
        shown = {
            k.split(".")[0] if k.split(".")[0] in fields else first: v
            for k, v in invalid.errors.items()
        }
        await ack(response_action="errors", errors=shown)
        return
    except DecisionRefused as refusal:
        await _edit_refused(ack, deps, client, refusal, form=form, meta=meta, first=first)
        return
    await ack()
    await settled(deps, client, decided)


async def _edit_refused(
    ack: AsyncAck,
    deps: Deps,
    client: AsyncWebClient,
    refusal: DecisionRefused,
    *,
    form: dict[str, Any],
    meta: dict[str, Any],
    first: str,
) -> None:
    """An Edit & approve that changed nothing: the modal shows the current version (it was
    changed since), or why next to the field it concerns."""
    text = refusals.refusal_text(refusal.reason, refusal.approval)
    now = refusal.approval
    if refusal.reason == "changed" and now is not None and now.decision is None:
        # The current version, in place of the one this modal showed.
        update = modals.edit_modal(now, forms.form_blocks(form, now.current.input), note=text)
        update["private_metadata"] = json.dumps(meta | {"seen": now.version})
        await ack(response_action="update", view=update)
    else:
        where = modals.EDIT_NOTE if refusal.reason == "note_required" else first
        await ack(response_action="errors", errors={where: text})
    if refusal.reason in ("already_decided", "changed") and now is not None:
        await deps.delivery.refresh_card(client, now)  # the state changed


def register(app: AsyncApp) -> None:
    app.view("deny_reason")(on_deny_submitted)
    app.view("answer")(on_answer_submitted)
    app.view("edit_approve")(on_edit_submitted)
    app.view("approve_note")(on_note_submitted)
