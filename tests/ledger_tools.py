"""Test tools that keep their own ledger (a file), so a test can count real executions
even across a killed process. The ledger path comes from GREENLIGHT_TEST_LEDGER."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from genkit import Genkit, Tool, ToolRunContext
from pydantic import BaseModel, Field


class BalanceInput(BaseModel):
    account: str


class TransferInput(BaseModel):
    amount: float
    to_account: str = Field(alias="toAccount")


def ledger_path() -> Path:
    return Path(os.environ["GREENLIGHT_TEST_LEDGER"])


def write(entry: dict[str, object]) -> None:
    with ledger_path().open("a") as fh:
        fh.write(json.dumps(entry) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def entries() -> list[dict[str, object]]:
    path = ledger_path()
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def register(ai: Genkit) -> list[Tool]:
    @ai.tool(name="transferMoney", description="Transfer money between accounts.")
    async def transfer_money(input: TransferInput, ctx: ToolRunContext) -> dict[str, object]:
        key = (ctx.resumed_metadata or {}).get("approval_id")
        write({"tool": "transferMoney", "amount": input.amount, "to": input.to_account, "key": key})
        if input.to_account == "hang":  # lets a crash test kill the process mid-call
            print("TOOL_STARTED", flush=True)
            await asyncio.Event().wait()
        if input.to_account.startswith("slow-"):  # "slow-2.5": a call that takes 2.5 s
            await asyncio.sleep(float(input.to_account.removeprefix("slow-")))
            write({"tool": "transferMoney:finished", "to": input.to_account, "key": key})
        return {"success": True, "transactionId": f"txn-{key}"}

    @ai.tool(name="getBalance", description="Read an account's balance.")
    async def get_balance(input: BalanceInput) -> dict[str, object]:
        write({"tool": "getBalance", "account": input.account})
        return {"account": input.account, "balance": 100.0}

    return [transfer_money, get_balance]


async def preview_transfer(input: dict[str, object]) -> str:
    """A preview as a tool module offers it; some accounts make it fail or hang."""
    if input.get("toAccount") == "broken-preview":
        raise RuntimeError("the bank's preview API is down")
    if input.get("toAccount") == "slow-preview":
        await asyncio.Event().wait()
    amount = input.get("amount")
    return f"Balance after transfer: {1000 - float(amount):,.2f}"  # type: ignore[arg-type]


def previews() -> dict[str, object]:
    return {"transferMoney": preview_transfer}
