"""Test tools at Genkit's edges: an input that is not an object, an interrupt made with
`define_interrupt` and its `request_metadata`, a tool that asks a person when it runs, one
that fails. Each that runs writes to the ledger (tests/ledger_tools.py)."""

from __future__ import annotations

from typing import Any

from genkit import Genkit, Interrupt, Tool, ToolRunContext
from genkit._ai._tools import define_interrupt  # the one that takes request_metadata
from pydantic import BaseModel

from tests.ledger_tools import write


class RefundInput(BaseModel):
    order: str


def refund_question(input: RefundInput) -> dict[str, Any]:
    """The interrupt's metadata, from its input as its schema validated it."""
    return {"who": "approvers", "message": f"May I refund order {input.order}?"}


def register(ai: Genkit) -> list[Tool]:
    @ai.tool(name="shout", description="Say a text out loud (its input is a bare string).")
    async def shout(text: str, ctx: ToolRunContext) -> str:
        write(
            {"tool": "shout", "text": text, "key": (ctx.resumed_metadata or {}).get("approval_id")}
        )
        return text.upper()

    @ai.tool(name="closeAccount", description="Close an account (asks which one when run).")
    async def close_account(input: RefundInput) -> str:
        write({"tool": "closeAccount", "order": input.order})
        raise Interrupt({"who": "requester", "message": "Which account exactly?"})

    @ai.tool(name="refundOrder", description="Refund an order (an order fail-… fails).")
    async def refund_order(input: RefundInput) -> str:
        write({"tool": "refundOrder", "order": input.order})
        if input.order.startswith("fail"):
            raise RuntimeError("the payment API is down")
        return f"refunded {input.order}"

    confirm = define_interrupt(
        ai.registry,
        "confirmRefund",
        description="Ask whether an order may be refunded.",
        input_schema=RefundInput,
        request_metadata=refund_question,
    )
    return [shout, close_account, refund_order, confirm]
