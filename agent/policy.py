"""Tool policy: which calls run freely, where approvals go, who may decide, how many must,
how long they wait.

A tool's policy may carry rules (from POLICY_FILE): CEL expressions over the call's `args`,
`tool` and `requester`, the first that matches adjusting the policy for that call. A rule
that cannot be evaluated gives the strictest outcome any of the tool's rules could (the most
approvals, their route), and says so.

The rules live here; storage keeps the rows and the Slack layer supplies facts about people.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from agent.policy_file import PolicyFile, compiled
from storage.domain import History, Refusal
from storage.policies import PolicyStore
from storage.policy_spec import Rule, StoredPolicy, ToolPolicy, split_principals

if TYPE_CHECKING:
    import cel

POLICY_FILE_ACTOR = "policy-file"  # who the audit trail says changed what the file sets
HISTORY_DAYS = 30  # how far back a card counts the requester's earlier requests


class UnknownTool(ValueError):
    """A policy command named a tool the agent does not have."""

    def __init__(self, tool: str, known: Collection[str]) -> None:
        super().__init__(f"unknown tool {tool!r}; known tools: {', '.join(sorted(known))}")
        self.tool = tool
        self.known = sorted(known)


@dataclass(frozen=True)
class PolicyDefaults:
    """Defaults for tools nobody configured: APPROVER_CHANNEL, APPROVAL_TIMEOUT_SECONDS, and
    POLICY_FILE's `defaults`."""

    channel: str | None = None
    timeout: timedelta = timedelta(hours=24)
    approvals: int = 1
    # Tools that run freely until a policy says otherwise (the file tools' reads).
    allowed: frozenset[str] = frozenset()


def policy_defaults(
    file: PolicyFile | None, *, channel: str | None, timeout: timedelta
) -> PolicyDefaults:
    """The defaults in force: POLICY_FILE's `defaults`, else APPROVER_CHANNEL and
    APPROVAL_TIMEOUT_SECONDS (`timeout`); one approval."""
    given = file.defaults if file is not None else None
    return PolicyDefaults(
        channel=channel,
        timeout=(given.timeout if given else None) or timeout,
        approvals=(given.approvals if given else None) or 1,
    )


class RuleError(Exception):
    """A rule's expression could not be evaluated for this call."""


def matches(rule: Rule, call: cel.Context) -> bool:
    """Whether the call (its `args`, `tool` and `requester`) matches `rule`."""
    try:
        result = compiled(rule.when).execute(call)
    except Exception as exc:  # a missing field, a wrong type, a syntax error in a row
        raise RuleError(str(exc).splitlines()[0][:200]) from None
    if not isinstance(result, bool):
        raise RuleError(f"it gave {type(result).__name__}, not true or false")
    return result


