"""The approvals API keeps to its own OpenAPI document (GET /api/v1/openapi.json), as
schemathesis reads it: every route, with generated bodies and parameters, answers with a
documented status, content type and body, and never a 500. Deterministic: derandomized
examples, no example database."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.core.result import Ok

from bot.server import Service

EXAMPLES = 12  # per route: the whole run stays well under 20 s


@pytest.fixture
def service_overrides() -> dict[str, Any]:
    """Any callback_url the document allows is taken (where callbacks may go is the
    operator's choice, tested in test_gateway_callbacks.py); none is called: nothing here
    is decided."""
    return {"CALLBACK_ALLOWED_NETWORKS": ["0.0.0.0/0", "::/0"]}


def check_api(base: str, token: str) -> int:
    """Each route's generated cases, called and validated; how many operations ran."""
    schema = schemathesis.openapi.from_url(f"{base}/api/v1/openapi.json")
    auth = {"Authorization": f"Bearer {token}"}
    ran = 0
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result  # the document itself is valid
        operation = result.ok()

        @settings(
            max_examples=EXAMPLES,
            derandomize=True,
            database=None,
            deadline=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy())
        def call(case: schemathesis.Case[Any]) -> None:
            case.call_and_validate(base_url=base, headers=auth)

        call()
        ran += 1
    return ran


async def test_the_approvals_api_keeps_to_its_openapi_document(service: Service, team: str) -> None:
    assert service.deps is not None
    token = (await service.deps.keys.create(team, "UALICE", "fuzz")).token
    base = f"http://127.0.0.1:{service.port}"
    assert await asyncio.to_thread(check_api, base, token) == 5
