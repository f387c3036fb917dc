"""`callback_url`s of the approvals API: checked when given, and owed one POST of the
request's final status once it is decided, signed, retried with backoff, never sent again
once delivered.

What is owed is a row (storage/gateway_store.py): it survives a restart, and a replica claims
a delivery with a conditional write before sending it, so two replicas do not both send it.
A process that dies between the receiver's 2xx and recording it leaves the claim to run out,
and another replica sends it again: receivers should treat the request's `id` as the
delivery's identity.

Where a callback may go: http(s) only, no credentials in the URL, redirects not followed,
the answer's body never read, and only to public addresses unless the operator allows more
(CALLBACK_ALLOWED_NETWORKS). The address is checked as the connection is made (every address
a name resolves to, and literal ones), so a name that resolves to the bot's own host, the
cloud's metadata service or a private network is refused, whatever it said when it was
given. See docs/gateway.md.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from storage.gateway_store import GatewayStore, OwedCallback

log = logging.getLogger(__name__)

SIGNATURE = "X-Greenlight-Signature"
MAX_URL = 2048
TIMEOUT = 10.0  # seconds for one delivery, connecting included
LEASE = timedelta(seconds=60)  # a claim outlives one delivery's timeout by far
FIRST_RETRY = 1.0  # seconds; doubled on each failure, up to MAX_RETRY
MAX_RETRY = 600.0
MAX_ATTEMPTS = 12  # about two hours of retries
BATCH = 20

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class BadCallback(ValueError):
    """A callback_url that Greenlight will not call: why, for the caller."""


class Refused(OSError):
    """The callback's host is at an address the operator does not allow."""


@dataclass(frozen=True)
class Reach:
    """Where callbacks may go: public addresses, and the networks the operator allows."""

    allowed: tuple[Network, ...] = ()

    @classmethod
    def of(cls, networks: Sequence[str]) -> Reach:
        return cls(tuple(ipaddress.ip_network(n, strict=False) for n in networks))

    def allows(self, address: Address) -> bool:
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if any(address in network for network in self.allowed):
            return True
        return address.is_global and not address.is_multicast

    def check(self, url: str) -> str:
        """The URL as given, if Greenlight may call it; BadCallback (why) if not. A name is
        checked again, resolved, when it is called."""
        if len(url) > MAX_URL:
            raise BadCallback(f"at most {MAX_URL} characters")
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise BadCallback("not a URL") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BadCallback("an http:// or https:// URL with a host is needed")
        if parts.username is not None or parts.password is not None:
            raise BadCallback("no credentials in the URL: verify the signature instead")
        if port == 0:
            raise BadCallback("not a port")
        try:
            literal = ipaddress.ip_address(parts.hostname)
        except ValueError:
            return url
        if not self.allows(literal):
            raise BadCallback("not an address Greenlight may call (a public one is needed)")
        return url


class GuardedResolver(AbstractResolver):
    """Resolves as usual, then keeps only the addresses the operator allows."""

    def __init__(self, reach: Reach) -> None:
        self._reach = reach
        self._resolver = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._resolver.resolve(host, port, family)
        allowed = [r for r in found if self._reach.allows(ipaddress.ip_address(r["host"]))]
        if not allowed:
            raise Refused(f"{host} is not at an address Greenlight may call")
        return allowed

    async def close(self) -> None:
        await self._resolver.close()


def sign(secret: str, body: bytes) -> str:
    """`sha256=` and the HMAC-SHA256 of the body under the key's callback secret, in hex."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def retry_after(attempt: int) -> timedelta:
    return timedelta(seconds=min(FIRST_RETRY * 2 ** (attempt - 1), MAX_RETRY))


Body = Callable[[str, str], Awaitable[dict[str, Any] | None]]  # (team, id) -> status body


class Deliveries:
    """Sends the callbacks now due, each claimed first (any replica may send a given one)."""

    def __init__(
        self,
        store: GatewayStore,
        reach: Reach,
        body: Body,
        *,
        clock: Callable[[], datetime],
    ) -> None:
        self._store = store
        self._reach = reach
        self._body = body
        self._clock = clock
        self._http: aiohttp.ClientSession | None = None

    async def run(self) -> int:
        """Send what is due now, at most BATCH at once; how many were claimed."""
        now = self._clock()
        owed = await self._store.claim_callbacks(now=now, lease_until=now + LEASE, limit=BATCH)
        if owed:
            await asyncio.gather(*(self._deliver(o) for o in owed))
        return len(owed)

    async def _deliver(self, owed: OwedCallback) -> None:
        body = await self._body(owed.team_id, owed.approval_id)
        if body is None:  # gone with retention: nothing to say
            await self._store.callback_done(owed.approval_id, now=self._clock(), delivered=False)
            return
        data = json.dumps(body, ensure_ascii=False, default=str).encode()
        headers = {"Content-Type": "application/json", SIGNATURE: sign(owed.secret, data)}
        error: str | None = None
        final = False
        try:
            self._reach.check(owed.url)
            async with self._client().post(
                owed.url, data=data, headers=headers, allow_redirects=False
            ) as response:
                if 200 <= response.status < 300:
                    await self._store.callback_done(
                        owed.approval_id, now=self._clock(), delivered=True
                    )
                    return
                error = f"HTTP {response.status}"
        except (BadCallback, Refused) as refused:
            error, final = str(refused), True
        except aiohttp.ClientConnectorError as failed:  # the resolver's refusal comes so
            refused_by = failed.os_error if isinstance(failed.os_error, Refused) else None
            error, final = str(refused_by or type(failed).__name__), refused_by is not None
        except (aiohttp.ClientError, TimeoutError, OSError) as failed:
            error = type(failed).__name__
        await self._failed(owed, error or "failed", final=final)

    async def _failed(self, owed: OwedCallback, error: str, *, final: bool) -> None:
        now = self._clock()
        give_up = final or owed.attempt >= MAX_ATTEMPTS
        retry_at = None if give_up else now + retry_after(owed.attempt)
        log.warning(
            "callback of approval request %s failed (attempt %d: %s); %s",
            owed.approval_id,
            owed.attempt,
            error,
            "giving up" if give_up else f"trying again at {retry_at:%H:%M:%S}",
        )
        await self._store.callback_done(
            owed.approval_id, now=now, delivered=False, error=error, retry_at=retry_at
        )

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            connector = aiohttp.TCPConnector(resolver=GuardedResolver(self._reach))
            self._http = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=TIMEOUT),
                trust_env=False,  # no proxy from the environment: the reach is checked here
                headers={"User-Agent": "Greenlight-Callback/1"},
            )
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