@dataclass(frozen=True)
class Policy:
    tool: str
    allowed: bool
    channel: str | None
    approver_users: tuple[str, ...] = ()
    approver_groups: tuple[str, ...] = ()
    timeout: timedelta = timedelta(hours=24)
    approvals: int = 1  # distinct approvers needed
    rules: tuple[Rule, ...] = ()
    note: str | None = None  # which rule decided this call's policy, or could not
    matched: Rule | None = None  # the rule that decided this call's policy
    failed: Rule | None = None  # the rule that could not be evaluated for this call
    remind_after: timedelta | None = None
    escalate_after: timedelta | None = None
    escalate_to: str | None = None
    escalate_users: tuple[str, ...] = ()  # empty: the escalation channel's members
    escalate_groups: tuple[str, ...] = ()
    note_required: bool = False  # POLICY_FILE's `note: required`
    standing: timedelta | None = None  # POLICY_FILE's `standing`: what a card may offer
    redact: tuple[str, ...] = ()  # POLICY_FILE's `redact`: the input's keys nobody is shown

    @property
    def standing_offer(self) -> timedelta | None:
        """The standing approval a card of this call offers: the tool's `standing`, for a
        call one approver decides whose rules could all be read; never with a note (a
        note reaches the model, and its writer may approve nothing it asks next)."""
        if self.allowed or self.approvals > 1 or self.failed is not None or self.note_required:
            return None
        return self.standing

    @property
    def rule_key(self) -> str:
        """The rule that decided this call's policy, as a standing approval remembers it:
        "" for none, else a digest of the rule as written (a rule changed since is another
        rule, and covers nothing granted under the old one)."""
        if self.matched is None:
            return ""
        written = self.matched.model_dump_json(exclude_none=True)
        return hashlib.sha256(written.encode()).hexdigest()[:32]

    @property
    def names_approvers(self) -> bool:
        """Whether the policy names who decides; if not, the approver channel's members do."""
        return bool(self.approver_users or self.approver_groups)

    @property
    def why(self) -> str:
        """Why a call of this tool needs a human, shown on the card."""
        if self.names_approvers:
            base = f"{self.tool} is not on the allow-list; its policy names its approvers"
        else:
            base = (
                f"{self.tool} is not on the allow-list (default policy: every tool needs approval)"
            )
        if self.approvals > 1:
            base += f"; it needs {self.approvals} approvers"
        return f"{base}; {self.note}" if self.note else base

    def for_call(self, args: Any, requester: str, provenance: Any = None) -> Policy:
        """The policy of one call: the first rule it matches applied (no rule applies to a
        tool an admin allowed outright). A rule that cannot be evaluated stops there: the
        call gets the strictest outcome of the tool's rules, and `note` says which rule
        failed and why. `provenance`: where each
        argument came from (agent/context.py), for rules that ask."""
        if self.allowed or not self.rules:
            return replace(self, rules=())
        import cel  # only where rules are set (agent/policy_file.py, `compiled`)

        # Converted to CEL once for every rule: a twentieth of the cost of once per rule.
        call = cel.Context(
            {
                "args": args,
                "tool": self.tool,
                "requester": requester,
                "provenance": provenance or {},
            }
        )
        for number, rule in enumerate(self.rules, 1):
            try:
                hit = matches(rule, call)
            except RuleError as exc:
                return self._strictest(
                    f"{rule.label(number)} (`{rule.when}`) could not be evaluated ({exc})", rule
                )
            if hit:
                return self._applied(
                    rule, note=f"{rule.label(number)} matched: `{rule.when}`", matched=rule
                )
        return replace(self, rules=())

    def _applied(self, rule: Rule, *, note: str, matched: Rule | None = None) -> Policy:
        users, groups = (
            split_principals(rule.approvers)
            if rule.approvers is not None
            else (self.approver_users, self.approver_groups)
        )
        return replace(
            self,
            rules=(),
            allowed=self.allowed if rule.allow is None else rule.allow,
            approvals=rule.approvals or self.approvals,
            channel=rule.channel or self.channel,
            approver_users=users,
            approver_groups=groups,
            timeout=rule.timeout or self.timeout,
            note=note,
            matched=matched,
        )

    def _strictest(self, failed: str, rule: Rule) -> Policy:
        """A call a rule could not judge gets the strictest outcome any rule could give: the
        most approvals, with that rule's route, and never runs freely. A wrong type or a
        missing field must not be a way to fewer approvers (fail safe, not merely closed)."""
        most = max(self.rules, key=lambda r: r.approvals or self.approvals)
        if (most.approvals or self.approvals) <= self.approvals:
            return replace(
                self, rules=(), allowed=False, note=f"{failed}; it needs approval", failed=rule
            )
        strict = most.model_copy(update={"allow": False, "timeout": None})
        number = self.rules.index(most) + 1
        return replace(
            self._applied(strict, note=""),
            note=f"{failed}; the strictest rule applies ({most.label(number)}: "
            f"{strict.approvals or self.approvals} approvals)",
            failed=rule,
        )


