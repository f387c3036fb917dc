"""A tool of the metrics tests' own: no other test asks for it, so its pending count is theirs."""

from __future__ import annotations

from genkit import Genkit, Tool
from pydantic import BaseModel


class RefundInput(BaseModel):
    order: str


def register(ai: Genkit) -> list[Tool]:
    @ai.tool(name="issueRefund", description="Refund an order.")
    async def issue_refund(input: RefundInput) -> dict[str, object]:
        if input.order == "broken":
            raise RuntimeError("the payment provider is down")
        return {"ok": True, "refunded": input.order}

    return [issue_refund]
