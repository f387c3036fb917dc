"""Bundled example tools. A company's own module has the same shape: `register(ai)`, and
optionally `previews()`: what a call would do, shown to the approver on its card.

`transferMoney` is the seed's tool, field for field. Side-effecting tools take the approval
id from `ctx.resumed_metadata` as an idempotency key to hand to the system they call.
"""

from __future__ import annotations

import uuid
from typing import Any

from genkit import Genkit, Tool, ToolRunContext
from pydantic import BaseModel, Field


class TransferInput(BaseModel):
    amount: float = Field(description="Amount to transfer, in the account's currency.")
    to_account: str = Field(alias="toAccount", description="Destination account number.")


class TransferOutput(BaseModel):
    success: bool = Field(description="Whether the transfer went through.")
    transaction_id: str = Field(alias="transactionId", description="The bank's transaction id.")


class BalanceInput(BaseModel):
    account: str = Field(description="Account number to look up.")


class BalanceOutput(BaseModel):
    account: str
    balance: float = Field(description="Current balance.")


class ExportInput(BaseModel):
    dataset: str = Field(description="Which dataset to export, e.g. 'customers'.")
    destination: str = Field(description="Email address the export is sent to.")


class ExportOutput(BaseModel):
    export_id: str = Field(alias="exportId", description="Id of the export job.")
    rows: int = Field(description="How many rows were exported.")


BALANCE = 1250.0  # the demo account's balance
EXPORT_ROWS = {"customers": 1204, "orders": 48311}


def idempotency_key(ctx: ToolRunContext) -> str:
    """The approval id when the call was approved, so a retried call can be recognised."""
    meta = ctx.resumed_metadata or {}
    return str(meta.get("approval_id") or uuid.uuid4())


def register(ai: Genkit) -> list[Tool]:
    @ai.tool(name="transferMoney", description="Transfer money between accounts.")
    async def transfer_money(input: TransferInput, ctx: ToolRunContext) -> TransferOutput:
        key = idempotency_key(ctx)
        return TransferOutput(success=True, transactionId=f"txn-{key[-12:]}")

    @ai.tool(name="getBalance", description="Read an account's balance. Read-only.")
    async def get_balance(input: BalanceInput) -> BalanceOutput:
        return BalanceOutput(account=input.account, balance=BALANCE)

    @ai.tool(
        name="exportData",
        description="Export a dataset (which may hold personal data) to an email address.",
    )
    async def export_data(input: ExportInput, ctx: ToolRunContext) -> ExportOutput:
        rows = EXPORT_ROWS.get(input.dataset, 0)
        return ExportOutput(exportId=f"exp-{idempotency_key(ctx)[-12:]}", rows=rows)

    return [transfer_money, get_balance, export_data]


async def preview_transfer(input: dict[str, Any]) -> str:
    call = TransferInput.model_validate(input)
    return f"Balance after transfer: {BALANCE - call.amount:,.2f}"


async def preview_export(input: dict[str, Any]) -> str:
    call = ExportInput.model_validate(input)
    rows = EXPORT_ROWS.get(call.dataset, 0)
    return f"Sends {rows:,} rows of {call.dataset} outside the company, to {call.destination}"


def previews() -> dict[str, Any]:
    return {"transferMoney": preview_transfer, "exportData": preview_export}