@dataclass(frozen=True)
class ApproverFacts:
    """What the transport knows about the person deciding.

    `groups` are the user groups (among those the policy names) the person belongs to;
    `in_channel` says the decision was made in the tool's approver channel;
    `public_channel` that this channel is one anyone in the workspace may join.
    """

    groups: frozenset[str] = field(default_factory=frozenset)
    in_channel: bool = False
    public_channel: bool = False
    # The same for the escalation channel, once a request was escalated there.
    in_escalation_channel: bool = False
    public_escalation_channel: bool = False
    # A guest, or a person of another organisation (Slack Connect): never an approver.
    outsider: bool = False


def refusal(
    policy: Policy,
    *,
    requester: str,
    participants: Collection[str] = (),
    approver: str,
    facts: ApproverFacts,
    escalated: bool = False,
) -> Refusal | None:
    """Why `approver` may not decide (None when they may).

    Four eyes over the whole conversation: neither the requester nor anyone else whose
    message led to the call (`participants`) decides it. Then a policy that names approvers
    (users, user groups) is what decides; one that names nobody leaves it to the members of
    the approver channel, which must be private: anyone can join a public channel. Once a
    request is `escalated`, the escalation's approvers (or its private channel's members)
    may decide too.
    """
    if approver == requester:
        return "self_approval"
    if approver in participants:
        return "participant"
    if facts.outsider:
        return "outsider"
    why = _may_decide(
        approver,
        facts,
        users=policy.approver_users,
        groups=policy.approver_groups,
        in_channel=facts.in_channel,
        public=facts.public_channel,
    )
    if why is not None and escalated and policy.escalate_to is not None:
        also = _may_decide(
            approver,
            facts,
            users=policy.escalate_users,
            groups=policy.escalate_groups,
            in_channel=facts.in_escalation_channel,
            public=facts.public_escalation_channel,
        )
        return None if also is None else why
    return why


def _may_decide(
    approver: str,
    facts: ApproverFacts,
    *,
    users: tuple[str, ...],
    groups: tuple[str, ...],
    in_channel: bool,
    public: bool,
) -> Refusal | None:
    """Named approvers decide; if none are named, the members of a private channel."""
    if users or groups:
        return None if approver in users or facts.groups & set(groups) else "not_an_approver"
    if public:
        return "public_channel"
    return None if in_channel else "not_an_approver"


def effective(tool: str, stored: StoredPolicy | None, defaults: PolicyDefaults) -> Policy:
    """The policy a stored row gives `tool`, defaults applied (None: nobody configured it)."""
    if stored is None:
        return Policy(
            tool=tool,
            allowed=tool in defaults.allowed,
            channel=defaults.channel,
            timeout=defaults.timeout,
            approvals=defaults.approvals,
        )
    approver_users, approver_groups = split_principals(stored.approvers)
    escalate_users, escalate_groups = split_principals(stored.escalate_approvers)
    return Policy(
        tool=tool,
        allowed=stored.allowed,
        channel=stored.channel or defaults.channel,
        approver_users=approver_users,
        approver_groups=approver_groups,
        timeout=stored.timeout or defaults.timeout,
        approvals=stored.approvals or defaults.approvals,
        rules=stored.rules,
        remind_after=stored.remind_after,
        escalate_after=stored.escalate_after,
        escalate_to=stored.escalate_to,
        escalate_users=escalate_users,
        escalate_groups=escalate_groups,
        note_required=stored.note == "required",
        standing=stored.standing,
        redact=stored.redact,
    )


class PolicyService:
    """Reads policy at call time (so changes apply to the next call); changes are audited."""

    def __init__(
        self,
        store: PolicyStore,
        *,
        tools: Callable[[], Sequence[str]],
        defaults: PolicyDefaults,
        clock: Callable[[], datetime],
    ) -> None:
        self._store = store
        self._tools = tools
        self._defaults = defaults
        self._clock = clock
        self._extra: frozenset[str] = frozenset()
        self._prefixes: tuple[str, ...] = ()

    def also_knows(self, tools: Collection[str] = (), prefixes: tuple[str, ...] = ()) -> None:
        """Names policy may name besides the agent's tools: POLICY_FILE's `api_tools` (the
        approvals API's), and open families such as `prompt.` (Claude Code's tools, asked
        through the gateway's approval_prompt)."""
        self._extra = self._extra | frozenset(tools)
        self._prefixes = (*self._prefixes, *prefixes)

    def knows(self, tool: str) -> bool:
        """Whether policy may name `tool`."""
        return tool in self._tools() or tool in self._extra or tool.startswith(self._prefixes)

    def known_tools(self) -> list[str]:
        return sorted({*self._tools(), *self._extra})

    async def get(self, team_id: str, tool: str) -> Policy:
        """The tool's policy as stored now, defaults applied."""
        return self.of(tool, await self._store.get(team_id, tool))

    async def with_history(
        self, team_id: str, tool: str, requester: str
    ) -> tuple[Policy, History | None]:
        """`get`, and how `requester`'s requests of `tool` in the last HISTORY_DAYS ended,
        which its card shows, read together: a call that needs approval reads both. None
        where the stored row lets calls run freely (a rule may still ask: read it then)."""
        since = self._clock() - timedelta(days=HISTORY_DAYS)
        stored, history = await self._store.with_history(
            team_id, tool, requester, since=since, days=HISTORY_DAYS
        )
        return self.of(tool, stored), history

    def of(self, tool: str, stored: StoredPolicy | None) -> Policy:
        """The policy a stored row (read with something else) gives, defaults applied."""
        return effective(tool, stored, self._defaults)

    async def all(self, team_id: str) -> list[Policy]:
        stored = {p.tool: p for p in await self._store.all(team_id)}
        named = [t for t in stored if t.startswith(self._prefixes) and self._prefixes]
        tools = [*self.known_tools(), *sorted(set(named) - set(self.known_tools()))]
        return [effective(t, stored.get(t), self._defaults) for t in tools]

    async def apply_file(
        self, team_id: str, file: PolicyFile, only: Collection[str] | None = None
    ) -> list[str]:
        """Make each tool POLICY_FILE names have the policy the file gives it, audited as
        the policy file's change; returns the tools it changed. Admins' later changes
        apply until the next start. `only`: just these tools (an MCP server's, as they
        join), leaving the others as admins may have changed them since."""
        changed = []
        known = self.known_tools()
        named = [t for t in [*file.allow, *file.tools] if t not in known and self.knows(t)]
        for tool in [*known, *dict.fromkeys(named)]:
            if only is not None and tool not in only:
                continue
            if (wanted := from_file(tool, file)) is None:
                continue
            current = await self._store.get(team_id, tool) or StoredPolicy(tool=tool)
            sets = wanted.model_fields_set - {"tool"}  # the fields the file sets
            changes = {k: getattr(wanted, k) for k in sets}
            changes = {k: v for k, v in changes.items() if getattr(current, k) != v}
            if changes:
                await self.change(team_id, tool, by=POLICY_FILE_ACTOR, **changes)
                changed.append(tool)
        return changed

    async def change(self, team_id: str, tool: str, *, by: str, **changes: object) -> Policy:
        """Apply an admin's change; unknown tools are refused before anything is written."""
        if not self.knows(tool):
            raise UnknownTool(tool, self.known_tools())
        stored = await self._store.change(
            team_id,
            tool,
            by=by,
            now=self._clock(),
            changes=changes,
            allowed_when_new=tool in self._defaults.allowed,
        )
        return effective(tool, stored, self._defaults)


def from_file(tool: str, file: PolicyFile) -> StoredPolicy | None:
    """The policy POLICY_FILE sets for `tool`, its fields set (`model_fields_set`) being
    those the file sets: all of them for a tool it configures, `allowed` alone for one it
    only allows; None when it does not name the tool."""
    spec = file.tools.get(tool)
    if spec is None:
        return StoredPolicy(tool=tool, allowed=True) if tool in file.allow else None
    kept = {k: getattr(spec, k) for k in ToolPolicy.model_fields}  # not its tool_timeout
    return StoredPolicy(tool=tool, allowed=tool in file.allow, **kept)
